/*
 * cuda_subset.h - the small slice of the CUDA 13 driver API (cuda.h) that the
 * vramcap stand-in driver implements and the test client calls.
 *
 * The types and prototypes are written from the public CUDA driver API
 * documentation so that the stand-in exports the same ABI as libcuda.so.1.
 * Only what the tests need is declared; everything else that cudarc expects to
 * find is exported by generated stubs (see stub-names.txt and build.sh).
 *
 * Both cuda_standin.c and tests/clients/client.c include this header, so the
 * compiler checks that the stand-in's definitions match these prototypes.
 */
#ifndef VRAMCAP_CUDA_SUBSET_H
#define VRAMCAP_CUDA_SUBSET_H

#include <stddef.h>
#include <stdint.h>

/* ---- Basic types ------------------------------------------------------- */

typedef int CUresult;                  /* enum cudaError_enum in cuda.h */
typedef int CUdevice;                  /* device ordinal handle */
typedef unsigned long long CUdeviceptr;  /* 64-bit device address (v2 ABI) */
typedef unsigned int CUdeviceptr_v1;   /* 32-bit device address (v1 ABI) */
typedef struct CUctx_st *CUcontext;    /* opaque context handle */
typedef struct CUstream_st *CUstream;  /* opaque stream handle */
typedef uint64_t cuuint64_t;
typedef int CUdevice_attribute;        /* enum CUdevice_attribute_enum */
typedef int CUdriverProcAddressQueryResult; /* enum in cuda.h */

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

/* ---- CUresult values used by the stand-in ------------------------------ */

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_UNKNOWN = 999
};

/* cuMemAllocManaged flags (CUmemAttach_flags). */
enum {
    CU_MEM_ATTACH_GLOBAL = 1,
    CU_MEM_ATTACH_HOST = 2
};

/* cuGetProcAddress flags (CUdriverProcAddress_flags). */
enum {
    CU_GET_PROC_ADDRESS_DEFAULT = 0,
    CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
    CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2
};

/* cuGetProcAddress_v2 symbolStatus values (CUdriverProcAddressQueryResult). */
enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
};

/* ---- Driver entry points implemented by the stand-in ------------------- */
/*
 * Every line declaring a driver entry point starts with "CUresult cu"; the
 * stub-name generator (gen-stub-names.sh) relies on that to exclude these
 * names from the generated stubs.
 */

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *driverVersion);

CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxGetDevice(CUdevice *device);
CUresult cuCtxSynchronize(void);

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch,
                            size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize,
                           unsigned int flags);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                         CUstream hStream);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc,
                              size_t N, CUstream hStream);

CUresult cuGetErrorString(CUresult error, const char **pStr);
CUresult cuGetErrorName(CUresult error, const char **pStr);

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                          cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                             cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus);

/* ---- Function pointer types (what dlsym / cuGetProcAddress hand out) --- */

typedef CUresult (*PFN_cuGetProcAddress_v1)(const char *, void **, int,
                                            cuuint64_t);
typedef CUresult (*PFN_cuGetProcAddress_v2)(const char *, void **, int,
                                            cuuint64_t,
                                            CUdriverProcAddressQueryResult *);

/* ---- Stand-in inspection exports (not part of CUDA) -------------------- */

/* Number of devices the stand-in simulates (STANDIN_DEVICES). */
int vramcap_standin_devices(void);
/* Bytes currently accounted as allocated on device dev (0 if dev invalid). */
size_t vramcap_standin_used(int dev);
/* High-water mark of vramcap_standin_used(dev). */
size_t vramcap_standin_peak(int dev);
/* Event counters: "alloc", "free", "getprocaddress", "alias"; 0 otherwise. */
unsigned long vramcap_standin_count(const char *what);

#endif /* VRAMCAP_CUDA_SUBSET_H */
