// probe_managed2.cu — does device memory a managed block once used come
// back when its pages move to the host, and can another block reuse it?
// And the alternative: VMM host-location physical memory. Prints PROBE lines.
// At most 2 GiB managed, 1 GiB VMM device, 1 GiB VMM host.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_ = 0; cuGetErrorName(r_, &s_); printf("PROBE fail=%s at=%d\n", s_ ? s_ : "?", __LINE__); } } while (0)

__global__ void readk(const float4 *p, size_t n, float *out) {
    float4 acc = make_float4(0, 0, 0, 0);
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float4 v = p[i]; acc.x += v.x; acc.y += v.y; acc.z += v.z; acc.w += v.w;
    }
    if (acc.x == 1234.5f) *out = acc.y + acc.z + acc.w;
}
__global__ void fillk(float *p, size_t n, float v) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}
static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static long long f0;
static long long used() { size_t f, t; cuMemGetInfo(&f, &t); return (f0 - (long long)f) >> 20; }
static CUmemLocation dev0() { CUmemLocation l; l.type = CU_MEM_LOCATION_TYPE_DEVICE; l.id = 0; return l; }
static CUmemLocation host() { CUmemLocation l; l.type = CU_MEM_LOCATION_TYPE_HOST; l.id = 0; return l; }
static const size_t B = 1ull << 30;
static double move(CUdeviceptr p, bool to_host, bool with_advice) {
    double t = now();
    if (with_advice) CK(cuMemAdvise_v2(p, B, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, to_host ? host() : dev0()));
    CK(cuMemPrefetchAsync_v2(p, B, to_host ? host() : dev0(), 0, 0));
    CK(cuCtxSynchronize());
    return B / (now() - t) / 1e9;
}
static double readbw(CUdeviceptr p, float *out) {
    readk<<<1024, 256>>>((const float4 *)p, B / 16, out); cudaDeviceSynchronize();
    double t = now(); for (int i = 0; i < 3; i++) readk<<<1024, 256>>>((const float4 *)p, B / 16, out);
    cudaDeviceSynchronize(); return 3.0 * B / (now() - t) / 1e9;
}

