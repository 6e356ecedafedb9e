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
typedef struct CUgraph_st *CUgraph;    /* opaque graph handle */
typedef uint64_t cuuint64_t;
typedef int CUdevice_attribute;        /* enum CUdevice_attribute_enum */
typedef int CUdriverProcAddressQueryResult; /* enum in cuda.h */
typedef int CUstreamCaptureMode;       /* enum CUstreamCaptureMode_enum */
typedef int CUstreamCaptureStatus;     /* enum CUstreamCaptureStatus_enum */

typedef struct CUuuid_st {
    char bytes[16];
} CUuuid;

/* Opaque to the stand-in: only CUctxCreateParams points at them. */
struct CUexecAffinityParam_st;
struct CUctxCigParam_st;

/* cuCtxCreate_v4's optional parameters (CUDA 12.5). */
typedef struct CUctxCreateParams_st {
    struct CUexecAffinityParam_st *execAffinityParams;
    int numExecAffinityParams;
    struct CUctxCigParam_st *cigParams;
} CUctxCreateParams;

#define CU_IPC_HANDLE_SIZE 64

typedef struct CUipcMemHandle_st {
    char reserved[CU_IPC_HANDLE_SIZE];
} CUipcMemHandle;

/* Special stream handles (cuda.h defines them the same way). */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

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
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CUDA_ERROR_UNKNOWN = 999
};

/* cuMemAllocManaged flags (CUmemAttach_flags). */
enum {
    CU_MEM_ATTACH_GLOBAL = 1,
    CU_MEM_ATTACH_HOST = 2
};

/* cuCtxCreate flags (CUctx_flags): every defined bit is within this mask. */
enum {
    CU_CTX_FLAGS_MASK = 0xff
};

/* cuStreamCreate flags (CUstream_flags). */
enum {
    CU_STREAM_DEFAULT = 0,
    CU_STREAM_NON_BLOCKING = 1
};

/* CUstreamCaptureMode values. */
enum {
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2
};

/* CUstreamCaptureStatus values. */
enum {
    CU_STREAM_CAPTURE_STATUS_NONE = 0,
    CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
    CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2
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
CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags,
                                    int *active);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                        unsigned int flags, CUdevice dev);
CUresult cuCtxDestroy_v2(CUcontext ctx);
CUresult cuCtxPushCurrent_v2(CUcontext ctx);
CUresult cuCtxPopCurrent_v2(CUcontext *pctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxGetDevice(CUdevice *device);
CUresult cuCtxSynchronize(void);

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
CUresult cuStreamDestroy_v2(CUstream hStream);
CUresult cuStreamBeginCapture(CUstream hStream);
CUresult cuStreamBeginCapture_ptsz(CUstream hStream);
CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream,
                                      CUstreamCaptureMode mode);
CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
CUresult cuStreamIsCapturing(CUstream hStream,
                             CUstreamCaptureStatus *captureStatus);
CUresult cuStreamIsCapturing_ptsz(CUstream hStream,
                                  CUstreamCaptureStatus *captureStatus);

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch,
                            size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize,
                           unsigned int flags);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
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
/*
 * Event counters: "alloc", "free", "getprocaddress", "alias", "sync"
 * (cuCtxSynchronize calls), "capture" (captures begun), "ipc"
 * (cuIpcGetMemHandle calls); 0 otherwise.
 */
unsigned long vramcap_standin_count(const char *what);

#endif /* VRAMCAP_CUDA_SUBSET_H */
