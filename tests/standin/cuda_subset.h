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
typedef struct CUmemPoolHandle_st *CUmemoryPool; /* opaque memory pool */
typedef struct CUmod_st *CUmodule;     /* opaque module handle */
typedef struct CUfunc_st *CUfunction;  /* opaque function handle */
typedef struct CUarray_st *CUarray;    /* opaque CUDA array */
typedef struct CUmipmappedArray_st *CUmipmappedArray; /* opaque */
typedef unsigned long long CUmemGenericAllocationHandle; /* _v1 */
typedef int CUmemPool_attribute;       /* enum CUmemPool_attribute_enum */
typedef int CUmemLocationType;         /* enum CUmemLocationType_enum */
typedef int CUmemAllocationType;       /* enum CUmemAllocationType_enum */
typedef int CUmemAllocationHandleType; /* enum CUmemAllocationHandleType_enum */
typedef int CUmemAccess_flags;         /* enum CUmemAccess_flags_enum */
typedef int CUmemAllocationGranularity_flags; /* enum ..._flags_enum */
typedef int CUarray_format;            /* enum CUarray_format_enum */
typedef struct CUevent_st *CUevent;    /* opaque event handle */
typedef int CUmem_advise;              /* enum CUmem_advise_enum */
typedef struct CUgraphNode_st *CUgraphNode; /* opaque graph node handle */
typedef struct CUgraphExec_st *CUgraphExec; /* opaque executable graph */
typedef int CUgraphNodeType;           /* enum CUgraphNodeType_enum */
typedef int CUgraphMem_attribute;      /* enum CUgraphMem_attribute_enum */
typedef int CUgraphInstantiateResult;  /* enum CUgraphInstantiateResult_enum */

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

/* A memory location (CUmemLocation_v1). */
typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;

/* cuMemCreate's properties (CUmemAllocationProp_v1). */
typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