int main() {
    CK(cuInit(0)); cudaFree(0);
    float *out; cudaMalloc(&out, 4);
    size_t f, t; cuMemGetInfo(&f, &t); f0 = f;
    CUdeviceptr a, b;
    CK(cuMemAllocManaged(&a, B, CU_MEM_ATTACH_GLOBAL));
    CK(cuMemAllocManaged(&b, B, CU_MEM_ATTACH_GLOBAL));
    CK(cuMemAdvise_v2(a, B, CU_MEM_ADVISE_SET_ACCESSED_BY, dev0()));
    CK(cuMemAdvise_v2(b, B, CU_MEM_ADVISE_SET_ACCESSED_BY, dev0()));
    printf("PROBE a_to_dev_gbps=%.1f\n", move(a, false, true));
    fillk<<<1024, 256>>>((float *)a, B / 4, 1.0f); cudaDeviceSynchronize();
    printf("PROBE a_on_dev_used_mib=%lld\n", used());
    printf("PROBE a_to_host_gbps=%.1f\n", move(a, true, true));
    printf("PROBE a_on_host_used_mib=%lld\n", used());
    usleep(1500000);
    printf("PROBE a_on_host_after_1500ms_used_mib=%lld\n", used());
    printf("PROBE b_to_dev_gbps=%.1f\n", move(b, false, true));
    fillk<<<1024, 256>>>((float *)b, B / 4, 2.0f); cudaDeviceSynchronize();
    printf("PROBE b_on_dev_a_on_host_used_mib=%lld\n", used());
    printf("PROBE b_to_host_gbps=%.1f\n", move(b, true, true));
    printf("PROBE a_to_dev_again_gbps=%.1f\n", move(a, false, true));
    printf("PROBE a_on_dev_b_on_host_used_mib=%lld\n", used());
    printf("PROBE a_to_host_again_gbps=%.1f\n", move(a, true, true));
    printf("PROBE a_to_dev_noadvice_gbps=%.1f\n", move(a, false, false));
    printf("PROBE a_to_host_noadvice_gbps=%.1f\n", move(a, true, false));
    printf("PROBE both_on_host_used_mib=%lld\n", used());
    CK(cuMemFree(a));
    printf("PROBE a_freed_used_mib=%lld\n", used());
    CK(cuMemFree(b));
    printf("PROBE both_freed_used_mib=%lld\n", used());

    // VMM: device and host physical memory behind reserved addresses.
    CUmemAllocationProp pd = {}; pd.type = CU_MEM_ALLOCATION_TYPE_PINNED; pd.location = dev0();
    CUmemAllocationProp ph = {}; ph.type = CU_MEM_ALLOCATION_TYPE_PINNED; ph.location.type = CU_MEM_LOCATION_TYPE_HOST; ph.location.id = 0;
    size_t gd = 0, gh = 0;
    CK(cuMemGetAllocationGranularity(&gd, &pd, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CK(cuMemGetAllocationGranularity(&gh, &ph, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    printf("PROBE vmm_granularity_dev=%zu host=%zu\n", gd, gh);
    CUmemGenericAllocationHandle hd = 0, hh = 0;
    CK(cuMemCreate(&hd, B, &pd, 0));
    CUresult rh = cuMemCreate(&hh, B, &ph, 0);
    printf("PROBE vmm_host_create_rc=%d\n", (int)rh);
    if (rh != CUDA_SUCCESS) { ph.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA; rh = cuMemCreate(&hh, B, &ph, 0); printf("PROBE vmm_host_numa_create_rc=%d\n", (int)rh); }
    printf("PROBE vmm_dev_created_used_mib=%lld\n", used());
    CUdeviceptr va, vb;
    CK(cuMemAddressReserve(&va, B, 0, 0, 0));
    CK(cuMemAddressReserve(&vb, B, 0, 0, 0));
    CUmemAccessDesc acc = {}; acc.location = dev0(); acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemMap(va, B, 0, hd, 0)); CK(cuMemSetAccess(va, B, &acc, 1));
    fillk<<<1024, 256>>>((float *)va, B / 4, 3.0f); cudaDeviceSynchronize();
    printf("PROBE vmm_dev_read_gbps=%.0f\n", readbw(va, out));
    if (rh == CUDA_SUCCESS) {
        CK(cuMemMap(vb, B, 0, hh, 0)); CK(cuMemSetAccess(vb, B, &acc, 1));
        double t0 = now(); CK(cuMemcpyDtoD(vb, va, B)); CK(cuCtxSynchronize());
        printf("PROBE vmm_copy_dev_to_host_gbps=%.1f\n", B / (now() - t0) / 1e9);
        printf("PROBE vmm_host_read_gbps=%.1f\n", readbw(vb, out));
        t0 = now(); CK(cuMemcpyDtoD(va, vb, B)); CK(cuCtxSynchronize());
        printf("PROBE vmm_copy_host_to_dev_gbps=%.1f\n", B / (now() - t0) / 1e9);
        // swap: the address va now backed by host memory
        t0 = now();
        CK(cuMemUnmap(va, B)); CK(cuMemUnmap(vb, B));
        CK(cuMemMap(va, B, 0, hh, 0)); CK(cuMemSetAccess(va, B, &acc, 1));
        printf("PROBE vmm_remap_ms=%.3f\n", (now() - t0) * 1e3);
        float h[2]; CK(cuMemcpyDtoH(h, va + 4096, 8));
        printf("PROBE vmm_data_after_swap=%g (want 3)\n", h[0]);
        printf("PROBE vmm_host_mapped_used_mib_before_release=%lld\n", used());
        CK(cuMemRelease(hd));
        printf("PROBE vmm_dev_released_used_mib=%lld\n", used());
        CK(cuMemUnmap(va, B)); CK(cuMemRelease(hh));
    }
    printf("PROBE end_used_mib=%lld\n", used());
    return 0;
}
