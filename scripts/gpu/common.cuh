// common.cuh: what the CUDA programs here share (capcheck.cu, bench_alloc.cu,
// cache_safety.cu, churn.cu, spill_bw.cu).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>

// CHECK(call): a runtime API call that must succeed; otherwise prints
// "ERROR call: errname" on stdout and returns 1 from the calling function.
#define CHECK(x)                                                                            \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        if (e_ != cudaSuccess) {                                                            \
            printf("ERROR %s: %s\n", #x, cudaGetErrorName(e_));                             \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

// The names of runtime and driver error codes ("unknown" when there is none).
static inline const char *rt_name(cudaError_t e) {
    const char *n = cudaGetErrorName(e);
    return n ? n : "unknown";
}

static inline const char *drv_name(CUresult r) {
    const char *n = NULL;
    if (cuGetErrorName(r, &n) != CUDA_SUCCESS || n == NULL) return "unknown";
    return n;
}