/* cuMemPoolCreate's properties (CUmemPoolProps_v1, CUDA 13 layout). */
typedef struct CUmemPoolProps_st {
    CUmemAllocationType allocType;
    CUmemAllocationHandleType handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

/* cuMemSetAccess's descriptors (CUmemAccessDesc_v1). */
typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;

/* cuArrayCreate_v2's descriptor (CUDA_ARRAY_DESCRIPTOR_v2). */
typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

/* cuArray3DCreate_v2's and cuMipmappedArrayCreate's descriptor (_v2). */
typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

/* What cu(Mipmapped)ArrayGetMemoryRequirements fill in (_v1). */
typedef struct CUDA_ARRAY_MEMORY_REQUIREMENTS_st {
    size_t size;
    size_t alignment;
    unsigned int reserved[4];
} CUDA_ARRAY_MEMORY_REQUIREMENTS;

/* cuGraphAddMemAllocNode's parameters (CUDA_MEM_ALLOC_NODE_PARAMS_v1). */
typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_st {
    CUmemPoolProps poolProps;        /* pinned, on a device */
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;                /* out: the allocation's address */
} CUDA_MEM_ALLOC_NODE_PARAMS;

/* A kernel node's parameters (CUDA_KERNEL_NODE_PARAMS_v2; v1 is the same
   without kern and ctx). */
typedef struct CUDA_KERNEL_NODE_PARAMS_st {
    CUfunction func;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    void **kernelParams;
    void **extra;
    void *kern;                      /* CUkernel, used when func is NULL */
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS;

/* What cuGraphExecUpdate_v2 says of an update (CUgraphExecUpdateResultInfo;
   result 0 is CU_GRAPH_EXEC_UPDATE_SUCCESS, 1 CU_GRAPH_EXEC_UPDATE_ERROR). */
typedef struct CUgraphExecUpdateResultInfo_st {
    int result;
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;

/* cuGraphInstantiateWithParams's in/out parameters. */
typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st {
    cuuint64_t flags;                /* CUDA_GRAPH_INSTANTIATE_FLAG_* */
    CUstream hUploadStream;          /* with the UPLOAD flag */
    CUgraphNode hErrNode_out;
    CUgraphInstantiateResult result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

/* The sizes of the real structures on LP64 (x86_64, aarch64). */
#define ABI_SIZE(type, bytes) _Static_assert(sizeof(type) == (bytes), #type " ABI")
ABI_SIZE(CUmemAllocationProp, 32);
ABI_SIZE(CUmemPoolProps, 88);
ABI_SIZE(CUmemAccessDesc, 12);
ABI_SIZE(CUDA_MEM_ALLOC_NODE_PARAMS, 120);
ABI_SIZE(CUDA_KERNEL_NODE_PARAMS, 72);
ABI_SIZE(CUDA_GRAPH_INSTANTIATE_PARAMS, 32);
ABI_SIZE(CUDA_ARRAY_DESCRIPTOR, 24);
ABI_SIZE(CUDA_ARRAY3D_DESCRIPTOR, 40);
ABI_SIZE(CUDA_ARRAY_MEMORY_REQUIREMENTS, 32);

/* Special stream handles (cuda.h defines them the same way). */
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

/* The host as a device ordinal (cuMemAdvise, cuMemPrefetchAsync). */
#define CU_DEVICE_CPU ((CUdevice)-1)

/* cuMemHostAlloc flags (macros in cuda.h too). */
#define CU_MEMHOSTALLOC_PORTABLE 0x01
#define CU_MEMHOSTALLOC_DEVICEMAP 0x02
/* cuMemHostRegister flags (the stand-in takes any of these). */
#define CU_MEMHOSTREGISTER_PORTABLE 0x01
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02
#define CU_MEMHOSTALLOC_WRITECOMBINED 0x04

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
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
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

/* cuEventCreate flags (CUevent_flags). */
enum {
    CU_EVENT_DEFAULT = 0,
    CU_EVENT_BLOCKING_SYNC = 1,
    CU_EVENT_DISABLE_TIMING = 2,
    CU_EVENT_INTERPROCESS = 4
};

/* The CUdevice_attribute values the stand-in tells apart. */
enum {
    CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 89
};

/* CUmem_advise values. */
enum {
    CU_MEM_ADVISE_SET_READ_MOSTLY = 1,
    CU_MEM_ADVISE_UNSET_READ_MOSTLY = 2,
    CU_MEM_ADVISE_SET_PREFERRED_LOCATION = 3,
    CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION = 4,
    CU_MEM_ADVISE_SET_ACCESSED_BY = 5,
    CU_MEM_ADVISE_UNSET_ACCESSED_BY = 6
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

/* CUmemPool_attribute values. */
enum {
    CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,  /* int */
    CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,        /* int */
    CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3, /* int */
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,                /* cuuint64_t */
    CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,             /* cuuint64_t */
    CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,                /* cuuint64_t */
    CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,                 /* cuuint64_t */
    CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8                     /* cuuint64_t */
};

/* CUgraphNodeType values (the stand-in makes the last three kinds). */
enum {
    CU_GRAPH_NODE_TYPE_KERNEL = 0,
    CU_GRAPH_NODE_TYPE_MEMCPY = 1,
    CU_GRAPH_NODE_TYPE_MEMSET = 2,
    CU_GRAPH_NODE_TYPE_HOST = 3,
    CU_GRAPH_NODE_TYPE_GRAPH = 4,
    CU_GRAPH_NODE_TYPE_EMPTY = 5,
    CU_GRAPH_NODE_TYPE_WAIT_EVENT = 6,
    CU_GRAPH_NODE_TYPE_EVENT_RECORD = 7,
    CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL = 8,
    CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT = 9,
    CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10,
    CU_GRAPH_NODE_TYPE_MEM_FREE = 11,
    CU_GRAPH_NODE_TYPE_BATCH_MEM_OP = 12,
    CU_GRAPH_NODE_TYPE_CONDITIONAL = 13
};

/* CUgraphMem_attribute values (all cuuint64_t). */
enum {
    CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT = 0,
    CU_GRAPH_MEM_ATTR_USED_MEM_HIGH = 1,
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2,
    CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH = 3
};

/* CUgraphInstantiate_flags bits. */
enum {
    CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH = 1,
    CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD = 2,
    CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH = 4,
    CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY = 8
};

/* CUgraphInstantiateResult values. */
enum {
    CUDA_GRAPH_INSTANTIATE_SUCCESS = 0,
    CUDA_GRAPH_INSTANTIATE_ERROR = 1,
    CUDA_GRAPH_INSTANTIATE_INVALID_STRUCTURE = 2,
    CUDA_GRAPH_INSTANTIATE_NODE_OPERATION_NOT_SUPPORTED = 3,
    CUDA_GRAPH_INSTANTIATE_MULTIPLE_CTXS_NOT_SUPPORTED = 4
};

/* CUmemLocationType values. */
enum {
    CU_MEM_LOCATION_TYPE_INVALID = 0,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEM_LOCATION_TYPE_HOST = 2,
    CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
    CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4
};

/* CUmemAllocationType values. */
enum {
    CU_MEM_ALLOCATION_TYPE_INVALID = 0,
    CU_MEM_ALLOCATION_TYPE_PINNED = 1,
    CU_MEM_ALLOCATION_TYPE_MANAGED = 2
};

/* CUmemAllocationHandleType values (bits). */
enum {
    CU_MEM_HANDLE_TYPE_NONE = 0,
    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
    CU_MEM_HANDLE_TYPE_WIN32 = 2,
    CU_MEM_HANDLE_TYPE_WIN32_KMT = 4,
    CU_MEM_HANDLE_TYPE_FABRIC = 8
};

/* CUmemAccess_flags values. */
enum {
    CU_MEM_ACCESS_FLAGS_PROT_NONE = 0,
    CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
};

/* CUmemAllocationGranularity_flags values. */
enum {
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1
};

/* The CUarray_format values the stand-in knows (cuda.h has more). */
enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,
    CU_AD_FORMAT_SIGNED_INT16 = 0x09,
    CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
    CU_AD_FORMAT_HALF = 0x10,
    CU_AD_FORMAT_FLOAT = 0x20
};

/* CUDA_ARRAY3D_DESCRIPTOR.Flags bits. */
enum {
    CUDA_ARRAY3D_LAYERED = 0x01,
    CUDA_ARRAY3D_SURFACE_LDST = 0x02,
    CUDA_ARRAY3D_CUBEMAP = 0x04,
    CUDA_ARRAY3D_TEXTURE_GATHER = 0x08,
    CUDA_ARRAY3D_DEPTH_TEXTURE = 0x10,
    CUDA_ARRAY3D_COLOR_ATTACHMENT = 0x20,
    CUDA_ARRAY3D_SPARSE = 0x40,
    CUDA_ARRAY3D_DEFERRED_MAPPING = 0x80,
    CUDA_ARRAY3D_VIDEO_ENCODE_DECODE = 0x100
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
CUresult cuGetExportTable(const void **ppExportTable,
                          const CUuuid *pExportTableId);

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
CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority);
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

/* Kernels and copies (the stand-in's fake module; see cuda_standin.c). */
CUresult cuModuleLoadData(CUmodule *module, const void *image);
CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex,
                            size_t *paramOffset, size_t *paramSize);
CUresult cuFuncGetName(const char **name, CUfunction hfunc);
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX,
                        unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY,
                        unsigned int blockDimZ, unsigned int sharedMemBytes,
                        CUstream hStream, void **kernelParams, void **extra);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX,
                             unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY,
                             unsigned int blockDimZ, unsigned int sharedMemBytes,
                             CUstream hStream, void **kernelParams, void **extra);
/* Texture references: only the mipmap level clamp (two floats by value). */
typedef struct CUtexref_st *CUtexref;
CUresult cuTexRefSetMipmapLevelClamp(CUtexref hTexRef, float minClamp,
                                     float maxClamp);
CUresult cuTexRefGetMipmapLevelClamp(float *pminClamp, float *pmaxClamp,
                                     CUtexref hTexRef);
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                              size_t ByteCount, CUstream hStream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                   size_t ByteCount, CUstream hStream);
CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N);
CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyAtoD_v2(CUdeviceptr dstDevice, CUarray srcArray,
                         size_t srcOffset, size_t ByteCount);
