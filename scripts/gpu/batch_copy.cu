// batch_copy: the batched copies tiered spill gates, on the real driver.
// Three 8 MiB buffers (tiered blocks under VRAMCAP_SPILL=tiered); A is
// filled with 0x5a, then copied to B by cudaMemcpyBatchAsync (the runtime,
// which finds the driver's function through cuGetProcAddress), and B to C
// by the driver's cuMemcpyBatchAsync resolved for CUDA 12.8 (the form with
// a failure index) and for 13.0 (without), called through what
// cuGetProcAddress answered. Prints which library answered and whether
// every byte arrived:
// "RESULT runtime=OK v12080=OK lib12080=L v13000=OK lib13000=L ...".
// Then the copies between arrays and device memory: 64 KiB of A into a
// 1D array by cuMemcpyDtoA and back into C by cuMemcpyAtoD, each resolved
// for 3020 ("array=OK libarray=L,L"), and which library answers for the
// deprecated launches cuLaunch, cuLaunchGrid and cuLaunchGridAsync
// ("liblaunch=L,L,L"; they are not called: their parameters would be set
// with the cuParamSet* functions).
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "common.cuh"

typedef CUresult (*batch12_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *,
                               size_t, size_t *, CUstream);
typedef CUresult (*batch13_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *,
                               size_t, CUstream);

static const char *lib_of(void *p) {
    Dl_info info;
    if (p == NULL || dladdr(p, &info) == 0 || info.dli_fname == NULL) return "?";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname;
}

// Whether all n bytes at d are v.
static bool all(const void *d, unsigned char v, size_t n) {
    std::vector<unsigned char> h(n);
    if (cudaMemcpy(h.data(), d, n, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
    for (unsigned char c : h)
        if (c != v) return false;
    return true;
}

int main() {
    const size_t n = 8 << 20;
    void *a, *b, *c;
    CHECK(cudaMalloc(&a, n));
    CHECK(cudaMalloc(&b, n));
    CHECK(cudaMalloc(&c, n));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMemsetAsync(a, 0x5a, n, s));

    // The runtime's batched copy: A to B.
    cudaMemcpyAttributes rattr = {};
    rattr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    const void *rd[1] = {b};
    const void *rs[1] = {a};
    size_t rz[1] = {n}, ri[1] = {0};
    cudaError_t re = cudaMemcpyBatchAsync(rd, rs, rz, 1, &rattr, ri, 1, s);
    CHECK(cudaStreamSynchronize(s));
    bool runtime_ok = re == cudaSuccess && all(b, 0x5a, n);

    CUmemcpyAttributes attr = {};
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    CUdeviceptr dd[1] = {(CUdeviceptr)c}, ds[1] = {(CUdeviceptr)b};
    size_t dz[1] = {n}, di[1] = {0};

    // The driver's, as resolved for 12.8: B to C.
    void *p12 = NULL, *p13 = NULL;
    CUdriverProcAddressQueryResult st;
    CUresult r12 = cuGetProcAddress("cuMemcpyBatchAsync", &p12, 12080, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    bool ok12 = false;
    if (r12 == CUDA_SUCCESS && p12 != NULL) {
        CHECK(cudaMemsetAsync(c, 0, n, s));
        size_t fail = 99;
        r12 = ((batch12_fn)p12)(dd, ds, dz, 1, &attr, di, 1, &fail, (CUstream)s);
        CHECK(cudaStreamSynchronize(s));
        ok12 = r12 == CUDA_SUCCESS && all(c, 0x5a, n);
    }
    // And for 13.0.
    CUresult r13 = cuGetProcAddress("cuMemcpyBatchAsync", &p13, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    bool ok13 = false;
    if (r13 == CUDA_SUCCESS && p13 != NULL) {
        CHECK(cudaMemsetAsync(c, 0, n, s));
        r13 = ((batch13_fn)p13)(dd, ds, dz, 1, &attr, di, 1, (CUstream)s);
        CHECK(cudaStreamSynchronize(s));
        ok13 = r13 == CUDA_SUCCESS && all(c, 0x5a, n);
    }
    // Through an array: A to the array, the array to C.
    const size_t an = 64 << 10;
    void *pd = NULL, *pa = NULL;
    CUresult rd2 = cuGetProcAddress("cuMemcpyDtoA", &pd, 3020, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    CUresult ra2 = cuGetProcAddress("cuMemcpyAtoD", &pa, 3020, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    bool ok_array = false;
    CUresult rarr = CUDA_ERROR_NOT_FOUND;
    if (rd2 == CUDA_SUCCESS && ra2 == CUDA_SUCCESS && pd != NULL && pa != NULL) {
        CUDA_ARRAY_DESCRIPTOR desc = {};
        desc.Width = an;
        desc.Height = 0;
        desc.Format = CU_AD_FORMAT_UNSIGNED_INT8;
        desc.NumChannels = 1;
        CUarray arr;
        rarr = cuArrayCreate(&arr, &desc);
        if (rarr == CUDA_SUCCESS) {
            CHECK(cudaMemset(c, 0, n));
            CHECK(cudaDeviceSynchronize());
            rarr = ((CUresult(*)(CUarray, size_t, CUdeviceptr, size_t))pd)(arr, 0, (CUdeviceptr)a, an);
            if (rarr == CUDA_SUCCESS)
                rarr = ((CUresult(*)(CUdeviceptr, CUarray, size_t, size_t))pa)((CUdeviceptr)c, arr, 0, an);
            CHECK(cudaDeviceSynchronize());
            ok_array = rarr == CUDA_SUCCESS && all(c, 0x5a, an);
            cuArrayDestroy(arr);
        }
    }
    void *pl = NULL, *pg = NULL, *pga = NULL;
    cuGetProcAddress("cuLaunch", &pl, 2000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    cuGetProcAddress("cuLaunchGrid", &pg, 2000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    cuGetProcAddress("cuLaunchGridAsync", &pga, 2000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
    printf("RESULT runtime=%s runtime_rc=%s v12080=%s rc12080=%s lib12080=%s v13000=%s rc13000=%s lib13000=%s "
           "array=%s array_rc=%s libarray=%s,%s liblaunch=%s,%s,%s\n",
           runtime_ok ? "OK" : "BAD", rt_name(re), ok12 ? "OK" : "BAD", drv_name(r12), lib_of(p12),
           ok13 ? "OK" : "BAD", drv_name(r13), lib_of(p13), ok_array ? "OK" : "BAD", drv_name(rarr), lib_of(pd),
           lib_of(pa), lib_of(pl), lib_of(pg), lib_of(pga));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    CHECK(cudaFree(c));
    return runtime_ok && ok12 && ok13 && ok_array ? 0 : 1;
}
