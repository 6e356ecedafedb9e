/*
 * escape_lib.c - a library linked against the driver (-lcuda), for the
 * loader-escape cases of the integration tests (tests/escape.rs) and the
 * GPU machine: the program (escape.c) loads it with RTLD_DEEPBIND or
 * dlmopen, ways around an LD_PRELOAD library, and has it allocate.
 */
#include <stddef.h>

#ifdef REAL_CUDA /* on the GPU machine: nvcc's headers */
#include <cuda.h>
#else
#include "cuda_subset.h"
#endif

/*
 * Device 0's primary context current, then n allocations of size bytes;
 * rcs[i] is each one's CUresult. Returns the first set-up call's error, or
 * CUDA_SUCCESS.
 */
int escape_fill(int n, size_t size, int *rcs)
{
    CUdevice dev;
    CUcontext ctx;
    CUresult rc = cuInit(0);
    if (rc == CUDA_SUCCESS)
        rc = cuDeviceGet(&dev, 0);
    if (rc == CUDA_SUCCESS)
        rc = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (rc == CUDA_SUCCESS)
        rc = cuCtxSetCurrent(ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    for (int i = 0; i < n; i++) {
        CUdeviceptr p;
        rcs[i] = cuMemAlloc_v2(&p, size);
    }
    return CUDA_SUCCESS;
}