CUresult cuMemcpyAtoD_v2_ptds(CUdeviceptr dstDevice, CUarray srcArray,
                              size_t srcOffset, size_t ByteCount);
CUresult cuMemcpyDtoA_v2(CUarray dstArray, size_t dstOffset,
                         CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyDtoA_v2_ptds(CUarray dstArray, size_t dstOffset,
                              CUdeviceptr srcDevice, size_t ByteCount);
/* The launches of parameters set with cuParamSet* (deprecated). */
CUresult cuLaunch(CUfunction f);
CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height);
CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height,
                           CUstream hStream);
/* The batched copy: CUDA 12.8's form takes a failure index, 13.0's (_v2)
 * does not. The attributes are taken as opaque here. */
CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                            size_t count, void *attrs, size_t *attrsIdxs,
                            size_t numAttrs, size_t *failIdx, CUstream hStream);
CUresult cuMemcpyBatchAsync_ptsz(CUdeviceptr *dsts, CUdeviceptr *srcs,
                                 size_t *sizes, size_t count, void *attrs,
                                 size_t *attrsIdxs, size_t numAttrs,
                                 size_t *failIdx, CUstream hStream);
CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs,
                               size_t *sizes, size_t count, void *attrs,
                               size_t *attrsIdxs, size_t numAttrs,
                               CUstream hStream);
