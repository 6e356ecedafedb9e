// probe_managed.cu — what the real driver does with managed memory moved by
// advice and prefetch, the facts spill placement (issue 15) rests on.
// Prints `PROBE key=value` lines. Uses at most 1 GiB of managed memory.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_ = 0; cuGetErrorName(r_, &s_); printf("PROBE fail=%s at=%d\n", s_ ? s_ : "?", __LINE__); exit(1); } } while (0)

__global__ void readk(const float4 *p, size_t n, float *out) {
    float4 acc = make_float4(0, 0, 0, 0);
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = p[i]; acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
    }
    if (acc.x == 1234.5f) *out = acc.y + acc.z + acc.w;
}
__global__ void fillk(float *p, size_t n, float v) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v + (float)(i & 1023);
}

static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void smi(const char *what) { printf("PROBE nvml_at=%s\n", what); fflush(stdout); if (system("nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader")) {} fflush(stdout); }
static long long freeb() { size_t f, t; cuMemGetInfo(&f, &t); return (long long)f; }
static CUmemLocation dev0() { CUmemLocation l; l.type = CU_MEM_LOCATION_TYPE_DEVICE; l.id = 0; return l; }
static CUmemLocation host() { CUmemLocation l; l.type = CU_MEM_LOCATION_TYPE_HOST; l.id = 0; return l; }

static double readbw(CUdeviceptr p, size_t bytes, float *out) {
    readk<<<1024, 256>>>((const float4 *)p, bytes / 16, out);
    cudaDeviceSynchronize();
    double t = now();
    for (int i = 0; i < 3; i++) readk<<<1024, 256>>>((const float4 *)p, bytes / 16, out);
    cudaDeviceSynchronize();
    return 3.0 * bytes / (now() - t) / 1e9;
}

int main() {
    CK(cuInit(0));
    cudaFree(0);
    CUdevice d; CK(cuDeviceGet(&d, 0));
    CUcontext c; CK(cuCtxGetCurrent(&c));
    float *out; cudaMalloc(&out, 4);
    const size_t B = 1ull << 30;
    long long f0 = freeb();
    CUdeviceptr m; CK(cuMemAllocManaged(&m, B, CU_MEM_ATTACH_GLOBAL));
    printf("PROBE after_alloc_managed_free_delta_mib=%lld\n", (f0 - freeb()) >> 20);
    CK(cuMemAdvise_v2(m, B, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, dev0()));
    CK(cuMemAdvise_v2(m, B, CU_MEM_ADVISE_SET_ACCESSED_BY, dev0()));
    double t = now();
    CK(cuMemPrefetchAsync_v2(m, B, dev0(), 0, 0));
    CK(cuCtxSynchronize());
    printf("PROBE prefetch_h2d_untouched_gbps=%.1f\n", B / (now() - t) / 1e9);
    printf("PROBE device_resident_free_delta_mib=%lld\n", (f0 - freeb()) >> 20);
    fillk<<<1024, 256>>>((float *)m, B / 4, 1.0f);
    cudaDeviceSynchronize();
    printf("PROBE device_resident_read_gbps=%.0f\n", readbw(m, B, out));
    smi("device_resident_1GiB");
    printf("PROBE after_fill_free_delta_mib=%lld\n", (f0 - freeb()) >> 20);
    // demote: preferred host, prefetch to host
    t = now();
    CK(cuMemAdvise_v2(m, B, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host()));
    CK(cuMemPrefetchAsync_v2(m, B, host(), 0, 0));
    CK(cuCtxSynchronize());
    printf("PROBE demote_d2h_gbps=%.1f\n", B / (now() - t) / 1e9);
    printf("PROBE host_resident_free_delta_mib=%lld\n", (f0 - freeb()) >> 20);
    smi("host_resident_1GiB");
    printf("PROBE host_resident_read_gbps=%.1f\n", readbw(m, B, out));
    printf("PROBE after_remote_reads_free_delta_mib=%lld\n", (f0 - freeb()) >> 20);
    fillk<<<1024, 256>>>((float *)m, B / 4, 2.0f);
    cudaDeviceSynchronize();
    printf("PROBE after_remote_write_free_delta_mib=%lld\n", (f0 - freeb()) >> 20);
    // promote again
    t = now();
    CK(cuMemAdvise_v2(m, B, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, dev0()));
    CK(cuMemPrefetchAsync_v2(m, B, dev0(), 0, 0));
    CK(cuCtxSynchronize());
    printf("PROBE promote_h2d_gbps=%.1f\n", B / (now() - t) / 1e9);
    printf("PROBE promoted_free_delta_mib=%lld\n", (f0 - freeb()) >> 20);
    // data survived?
    float h[4]; CK(cuMemcpyDtoH(h, m + 4 * 1000, 16));
    printf("PROBE data_after_moves=%g,%g (want %g,%g)\n", h[0], h[1], 2.0f + 1000, 2.0f + 1001);
    // demote with advice only (no prefetch): does device memory come back?
    CK(cuMemAdvise_v2(m, B, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host()));
    CK(cuCtxSynchronize());
    printf("PROBE advise_host_only_free_delta_mib=%lld\n", (f0 - freeb()) >> 20);
    CK(cuMemPrefetchAsync_v2(m, B, host(), 0, 0));
    CK(cuCtxSynchronize());
    printf("PROBE after_prefetch_host_free_delta_mib=%lld\n", (f0 - freeb()) >> 20);
    // device-resident managed vs cuMemAlloc read speed, same size
    CUdeviceptr r; CK(cuMemAlloc(&r, B));
    fillk<<<1024, 256>>>((float *)r, B / 4, 1.0f);
    printf("PROBE plain_read_gbps=%.0f\n", readbw(r, B, out));
    CK(cuMemFree(r));
    // partial prefetch: 256 MiB of the 1 GiB to the device
    CK(cuMemAdvise_v2(m, B / 4, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, dev0()));
    CK(cuMemPrefetchAsync_v2(m, B / 4, dev0(), 0, 0));
    CK(cuCtxSynchronize());
    smi("quarter_device");
    printf("PROBE partial_quarter_free_delta_mib=%lld\n", (f0 - freeb()) >> 20);
    CK(cuMemFree(m));
    printf("PROBE after_free_delta_mib=%lld\n", (f0 - freeb()) >> 20);
    // param info on the cudart kernel handle
    cudaFunction_t fn; cudaGetFuncBySymbol(&fn, (const void *)readk);
    size_t off = 0, sz = 0; int n = 0;
    while (cuFuncGetParamInfo((CUfunction)fn, n, &off, &sz) == CUDA_SUCCESS) n++;
    printf("PROBE cuFuncGetParamInfo_params=%d\n", n);
    cudaKernel_t k; if (cudaGetKernel(&k, (const void *)readk) == cudaSuccess) {
        n = 0; while (cuKernelGetParamInfo((CUkernel)k, n, &off, &sz) == CUDA_SUCCESS) n++;
        printf("PROBE cuKernelGetParamInfo_params=%d\n", n);
        n = 0; while (cuFuncGetParamInfo((CUfunction)k, n, &off, &sz) == CUDA_SUCCESS) n++;
        printf("PROBE cuFuncGetParamInfo_on_kernel_params=%d\n", n);
    }
    double t0 = now(); for (int i = 0; i < 100000; i++) cuFuncGetParamInfo((CUfunction)fn, 1, &off, &sz);
    printf("PROBE cuFuncGetParamInfo_ns=%.0f\n", (now() - t0) / 100000 * 1e9);
    return 0;
}