CUresult cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr *dsts, CUdeviceptr *srcs,
                                    size_t *sizes, size_t count, void *attrs,
                                    size_t *attrsIdxs, size_t numAttrs,
                                    CUstream hStream);

/* Pinned host memory. */
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
CUresult cuMemAllocHost_v2(void **pp, size_t bytesize);
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p,
                                      unsigned int Flags);
CUresult cuMemFreeHost(void *p);
CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags);
CUresult cuMemHostUnregister(void *p);

/* Managed memory advice: the device-ordinal form and the location form. */
CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                     CUdevice device);
CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                        CUmemLocation location);

/* Events. */
CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream);
CUresult cuEventQuery(CUevent hEvent);
CUresult cuEventSynchronize(CUevent hEvent);
CUresult cuEventDestroy_v2(CUevent hEvent);

/* Stream-ordered allocation and memory pools. */
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                              CUstream hStream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                                 CUmemoryPool pool, CUstream hStream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                      CUmemoryPool pool, CUstream hStream);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep);
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                               void *value);
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                               void *value);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev);
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev);
CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool);
CUresult cuStreamQuery(CUstream hStream);
CUresult cuStreamQuery_ptsz(CUstream hStream);
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuStreamSynchronize_ptsz(CUstream hStream);
CUresult cuStreamGetDevice(CUstream hStream, CUdevice *device);
CUresult cuStreamGetDevice_ptsz(CUstream hStream, CUdevice *device);

/* Graphs: memory nodes, child graphs, instantiation and launch. */
CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
CUresult cuGraphDestroy(CUgraph hGraph);
CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies,
                                size_t numDependencies,
                                CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams);
CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                               const CUgraphNode *dependencies,
                               size_t numDependencies, CUdeviceptr dptr);
CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode,
                                      CUDA_MEM_ALLOC_NODE_PARAMS *params_out);
CUresult cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr *dptr_out);
CUresult cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                  const CUgraphNode *dependencies,
                                  size_t numDependencies, CUgraph childGraph);
CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph);
CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes);
CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type);
/* Kernel nodes are made only by a launch on a capturing stream. */
CUresult cuGraphKernelNodeGetParams(CUgraphNode hNode,
                                    CUDA_KERNEL_NODE_PARAMS *nodeParams);
CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hNode,
                                       CUDA_KERNEL_NODE_PARAMS *nodeParams);
/* The executable graph's kernels take those of hGraph, which must have as
   many kernel nodes and no memory nodes (nor may the executable graph). */
CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                              CUgraphExecUpdateResultInfo *resultInfo);
/* The kernel of the executable graph made from hNode takes these
   parameters (func the same as the node's or NULL). */
CUresult cuGraphExecKernelNodeSetParams(CUgraphExec hGraphExec,
                                        CUgraphNode hNode,
                                        const CUDA_KERNEL_NODE_PARAMS *p);
CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec,
                                           CUgraphNode hNode,
                                           const CUDA_KERNEL_NODE_PARAMS *p);
/* 10.0 and 11.0 ABI; CUDA 12 headers map the name cuGraphInstantiate to
   cuGraphInstantiateWithFlags, and so does cuGetProcAddress from 12000. */
CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                            CUgraphNode *phErrorNode, char *logBuffer,
                            size_t bufferSize);
CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                               CUgraphNode *phErrorNode, char *logBuffer,
                               size_t bufferSize);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags);
CUresult cuGraphInstantiateWithParams(
    CUgraphExec *phGraphExec, CUgraph hGraph,
    CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);
CUresult cuGraphInstantiateWithParams_ptsz(
    CUgraphExec *phGraphExec, CUgraph hGraph,
    CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec);
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream);
CUresult cuDeviceGetGraphMemAttribute(CUdevice device,
                                      CUgraphMem_attribute attr, void *value);
CUresult cuDeviceSetGraphMemAttribute(CUdevice device,
                                      CUgraphMem_attribute attr, void *value);
CUresult cuDeviceGraphMemTrim(CUdevice device);

/* Virtual memory management. */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop,
                     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
                                     void *addr);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                             CUdeviceptr addr, unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size,
                        const CUmemAccessDesc *desc, size_t count);
CUresult cuMemGetAccess(unsigned long long *flags,
                        const CUmemLocation *location, CUdeviceptr ptr);
CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags);
typedef enum CUpointer_attribute_enum {
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
    CU_POINTER_ATTRIBUTE_MAPPED = 13
} CUpointer_attribute;
typedef enum CUmemorytype_enum {
    CU_MEMORYTYPE_HOST = 1,
    CU_MEMORYTYPE_DEVICE = 2
} CUmemorytype;
CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
                               CUdeviceptr ptr);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize,
                                 CUdeviceptr dptr);
CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                       const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option);
CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                      CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType,
                                      unsigned long long flags);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                        void *osHandle,
                                        CUmemAllocationHandleType shHandleType);

/* Arrays. */
CUresult cuArrayCreate_v2(CUarray *pHandle,
                          const CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
CUresult cuArray3DCreate_v2(CUarray *pHandle,
                            const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray);
CUresult cuArrayDestroy(CUarray hArray);
CUresult cuMipmappedArrayCreate(
    CUmipmappedArray *pHandle,
    const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
    unsigned int numMipmapLevels);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray);
CUresult cuArrayGetMemoryRequirements(
    CUDA_ARRAY_MEMORY_REQUIREMENTS *memoryRequirements, CUarray array,
    CUdevice device);
CUresult cuMipmappedArrayGetMemoryRequirements(
    CUDA_ARRAY_MEMORY_REQUIREMENTS *memoryRequirements,
    CUmipmappedArray mipmap, CUdevice device);

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
 * Bytes of device dev's live managed allocations whose preferred location is
 * the host (advised with cuMemAdvise); they are not in
 * vramcap_standin_used(dev). 0 if dev is invalid.
 */
size_t vramcap_standin_managed_host(int dev);
/*
 * What the stand-in knows ptr (any address inside an allocation) to be:
 * "device" (cuMemAlloc family, stream-ordered), "managed", "managed-host"
 * (managed, preferred location the host), "host" (cuMemHostAlloc,
 * cuMemAllocHost_v2) or "unknown" (anything else, freed memory, VMM ranges
 * and graph allocations included).
 */
const char *vramcap_standin_kind(CUdeviceptr ptr);
/*
 * Event counters: "alloc", "free" (cuMemAlloc, cuMemAlloc_v2,
 * cuMemAllocPitch_v2 and cuMemAllocManaged blocks made / freed),
 * "getprocaddress", "alias", "sync" (cuCtxSynchronize calls), "capture"
 * (captures begun), "ipc" (cuIpcGetMemHandle calls), "async" (stream-ordered
 * allocations made, from any pool; graph allocations during capture are not
 * counted), "vmm" / "vmm_host" (cuMemCreate on a device / on the host),
 * "array" (CUDA arrays, 3D arrays and mipmapped arrays created), "event"
 * (successful cuEventRecord / _ptsz calls); and two amounts: "host_bytes"
 * (live pinned host bytes), "managed_host_bytes" (live managed bytes whose
 * preferred location is the host, all devices); 0 otherwise.
 */
unsigned long vramcap_standin_count(const char *what);
/*
 * Live contexts on device dev: 1 for an active (retained) primary context
 * plus the live cuCtxCreate contexts on it; 0 if dev is invalid. The NVML
 * stand-in lists the process on the devices where this is not 0.
 */
int vramcap_standin_contexts(int dev);
/*
 * The grid and block dimensions and shared bytes (dims[0..7]) and the
 * stream of the last cuLaunchKernel or cuLaunchKernel_ptsz call.
 */
void vramcap_standin_last_launch(unsigned dims[7], CUstream *stream);

#endif /* VRAMCAP_CUDA_SUBSET_H */
