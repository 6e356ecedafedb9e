/*
 * client.c - scriptable CUDA driver client for the vramcap integration tests.
 *
 *   client METHOD CMD...
 *
 * METHOD is how the client obtains driver functions, mimicking different
 * kinds of real programs:
 *   linked           direct calls resolved by the dynamic linker
 *                    (only in client-linked, built with -DCLIENT_LINKED)
 *   dlsym            dlopen("libcuda.so.1") + dlsym of exact versioned names
 *                    ("cuMemAlloc_v2"), like XLA
 *   procaddr         dlsym "cuGetProcAddress_v2", ask it for itself
 *                    ("cuGetProcAddress" at 12000) and look everything up
 *                    through the result with cudart's versions, like cudart
 *   procaddr-legacy  the same with the 4-argument "cuGetProcAddress" (11030)
 *
 * The whole command line is checked first; then the driver functions are
 * obtained and the commands run left to right. Each prints exactly one line
 * to stdout (flushed), except "standin" and "nvml", which print one per
 * device, "nvmlprocs", which prints one per process and device (or per
 * device without any), and "kinds", which prints one per device and one
 * more. RC is the driver's CUresult in decimal; SIZE is a byte count,
 * optionally with a K, M or G suffix (powers of 1024), printed back in
 * bytes; slots number the allocations the client remembers, from 0: device
 * pointers (#SLOT), cuMemCreate handles (%SLOT) and arrays (@SLOT), each
 * numbered separately.
 *
 *   init                  cuInit(0), device 0's primary context current
 *                         -> "init -> RC"
 *   ctx N                 device N's primary context current
 *                         -> "ctx N -> RC"
 *   noctx                 cuCtxSetCurrent(NULL)      -> "noctx -> RC"
 *   alloc SIZE            cuMemAlloc_v2  -> "alloc BYTES -> RC #SLOT"
 *                                           (no " #SLOT" on failure)
 *   managed SIZE          cuMemAllocManaged(.., CU_MEM_ATTACH_GLOBAL)
 *                         -> "managed BYTES -> RC #SLOT"
 *   pitch W H ELEM        cuMemAllocPitch_v2
 *                         -> "pitch W H ELEM -> RC pitch=P #SLOT"
 *                            ("pitch W H ELEM -> RC" on failure)
 *   free SLOT             cuMemFree_v2 of the slot's pointer (SLOT or #SLOT;
 *                         again if already freed) -> "free #SLOT -> RC"
 *   freeraw HEX           cuMemFree_v2 of any value -> "freeraw 0xHEX -> RC"
 *   fill SIZE             alloc until failure (at most 1000000 times)
 *                         -> "fill BYTES -> N allocs TOTAL bytes rc=RC"
 *   freeall               free every live slot -> "freeall -> N freed rc=RC"
 *   info                  cuMemGetInfo_v2 -> "info -> RC free=F total=T"
 *   total N               cuDeviceTotalMem_v2 -> "total N -> RC bytes=B"
 *   standin               per device: "standin dev=N used=U peak=P"
 *   abiversion            vramcap_version() through dlsym(RTLD_DEFAULT)
 *                         -> "abiversion -> V" (-1: not preloaded)
 *   setlimit DEV SIZE|max vramcap_set_limit -> "setlimit DEV BYTES -> RC"
 *                         ("setlimit DEV max -> RC"; RC -1000: missing)
 *   getlimit DEV          vramcap_get_limit -> "getlimit DEV -> BYTES"
 *                         ("max" for UINT64_MAX, "missing")
 *   abistats DEV          vramcap_memory_stats -> "abistats DEV -> RC
 *                         size=.. limit=.. soft=.. held=.. allocations=.. pools=..
 *                         graphs=.. context=.. peak=.. cached=.. refusals=.."
 *   emptycache            vramcap_empty_cache -> "emptycache -> BYTES"
 *   counts                "counts alloc=A free=F getprocaddress=G alias=X
 *                         sync=S capture=C ipc=I async=Y vmm=V vmm_host=H
 *                         array=R host_bytes=B managed_host_bytes=M
 *                         host_register=P event=E" (one line)
 *   kcounts               "kcounts launch=L fault=F": the stand-in's kernel
 *                         launches that ran and launches or copies that
 *                         named reserved but unmapped addresses
 *   ckstate               the stand-in's checkpoint model (parking):
 *                         "ckstate state=S checkpoints=C restores=R
 *                         failures=F parked=P" (S a CUprocessState: 0
 *                         running, 1 locked, 2 checkpointed, 3 failed)
 *   kinds                 per device "kinds dev=N device=D managed_host=M"
 *                         (D: vramcap_standin_used, M: the device's managed
 *                         bytes preferring the host), then "kinds host=H"
 *                         (live pinned host bytes)
 *   ptrkind SLOT          -> "ptrkind #SLOT = K", K the stand-in's view of
 *                         the slot's pointer: device, managed, managed-host,
 *                         host or unknown
 *   wait                  print "wait", block until a line or EOF arrives on
 *                         stdin, then print "resumed" (lets a test look at
 *                         the process while it holds memory, without sleeps)
 *   churnlimit T ITERS MAX LOW  the threads below; a quarter of the way
 *                         the main thread lowers device 0's cap to LOW
 *                         (vramcap_set_limit) and has the stand-in count
 *                         charges past LOW from then on
 *                         -> "churnlimit -> rc=RC past=N other=E oom=some|none"
 *   threads T ITERS MAX   T threads allocating and freeing 1M..MAX, each
 *                         holding up to four; the first four of every
 *                         thread are made before any is freed (a barrier)
 *                         -> "threads -> ok=A oom=O other=E"
 *   forkbusy T N          T threads allocating and freeing 1M..4M without
 *                         end while the main thread forks N times; each
 *                         child looks up cuMemAlloc_v2 through dlsym on the
 *                         libcuda handle (the shim's dlsym, no driver call)
 *                         and exits 0; a child not done within 10 s is
 *                         killed and counted as hung
 *                         -> "forkbusy -> forks=N ok=K hung=H"
 *   forkhold              fork a child that only waits for a signal
 *                         -> "forkhold -> child PID"
 *   resolve NAME VER FLAGS    -> "resolve NAME VER FLAGS -> RC status=S lib=L"
 *                         (symbolStatus starts as 0 and is printed as is;
 *                         S is "-" with procaddr-legacy, which has none)
 *   resolve4 NAME VER FLAGS   the same with symbolStatus NULL (status=-)
 *   dlsym NAME            dlsym on the libcuda handle -> "dlsym NAME -> lib=L"
 *   next NAME             dlsym(RTLD_NEXT)    -> "next NAME -> lib=L"
 *   default NAME          dlsym(RTLD_DEFAULT) -> "default NAME -> lib=L"
 *   call-resolved cuMemAlloc  resolve now and allocate 1 MiB through it
 *                         -> "call-resolved cuMemAlloc -> RC #SLOT"
 *   pairs N SIZE          N times cuMemAlloc_v2 then cuMemFree_v2 of it,
 *                         stopping at the first error (slots are not used)
 *                         -> "pairs N BYTES -> ok=K rc=RC" (K pairs done,
 *                            RC the first error or 0)
 *   ptr SLOT              -> "ptr #SLOT = 0xHEX" (the slot's address)
 *   range SLOT            cuMemGetAddressRange_v2 of the slot's address plus
 *                         4 KiB -> "range #SLOT -> RC base=+OFF size=S"
 *   ptrquery SLOT         cuPointerGetAttribute (device ordinal, range
 *                         start) and cuMemGetAddressRange_v2 of the slot's
 *                         address plus 4 KiB -> "ptrquery #SLOT -> RC
 *                         dev=D start=+OFF; range -> RC base=+OFF size=S"
 *                         (OFF from the slot's address; -1 where unanswered)
 *   ipc SLOT              cuIpcGetMemHandle of the slot's pointer
 *                         -> "ipc #SLOT -> RC"
 *   sync                  cuCtxSynchronize            -> "sync -> RC"
 *   nochld                SIGCHLD ignored (children reaped by the kernel,
 *                         as some servers set it) -> "nochld"
 *   atexit-sync           registers an atexit handler that calls
 *                         cuCtxSynchronize, as the runtime's exit handler
 *                         calls the driver -> at exit "atexit sync -> RC"
 *   stream                cuStreamCreate(flags 0), remembered as the
 *                         client's stream (NULL until then) -> "stream -> RC"
 *   stream-nb             the same with CU_STREAM_NON_BLOCKING
 *                         -> "stream-nb -> RC"
 *   stream-prio-nb        cuStreamCreateWithPriority(CU_STREAM_NON_BLOCKING,
 *                         priority -1), remembered the same way
 *                         -> "stream-prio-nb -> RC"
 *   capture-begin         cuStreamBeginCapture_v2(client's stream,
 *                         CU_STREAM_CAPTURE_MODE_RELAXED)
 *                         -> "capture-begin -> RC"
 *   capture-end           cuStreamEndCapture(client's stream)
 *                         -> "capture-end -> RC"
 *   ctxcreate             cuCtxCreate_v4(NULL params, flags 0, device 0),
 *                         which also makes it current; remembered
 *                         -> "ctxcreate -> RC"
 *   ctxdestroy            cuCtxDestroy_v2 of the remembered context (NULL
 *                         if none; again if already destroyed)
 *                         -> "ctxdestroy -> RC"
 *   release N             cuDevicePrimaryCtxRelease_v2(N) -> "release N -> RC"
 *   reset N               cuDevicePrimaryCtxReset_v2(N)   -> "reset N -> RC"
 *                         (neither touches the client's own record of
 *                         retained primary contexts: "ctx N" does not
 *                         retain device N's again)
 *   allocasync SIZE       cuMemAllocAsync on the client's stream (NULL
 *                         until "stream") -> "allocasync BYTES -> RC #SLOT"
 *                         ("allocasync BYTES -> RC" on failure)
 *   freeasync SLOT        cuMemFreeAsync of the slot's pointer on the
 *                         client's stream -> "freeasync #SLOT -> RC"
 *                         (free, freeall use cuMemFree_v2 on any slot;
 *                         freeall skips slots freed either way)
 *   pool                  cuMemPoolCreate(pinned, device 0), remembered as
 *                         the client's pool (NULL until then) -> "pool -> RC"
 *   poolalloc SIZE        cuMemAllocFromPoolAsync from the client's pool on
 *                         the client's stream
 *                         -> "poolalloc BYTES -> RC #SLOT" (no #SLOT on
 *                            failure)
 *   vmm SIZE [host]       cuMemCreate(pinned, POSIX fd handle type requested,
 *                         location device 0, or the host with "host")
 *                         -> "vmm BYTES -> RC %HSLOT" (no %HSLOT on failure;
 *                            "host" is not printed)
 *   vmmmap HSLOT          cuMemAddressReserve of the handle's size,
 *                         cuMemMap of the handle there, cuMemSetAccess
 *                         (device 0, read-write); the address is remembered
 *                         (on failure what was done is undone)
 *                         -> "vmmmap %HSLOT -> RC" (the first failure)
 *   vmmunmap HSLOT        cuMemUnmap and cuMemAddressFree of the remembered
 *                         address -> "vmmunmap %HSLOT -> RC"
 *   vmmretain HSLOT       cuMemRetainAllocationHandle(the remembered
 *                         address); the handle goes into a new handle slot
 *                         -> "vmmretain %HSLOT -> RC %NEW" (no %NEW on
 *                            failure)
 *   vmmexport HSLOT       cuMemExportToShareableHandle(POSIX fd); the fd is
 *                         remembered -> "vmmexport %HSLOT -> RC"
 *   vmmimport             cuMemImportFromShareableHandle(the last exported
 *                         fd, -1 if none) into a new handle slot
 *                         -> "vmmimport -> RC %NEW" (no %NEW on failure)
 *   vmmrelease HSLOT      cuMemRelease -> "vmmrelease %HSLOT -> RC"
 *   array W H F C         cuArrayCreate_v2 (width, height, CUarray_format F
 *                         in hex like 0x20 or decimal, channels)
 *                         -> "array W H 0xF C -> RC @ASLOT" (no @ASLOT on
 *                            failure)
 *   array3d W H D F C     cuArray3DCreate_v2 (flags 0)
 *                         -> "array3d W H D 0xF C -> RC @ASLOT"
 *   mipmap W H D F C L    cuMipmappedArrayCreate (flags 0, L levels)
 *                         -> "mipmap W H D 0xF C L -> RC @ASLOT"
 *   arraydestroy ASLOT    cuArrayDestroy or cuMipmappedArrayDestroy
 *                         -> "arraydestroy @ASLOT -> RC"
 *   arraysize ASLOT       cuArrayGetMemoryRequirements or
 *                         cuMipmappedArrayGetMemoryRequirements for the
 *                         current context's device (0 if none)
 *                         -> "arraysize @ASLOT -> RC size=S" (S 0 on failure)
 *   nvml                  dlopen("libnvidia-ml.so.1") (in every method),
 *                         nvmlInit_v2, nvmlDeviceGetCount_v2, then per device
 *                         nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetUUID,
 *                         nvmlDeviceGetMemoryInfo and _v2, nvmlShutdown
 *                         -> per device "nvml dev=N uuid=U total=T free=F
 *                            used=U2 v2total=T2 v2free=F2 v2used=U3
 *                            v2reserved=R" or, on an error,
 *                            "nvml dev=N -> RC"; "nvml -> RC" if init or
 *                            the count fails, "nvml -> unavailable" if the
 *                            library or a function is missing (RC is the
 *                            nvmlReturn_t)
 *   poolattr ATTR         cuMemPoolGetAttribute of the client's pool (from
 *                         "pool"), else the current device's current pool
 *                         (cuDeviceGetMemPool); ATTR threshold, reserved,
 *                         reservedhigh, used or usedhigh
 *                         -> "poolattr ATTR -> RC VALUE" (VALUE in bytes)
 *   poolset ATTR SIZE|max cuMemPoolSetAttribute of that pool (max:
 *                         UINT64_MAX) -> "poolset ATTR BYTES -> RC" or
 *                         "poolset ATTR max -> RC"
 *   pooltrim SIZE         cuMemPoolTrimTo of that pool -> "pooltrim BYTES -> RC"
 *   setpool               cuDeviceSetMemPool(current device, client's pool)
 *                         -> "setpool -> RC"
 *   destroypool           cuMemPoolDestroy(client's pool) -> "destroypool -> RC"
 *   kernel NAME           cuModuleLoadData (once) and cuModuleGetFunction of
 *                         the stand-in's function NAME (touchN, gemm_touchN)
 *                         -> "kernel NAME -> RC"
 *   kernel-launch T #S..  cuLaunchKernel of that function T times on the
 *                         client's stream, its parameters the slots'
 *                         pointers (1 to 8; %HSLOT: where vmmmap mapped
 *                         the handle) -> "kernel-launch T -> RC" (the
 *                         first failure)
 *   memset32 SLOT SIZE V  cuMemsetD32_v2 of SIZE bytes -> "memset32 #SLOT -> RC"
 *                         (SLOT may be %HSLOT, as for kernel-launch; it is
 *                         printed so)
 *   read32 SLOT           cuMemcpyDtoH_v2 of 4 bytes
 *                         -> "read32 #SLOT -> RC value=V" (the same)
 *   batch-copy VER D S SIZE  (procaddr) cuMemcpyBatchAsync as resolved for
 *                         VER (12080 or 13000), one copy of SIZE bytes from
 *                         slot S to slot D -> "batch-copy VER #D #S -> RC
 *                         [fail=I] lib=LIB"
 *   array-copies @A #S    (procaddr) cuMemcpyAtoD and cuMemcpyDtoA as resolved
 *                         for 3020, 4 bytes between array A and slot S
 *                         -> "array-copies @A #S -> atod=RC dtoa=RC lib=L1,L2"
 *   grid-launches         (procaddr) cuLaunch, cuLaunchGrid and
 *                         cuLaunchGridAsync of the "kernel" function
 *                         -> "grid-launches -> RC RC RC lib=L1,L2,L3"
 *   streamsync            cuStreamSynchronize(client's stream)
 *                         -> "streamsync -> RC"
 *   streamquery           cuStreamQuery(client's stream)
 *                         -> "streamquery -> RC"
 *   event                 cuEventCreate(flags 0), remembered as the client's
 *                         event, then cuEventRecord of it on the client's
 *                         stream -> "event -> RC RC" (the create's code
 *                         twice on failure)
 *   eventquery, eventsync cuEventQuery / cuEventSynchronize of the client's
 *                         event -> "eventquery -> RC", "eventsync -> RC"
 *   graphmem ATTR         cuDeviceGetGraphMemAttribute(current device); ATTR
 *                         used, usedhigh, reserved or reservedhigh
 *                         -> "graphmem ATTR -> RC VALUE"
 *   graphmemset ATTR SIZE cuDeviceSetGraphMemAttribute
 *                         -> "graphmemset ATTR BYTES -> RC"
 *   graphtrim             cuDeviceGraphMemTrim(current device)
 *                         -> "graphtrim -> RC"
 *   graphalloc SIZE       cuGraphAddMemAllocNode (no dependencies, pinned on
 *                         the current device, read-write access for it) to
 *                         the client's graph, made with cuGraphCreate first
 *                         if there is none; the node's pointer goes into a
 *                         slot -> "graphalloc BYTES -> RC #SLOT" (no #SLOT on
 *                         failure)
 *   graphfree SLOT        cuGraphAddMemFreeNode of the slot's pointer to the
 *                         client's graph -> "graphfree #SLOT -> RC"
 *   graphnodes            cuGraphGetNodes (count, then the nodes) and
 *                         cuGraphNodeGetType of each -> "graphnodes -> RC
 *                         n=N types=T1,T2,..." (types "-" when none)
 *   graphdestroy          cuGraphDestroy -> "graphdestroy -> RC"
 *   instantiate [autofree|upload]
 *                         the client's graph ("graphalloc"'s, else the last
 *                         one "capture-end" gave) becomes the client's
 *                         executable graph: cuGraphInstantiate (12000 ABI,
 *                         cuGraphInstantiateWithFlags by exact name) with
 *                         flags 0 or AUTO_FREE_ON_LAUNCH -> "instantiate ->
 *                         RC" / "instantiate autofree -> RC"; with upload
 *                         cuGraphInstantiateWithParams (FLAG_UPLOAD, the
 *                         client's stream) -> "instantiate upload -> RC
 *                         result=R" (R the CUgraphInstantiateResult)
 *   launch, upload        cuGraphLaunch / cuGraphUpload of the executable
 *                         graph on the client's stream -> "launch -> RC"
 *   launches T            cuGraphLaunch of it T times, stopping at the
 *                         first failure -> "launches T -> RC"
 *   execupdate            cuGraphExecUpdate (12000 ABI: the _v2 form) of the
 *                         executable graph to the client's graph (as
 *                         "instantiate" picks it) -> "execupdate -> RC
 *                         result=R" (R the CUgraphExecUpdateResult)
 *   execdestroy           cuGraphExecDestroy -> "execdestroy -> RC"
 *   nvmlprocs             NVML like "nvml"; per device the handle by index,
 *                         its UUID, the handle by UUID (must be the same),
 *                         then nvmlDeviceGetComputeRunningProcesses_v3 with
 *                         no room (for the count), then with room
 *                         -> per process "nvmlprocs dev=N pid=P used=U",
 *                            "nvmlprocs dev=N none" without any,
 *                            "nvmlprocs dev=N -> RC" on an error;
 *                            "nvmlprocs -> RC" / "-> unavailable" as "nvml"
 *
 * The driver functions of the commands from poolattr to execdestroy are
 * obtained only when the command line uses one of them (cudart's versions:
 * cuMemPool* and cuDevice(Get|Set)MemPool 11020, cuStreamSynchronize 2000,
 * cuGraphCreate/Destroy/GetNodes/NodeGetType/ExecDestroy/Launch 10000,
 * cuGraphExecUpdate 12000,
 * cuGraphUpload 11010, the memory node and graph memory calls 11040,
 * cuGraphInstantiate and cuGraphInstantiateWithParams 12000).
 *
 * The driver functions of the commands from allocasync to arraysize are
 * obtained only when the command line uses one of them (the procaddr
 * methods ask cuGetProcAddress for them with the CUDA versions that
 * introduced them: cuMemAllocAsync 11020, cuMemCreate 10020,
 * cuMemRetainAllocationHandle 11000, cuArrayCreate 3020, cuArrayDestroy
 * 2000, cuMipmappedArrayCreate 5000, cu*GetMemoryRequirements 11060...).
 *
 * lib=L is the basename of the object containing the pointer: "null" for
 * NULL, "?" if dladdr does not know it.
 * resolve, resolve4 and call-resolved print "CMD -> unsupported" with the
 * linked and dlsym methods.
 *
 * Exit status: 0 (driver errors are data), 64 for a bad command line,
 * 69 if the driver or one of its functions can not be obtained, 70 if a
 * system call fails.
 */
#define _GNU_SOURCE /* RTLD_NEXT, RTLD_DEFAULT, dladdr */
#include "cuda_subset.h"
#include "nvml_subset.h"

#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_USAGE 64       /* EX_USAGE */
#define EXIT_UNAVAILABLE 69 /* EX_UNAVAILABLE */
#define EXIT_SOFTWARE 70    /* EX_SOFTWARE */

#define MIB ((size_t)1 << 20)
#define FILL_LIMIT 1000000
#define MAX_THREADS 1024
#define MAX_CACHED_DEVICES 64

/* ---- Output and errors ------------------------------------------------- */

/* Print one result line and flush it, so tests see it even if we crash. */
__attribute__((format(printf, 1, 2))) static void out(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

__attribute__((format(printf, 2, 3), noreturn)) static void
die(int status, const char *fmt, ...)
{
    va_list ap;
    fflush(stdout);
    fputs("client: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(status);
}

/* ---- Driver functions -------------------------------------------------- */

/* The driver functions the commands use, however they were obtained. */
struct api {
    CUresult (*init)(unsigned int);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*ctx_get_device)(CUdevice *);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_alloc_pitch)(CUdeviceptr *, size_t *, size_t, size_t,
                                unsigned int);
    CUresult (*mem_alloc_managed)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*mem_get_info)(size_t *, size_t *);
    CUresult (*device_total_mem)(size_t *, CUdevice);
    CUresult (*ctx_synchronize)(void);
    CUresult (*stream_create)(CUstream *, unsigned int);
    CUresult (*stream_create_with_priority)(CUstream *, unsigned int, int);
    CUresult (*stream_begin_capture)(CUstream, CUstreamCaptureMode);
    CUresult (*stream_end_capture)(CUstream, CUgraph *);
    CUresult (*ipc_get_mem_handle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*ctx_create)(CUcontext *, CUctxCreateParams *, unsigned int,
                           CUdevice);
    CUresult (*ctx_destroy)(CUcontext);
    CUresult (*primary_ctx_release)(CUdevice);
    CUresult (*primary_ctx_reset)(CUdevice);
    CUresult (*ctx_enable_peer_access)(CUcontext, unsigned int);
    CUresult (*mem_get_access)(unsigned long long *, const CUmemLocation *,
                               CUdeviceptr);
    /* Obtained only when a command needs them (see g_ext_functions). */
    CUresult (*mem_alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*mem_free_async)(CUdeviceptr, CUstream);
    CUresult (*mem_pool_create)(CUmemoryPool *, const CUmemPoolProps *);
    CUresult (*mem_alloc_from_pool_async)(CUdeviceptr *, size_t, CUmemoryPool,
                                          CUstream);
    CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t,
                           const CUmemAllocationProp *, unsigned long long);
    CUresult (*mem_release)(CUmemGenericAllocationHandle);
    CUresult (*mem_retain_allocation_handle)(CUmemGenericAllocationHandle *,
                                             void *);
    CUresult (*mem_address_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                                    unsigned long long);
    CUresult (*mem_address_free)(CUdeviceptr, size_t);
    CUresult (*mem_map)(CUdeviceptr, size_t, size_t,
                        CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*mem_unmap)(CUdeviceptr, size_t);
    CUresult (*mem_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *,
                               size_t);
    CUresult (*mem_export)(void *, CUmemGenericAllocationHandle,
                           CUmemAllocationHandleType, unsigned long long);
    CUresult (*mem_import)(CUmemGenericAllocationHandle *, void *,
                           CUmemAllocationHandleType);
    CUresult (*array_create)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
    CUresult (*array3d_create)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
    CUresult (*array_destroy)(CUarray);
    CUresult (*mipmap_create)(CUmipmappedArray *,
                              const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
    CUresult (*mipmap_destroy)(CUmipmappedArray);
    CUresult (*array_requirements)(CUDA_ARRAY_MEMORY_REQUIREMENTS *, CUarray,
                                   CUdevice);
    CUresult (*mipmap_requirements)(CUDA_ARRAY_MEMORY_REQUIREMENTS *,
                                    CUmipmappedArray, CUdevice);
    CUresult (*pointer_get_attribute)(void *, CUpointer_attribute,
                                      CUdeviceptr);
    CUresult (*mem_get_address_range)(CUdeviceptr *, size_t *, CUdeviceptr);
    /* Obtained only when a command needs them (see g_graph_functions). */
    CUresult (*mem_pool_get_attribute)(CUmemoryPool, CUmemPool_attribute,
                                       void *);
    CUresult (*mem_pool_set_attribute)(CUmemoryPool, CUmemPool_attribute,
                                       void *);
    CUresult (*mem_pool_trim_to)(CUmemoryPool, size_t);
    CUresult (*mem_pool_destroy)(CUmemoryPool);
    CUresult (*device_get_mem_pool)(CUmemoryPool *, CUdevice);
    CUresult (*device_set_mem_pool)(CUdevice, CUmemoryPool);
    CUresult (*stream_synchronize)(CUstream);
    CUresult (*stream_query)(CUstream);
    CUresult (*event_create)(CUevent *, unsigned int);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_query)(CUevent);
    CUresult (*event_synchronize)(CUevent);
    CUresult (*graph_create)(CUgraph *, unsigned int);
    CUresult (*graph_destroy)(CUgraph);
    CUresult (*graph_add_mem_alloc_node)(CUgraphNode *, CUgraph,
                                         const CUgraphNode *, size_t,
                                         CUDA_MEM_ALLOC_NODE_PARAMS *);
    CUresult (*graph_add_mem_free_node)(CUgraphNode *, CUgraph,
                                        const CUgraphNode *, size_t,
                                        CUdeviceptr);
    CUresult (*graph_get_nodes)(CUgraph, CUgraphNode *, size_t *);
    CUresult (*graph_node_get_type)(CUgraphNode, CUgraphNodeType *);
    CUresult (*graph_instantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*graph_instantiate_with_params)(CUgraphExec *, CUgraph,
                                              CUDA_GRAPH_INSTANTIATE_PARAMS *);
    CUresult (*graph_exec_destroy)(CUgraphExec);
    CUresult (*graph_exec_update)(CUgraphExec, CUgraph,
                                  CUgraphExecUpdateResultInfo *);
    CUresult (*graph_launch)(CUgraphExec, CUstream);
    CUresult (*graph_upload)(CUgraphExec, CUstream);
    CUresult (*device_get_graph_mem_attribute)(CUdevice, CUgraphMem_attribute,
                                               void *);
    CUresult (*device_set_graph_mem_attribute)(CUdevice, CUgraphMem_attribute,
                                               void *);
    CUresult (*device_graph_mem_trim)(CUdevice);
    /* Obtained only when a command needs them (see g_kernel_functions). */
    CUresult (*module_load_data)(CUmodule *, const void *);
    CUresult (*module_get_function)(CUfunction *, CUmodule, const char *);
    CUresult (*launch_kernel)(CUfunction, unsigned int, unsigned int,
                              unsigned int, unsigned int, unsigned int,
                              unsigned int, unsigned int, CUstream, void **,
                              void **);
    CUresult (*memset_d32)(CUdeviceptr, unsigned int, size_t);
    CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);
};
static struct api api;

/*
 * How each function is looked up: its exact exported name (dlsym method) and
 * its base name with the version cudart asks cuGetProcAddress for.
 * (cuCtxGetDevice is looked up like cudart does; only arraysize calls it.)
 */
struct function {
    const char *base;
    const char *versioned;
    int version;
    size_t offset; /* of the function pointer in struct api */
};
#define FN(base, versioned, version, field) \
    { #base, #versioned, version, offsetof(struct api, field) }
static const struct function g_functions[] = {
    FN(cuInit, cuInit, 2000, init),
    FN(cuDeviceGet, cuDeviceGet, 2000, device_get),
    FN(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, primary_ctx_retain),
    FN(cuCtxSetCurrent, cuCtxSetCurrent, 4000, ctx_set_current),
    FN(cuCtxGetDevice, cuCtxGetDevice, 2000, ctx_get_device),
    FN(cuMemAlloc, cuMemAlloc_v2, 3020, mem_alloc),
    FN(cuMemAllocPitch, cuMemAllocPitch_v2, 3020, mem_alloc_pitch),
    FN(cuMemAllocManaged, cuMemAllocManaged, 6000, mem_alloc_managed),
    FN(cuMemFree, cuMemFree_v2, 3020, mem_free),
    FN(cuMemGetInfo, cuMemGetInfo_v2, 3020, mem_get_info),
    FN(cuDeviceTotalMem, cuDeviceTotalMem_v2, 3020, device_total_mem),
    FN(cuCtxSynchronize, cuCtxSynchronize, 2000, ctx_synchronize),
    FN(cuStreamCreate, cuStreamCreate, 2000, stream_create),
    FN(cuStreamCreateWithPriority, cuStreamCreateWithPriority, 5050, stream_create_with_priority),
    FN(cuStreamBeginCapture, cuStreamBeginCapture_v2, 10010, stream_begin_capture),
    FN(cuStreamEndCapture, cuStreamEndCapture, 10000, stream_end_capture),
    FN(cuIpcGetMemHandle, cuIpcGetMemHandle, 4010, ipc_get_mem_handle),
    FN(cuCtxCreate, cuCtxCreate_v4, 12050, ctx_create),
    FN(cuCtxDestroy, cuCtxDestroy_v2, 4000, ctx_destroy),
    FN(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, 11000, primary_ctx_release),
    FN(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset_v2, 11000, primary_ctx_reset),
    FN(cuCtxEnablePeerAccess, cuCtxEnablePeerAccess, 4000, ctx_enable_peer_access),
    FN(cuMemGetAccess, cuMemGetAccess, 10020, mem_get_access),
};

/*
 * The functions of the newer commands (allocasync .. arraysize), obtained
 * only when the command line uses one (g_need_ext), so that the lookups of
 * other command lines stay as they were. Versions: those that introduced
 * each function.
 */
static const struct function g_ext_functions[] = {
    FN(cuMemAllocAsync, cuMemAllocAsync, 11020, mem_alloc_async),
    FN(cuMemFreeAsync, cuMemFreeAsync, 11020, mem_free_async),
    FN(cuMemPoolCreate, cuMemPoolCreate, 11020, mem_pool_create),
    FN(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, mem_alloc_from_pool_async),
    FN(cuMemCreate, cuMemCreate, 10020, mem_create),
    FN(cuMemRelease, cuMemRelease, 10020, mem_release),
    FN(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000, mem_retain_allocation_handle),
    FN(cuMemAddressReserve, cuMemAddressReserve, 10020, mem_address_reserve),
    FN(cuMemAddressFree, cuMemAddressFree, 10020, mem_address_free),
    FN(cuMemMap, cuMemMap, 10020, mem_map),
    FN(cuMemUnmap, cuMemUnmap, 10020, mem_unmap),
    FN(cuMemSetAccess, cuMemSetAccess, 10020, mem_set_access),
    FN(cuMemExportToShareableHandle, cuMemExportToShareableHandle, 10020, mem_export),
    FN(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, 10020, mem_import),
    FN(cuArrayCreate, cuArrayCreate_v2, 3020, array_create),
    FN(cuArray3DCreate, cuArray3DCreate_v2, 3020, array3d_create),
    FN(cuArrayDestroy, cuArrayDestroy, 2000, array_destroy),
    FN(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, mipmap_create),
    FN(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, mipmap_destroy),
    FN(cuArrayGetMemoryRequirements, cuArrayGetMemoryRequirements, 11060, array_requirements),
    FN(cuMipmappedArrayGetMemoryRequirements, cuMipmappedArrayGetMemoryRequirements, 11060, mipmap_requirements),
    FN(cuPointerGetAttribute, cuPointerGetAttribute, 4000, pointer_get_attribute),
    FN(cuMemGetAddressRange, cuMemGetAddressRange_v2, 3020, mem_get_address_range),
};

/* Whether the command line uses a command of g_ext_functions. */
static bool g_need_ext;

/*
 * The functions of the pool attribute, synchronisation and graph commands
 * (poolattr .. nvmlprocs), obtained only when the command line uses one
 * (g_need_graph). cuGraphInstantiate is asked for at 12000, where it has
 * cuGraphInstantiateWithFlags's ABI (the name CUDA 12 headers map it to).
 */
static const struct function g_graph_functions[] = {
    FN(cuMemPoolGetAttribute, cuMemPoolGetAttribute, 11020, mem_pool_get_attribute),
    FN(cuMemPoolSetAttribute, cuMemPoolSetAttribute, 11020, mem_pool_set_attribute),
    FN(cuMemPoolTrimTo, cuMemPoolTrimTo, 11020, mem_pool_trim_to),
    FN(cuMemPoolDestroy, cuMemPoolDestroy, 11020, mem_pool_destroy),
    FN(cuDeviceGetMemPool, cuDeviceGetMemPool, 11020, device_get_mem_pool),
    FN(cuDeviceSetMemPool, cuDeviceSetMemPool, 11020, device_set_mem_pool),
    FN(cuStreamSynchronize, cuStreamSynchronize, 2000, stream_synchronize),
    FN(cuStreamQuery, cuStreamQuery, 2000, stream_query),
    FN(cuEventCreate, cuEventCreate, 2000, event_create),
    FN(cuEventRecord, cuEventRecord, 2000, event_record),
    FN(cuEventQuery, cuEventQuery, 2000, event_query),
    FN(cuEventSynchronize, cuEventSynchronize, 2000, event_synchronize),
    FN(cuGraphCreate, cuGraphCreate, 10000, graph_create),
    FN(cuGraphDestroy, cuGraphDestroy, 10000, graph_destroy),
    FN(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, 11040, graph_add_mem_alloc_node),
    FN(cuGraphAddMemFreeNode, cuGraphAddMemFreeNode, 11040, graph_add_mem_free_node),
    FN(cuGraphGetNodes, cuGraphGetNodes, 10000, graph_get_nodes),
    FN(cuGraphNodeGetType, cuGraphNodeGetType, 10000, graph_node_get_type),
    FN(cuGraphInstantiate, cuGraphInstantiateWithFlags, 12000, graph_instantiate),
    FN(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 12000, graph_instantiate_with_params),
    FN(cuGraphExecDestroy, cuGraphExecDestroy, 10000, graph_exec_destroy),
    FN(cuGraphExecUpdate, cuGraphExecUpdate_v2, 12000, graph_exec_update),
    FN(cuGraphLaunch, cuGraphLaunch, 10000, graph_launch),
    FN(cuGraphUpload, cuGraphUpload, 11010, graph_upload),
    FN(cuDeviceGetGraphMemAttribute, cuDeviceGetGraphMemAttribute, 11040, device_get_graph_mem_attribute),
    FN(cuDeviceSetGraphMemAttribute, cuDeviceSetGraphMemAttribute, 11040, device_set_graph_mem_attribute),
    FN(cuDeviceGraphMemTrim, cuDeviceGraphMemTrim, 11040, device_graph_mem_trim),
};

/* Whether the command line uses a command of g_graph_functions. */
static bool g_need_graph;

/*
 * The functions of the kernel commands (kernel, kernel-launch, memset32,
 * read32), obtained only when the command line uses one (g_need_kernel).
 */
static const struct function g_kernel_functions[] = {
    FN(cuModuleLoadData, cuModuleLoadData, 2000, module_load_data),
    FN(cuModuleGetFunction, cuModuleGetFunction, 2000, module_get_function),
    FN(cuLaunchKernel, cuLaunchKernel, 4000, launch_kernel),
    FN(cuMemsetD32, cuMemsetD32_v2, 3020, memset_d32),
    FN(cuMemcpyDtoH, cuMemcpyDtoH_v2, 3020, memcpy_dtoh),
};

/* Whether the command line uses a command of g_kernel_functions. */
static bool g_need_kernel;

_Static_assert(sizeof(void *) == sizeof(void (*)(void)),
               "function pointers must fit in void *");

enum method { M_LINKED, M_DLSYM, M_PROCADDR, M_PROCADDR_LEGACY };
static enum method g_method;

static void *g_libcuda;                       /* dlopen handle */
static PFN_cuGetProcAddress_v2 g_resolver_v2; /* procaddr */
static PFN_cuGetProcAddress_v1 g_resolver_v1; /* procaddr-legacy */

/* The libcuda handle, opened on first use. */
static void *libcuda(void)
{
    if (g_libcuda == NULL) {
        g_libcuda = dlopen("libcuda.so.1", RTLD_NOW);
        if (g_libcuda == NULL)
            die(EXIT_UNAVAILABLE, "dlopen libcuda.so.1: %s", dlerror());
    }
    return g_libcuda;
}

/* Store a looked-up address into a function pointer field of api. */
static void set_fn(size_t offset, void *p)
{
    memcpy((char *)&api + offset, &p, sizeof p);
}

#ifdef CLIENT_LINKED
/*
 * Wrappers that call the driver directly, so each call is an ordinary call
 * through the PLT, resolved by the dynamic linker like in a linked program.
 */
static CUresult l_init(unsigned int f) { return cuInit(f); }
static CUresult l_device_get(CUdevice *d, int o) { return cuDeviceGet(d, o); }
static CUresult l_primary_ctx_retain(CUcontext *c, CUdevice d)
{
    return cuDevicePrimaryCtxRetain(c, d);
}
static CUresult l_ctx_set_current(CUcontext c) { return cuCtxSetCurrent(c); }
static CUresult l_ctx_get_device(CUdevice *d) { return cuCtxGetDevice(d); }
static CUresult l_mem_alloc(CUdeviceptr *p, size_t n)
{
    return cuMemAlloc_v2(p, n);
}
static CUresult l_mem_alloc_pitch(CUdeviceptr *p, size_t *pitch, size_t w,
                                  size_t h, unsigned int e)
{
    return cuMemAllocPitch_v2(p, pitch, w, h, e);
}
static CUresult l_mem_alloc_managed(CUdeviceptr *p, size_t n, unsigned int f)
{
    return cuMemAllocManaged(p, n, f);
}
static CUresult l_mem_free(CUdeviceptr p) { return cuMemFree_v2(p); }
static CUresult l_mem_get_info(size_t *f, size_t *t)
{
    return cuMemGetInfo_v2(f, t);
}
static CUresult l_device_total_mem(size_t *b, CUdevice d)
{
    return cuDeviceTotalMem_v2(b, d);
}
static CUresult l_ctx_synchronize(void) { return cuCtxSynchronize(); }
static CUresult l_stream_create(CUstream *s, unsigned int f)
{
    return cuStreamCreate(s, f);
}
static CUresult l_stream_create_with_priority(CUstream *s, unsigned int f, int p)
{
    return cuStreamCreateWithPriority(s, f, p);
}
static CUresult l_stream_begin_capture(CUstream s, CUstreamCaptureMode m)
{
    return cuStreamBeginCapture_v2(s, m);
}
static CUresult l_stream_end_capture(CUstream s, CUgraph *g)
{
    return cuStreamEndCapture(s, g);
}
static CUresult l_ipc_get_mem_handle(CUipcMemHandle *h, CUdeviceptr p)
{
    return cuIpcGetMemHandle(h, p);
}
static CUresult l_ctx_create(CUcontext *c, CUctxCreateParams *p,
                             unsigned int f, CUdevice d)
{
    return cuCtxCreate_v4(c, p, f, d);
}
static CUresult l_ctx_destroy(CUcontext c) { return cuCtxDestroy_v2(c); }
static CUresult l_ctx_enable_peer_access(CUcontext c, unsigned int f)
{
    return cuCtxEnablePeerAccess(c, f);
}
static CUresult l_mem_get_access(unsigned long long *f,
                                 const CUmemLocation *l, CUdeviceptr p)
{
    return cuMemGetAccess(f, l, p);
}
static CUresult l_primary_ctx_release(CUdevice d)
{
    return cuDevicePrimaryCtxRelease_v2(d);
}
static CUresult l_primary_ctx_reset(CUdevice d)
{
    return cuDevicePrimaryCtxReset_v2(d);
}
static CUresult l_mem_alloc_async(CUdeviceptr *p, size_t n, CUstream s)
{
    return cuMemAllocAsync(p, n, s);
}
static CUresult l_mem_free_async(CUdeviceptr p, CUstream s)
{
    return cuMemFreeAsync(p, s);
}
static CUresult l_mem_pool_create(CUmemoryPool *m, const CUmemPoolProps *p)
{
    return cuMemPoolCreate(m, p);
}
static CUresult l_mem_alloc_from_pool_async(CUdeviceptr *p, size_t n,
                                            CUmemoryPool m, CUstream s)
{
    return cuMemAllocFromPoolAsync(p, n, m, s);
}
static CUresult l_mem_create(CUmemGenericAllocationHandle *h, size_t n,
                             const CUmemAllocationProp *p, unsigned long long f)
{
    return cuMemCreate(h, n, p, f);
}
static CUresult l_mem_release(CUmemGenericAllocationHandle h)
{
    return cuMemRelease(h);
}
static CUresult l_mem_retain_allocation_handle(CUmemGenericAllocationHandle *h,
                                               void *a)
{
    return cuMemRetainAllocationHandle(h, a);
}
static CUresult l_mem_address_reserve(CUdeviceptr *p, size_t n, size_t a,
                                      CUdeviceptr h, unsigned long long f)
{
    return cuMemAddressReserve(p, n, a, h, f);
}
static CUresult l_mem_address_free(CUdeviceptr p, size_t n)
{
    return cuMemAddressFree(p, n);
}
static CUresult l_mem_map(CUdeviceptr p, size_t n, size_t o,
                          CUmemGenericAllocationHandle h, unsigned long long f)
{
    return cuMemMap(p, n, o, h, f);
}
static CUresult l_mem_unmap(CUdeviceptr p, size_t n)
{
    return cuMemUnmap(p, n);
}
static CUresult l_mem_set_access(CUdeviceptr p, size_t n,
                                 const CUmemAccessDesc *d, size_t c)
{
    return cuMemSetAccess(p, n, d, c);
}
static CUresult l_mem_export(void *s, CUmemGenericAllocationHandle h,
                             CUmemAllocationHandleType t, unsigned long long f)
{
    return cuMemExportToShareableHandle(s, h, t, f);
}
static CUresult l_mem_import(CUmemGenericAllocationHandle *h, void *o,
                             CUmemAllocationHandleType t)
{
    return cuMemImportFromShareableHandle(h, o, t);
}
static CUresult l_array_create(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
    return cuArrayCreate_v2(a, d);
}
static CUresult l_array3d_create(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    return cuArray3DCreate_v2(a, d);
}
static CUresult l_array_destroy(CUarray a) { return cuArrayDestroy(a); }
static CUresult l_mipmap_create(CUmipmappedArray *a,
                                const CUDA_ARRAY3D_DESCRIPTOR *d,
                                unsigned int l)
{
    return cuMipmappedArrayCreate(a, d, l);
}
static CUresult l_mipmap_destroy(CUmipmappedArray a)
{
    return cuMipmappedArrayDestroy(a);
}
static CUresult l_array_requirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *r,
                                     CUarray a, CUdevice d)
{
    return cuArrayGetMemoryRequirements(r, a, d);
}
static CUresult l_mipmap_requirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *r,
                                      CUmipmappedArray a, CUdevice d)
{
    return cuMipmappedArrayGetMemoryRequirements(r, a, d);
}
static CUresult l_pointer_get_attribute(void *data, CUpointer_attribute a,
                                        CUdeviceptr p)
{
    return cuPointerGetAttribute(data, a, p);
}
static CUresult l_mem_get_address_range(CUdeviceptr *base, size_t *size,
                                        CUdeviceptr p)
{
    return cuMemGetAddressRange_v2(base, size, p);
}

static CUresult l_mem_pool_get_attribute(CUmemoryPool m, CUmemPool_attribute a,
                                         void *v)
{
    return cuMemPoolGetAttribute(m, a, v);
}
static CUresult l_mem_pool_set_attribute(CUmemoryPool m, CUmemPool_attribute a,
                                         void *v)
{
    return cuMemPoolSetAttribute(m, a, v);
}
static CUresult l_mem_pool_trim_to(CUmemoryPool m, size_t n)
{
    return cuMemPoolTrimTo(m, n);
}
static CUresult l_mem_pool_destroy(CUmemoryPool m)
{
    return cuMemPoolDestroy(m);
}
static CUresult l_device_get_mem_pool(CUmemoryPool *m, CUdevice d)
{
    return cuDeviceGetMemPool(m, d);
}
static CUresult l_device_set_mem_pool(CUdevice d, CUmemoryPool m)
{
    return cuDeviceSetMemPool(d, m);
}
static CUresult l_stream_synchronize(CUstream s)
{
    return cuStreamSynchronize(s);
}
static CUresult l_stream_query(CUstream s) { return cuStreamQuery(s); }
static CUresult l_event_create(CUevent *e, unsigned int f)
{
    return cuEventCreate(e, f);
}
static CUresult l_event_record(CUevent e, CUstream s)
{
    return cuEventRecord(e, s);
}
static CUresult l_event_query(CUevent e) { return cuEventQuery(e); }
static CUresult l_event_synchronize(CUevent e)
{
    return cuEventSynchronize(e);
}
static CUresult l_graph_create(CUgraph *g, unsigned int f)
{
    return cuGraphCreate(g, f);
}
static CUresult l_graph_destroy(CUgraph g) { return cuGraphDestroy(g); }
static CUresult l_graph_add_mem_alloc_node(CUgraphNode *n, CUgraph g,
                                           const CUgraphNode *d, size_t nd,
                                           CUDA_MEM_ALLOC_NODE_PARAMS *p)
{
    return cuGraphAddMemAllocNode(n, g, d, nd, p);
}
static CUresult l_graph_add_mem_free_node(CUgraphNode *n, CUgraph g,
                                          const CUgraphNode *d, size_t nd,
                                          CUdeviceptr p)
{
    return cuGraphAddMemFreeNode(n, g, d, nd, p);
}
static CUresult l_graph_get_nodes(CUgraph g, CUgraphNode *n, size_t *c)
{
    return cuGraphGetNodes(g, n, c);
}
static CUresult l_graph_node_get_type(CUgraphNode n, CUgraphNodeType *t)
{
    return cuGraphNodeGetType(n, t);
}
static CUresult l_graph_instantiate(CUgraphExec *e, CUgraph g,
                                    unsigned long long f)
{
    return cuGraphInstantiateWithFlags(e, g, f);
}
static CUresult l_graph_instantiate_with_params(CUgraphExec *e, CUgraph g,
                                                CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    return cuGraphInstantiateWithParams(e, g, p);
}
static CUresult l_graph_exec_destroy(CUgraphExec e)
{
    return cuGraphExecDestroy(e);
}
static CUresult l_graph_exec_update(CUgraphExec e, CUgraph g,
                                    CUgraphExecUpdateResultInfo *i)
{
    return cuGraphExecUpdate_v2(e, g, i);
}
static CUresult l_graph_launch(CUgraphExec e, CUstream s)
{
    return cuGraphLaunch(e, s);
}
static CUresult l_graph_upload(CUgraphExec e, CUstream s)
{
    return cuGraphUpload(e, s);
}
static CUresult l_device_get_graph_mem_attribute(CUdevice d,
                                                 CUgraphMem_attribute a,
                                                 void *v)
{
    return cuDeviceGetGraphMemAttribute(d, a, v);
}
static CUresult l_device_set_graph_mem_attribute(CUdevice d,
                                                 CUgraphMem_attribute a,
                                                 void *v)
{
    return cuDeviceSetGraphMemAttribute(d, a, v);
}
static CUresult l_device_graph_mem_trim(CUdevice d)
{
    return cuDeviceGraphMemTrim(d);
}

static CUresult l_module_load_data(CUmodule *m, const void *i)
{
    return cuModuleLoadData(m, i);
}
static CUresult l_module_get_function(CUfunction *f, CUmodule m,
                                      const char *n)
{
    return cuModuleGetFunction(f, m, n);
}
static CUresult l_launch_kernel(CUfunction f, unsigned int gx, unsigned int gy,
                                unsigned int gz, unsigned int bx,
                                unsigned int by, unsigned int bz,
                                unsigned int sh, CUstream s, void **p,
                                void **e)
{
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, sh, s, p, e);
}
static CUresult l_memset_d32(CUdeviceptr d, unsigned int v, size_t n)
{
    return cuMemsetD32_v2(d, v, n);
}
static CUresult l_memcpy_dtoh(void *h, CUdeviceptr s, size_t n)
{
    return cuMemcpyDtoH_v2(h, s, n);
}

static void setup_linked(void)
{
    api = (struct api){
        .init = l_init,
        .device_get = l_device_get,
        .primary_ctx_retain = l_primary_ctx_retain,
        .ctx_set_current = l_ctx_set_current,
        .ctx_get_device = l_ctx_get_device,
        .mem_alloc = l_mem_alloc,
        .mem_alloc_pitch = l_mem_alloc_pitch,
        .mem_alloc_managed = l_mem_alloc_managed,
        .mem_free = l_mem_free,
        .mem_get_info = l_mem_get_info,
        .device_total_mem = l_device_total_mem,
        .ctx_synchronize = l_ctx_synchronize,
        .stream_create = l_stream_create,
        .stream_create_with_priority = l_stream_create_with_priority,
        .stream_begin_capture = l_stream_begin_capture,
        .stream_end_capture = l_stream_end_capture,
        .ipc_get_mem_handle = l_ipc_get_mem_handle,
        .ctx_create = l_ctx_create,
        .ctx_destroy = l_ctx_destroy,
        .primary_ctx_release = l_primary_ctx_release,
        .primary_ctx_reset = l_primary_ctx_reset,
        .ctx_enable_peer_access = l_ctx_enable_peer_access,
        .mem_get_access = l_mem_get_access,
        .mem_alloc_async = l_mem_alloc_async,
        .mem_free_async = l_mem_free_async,
        .mem_pool_create = l_mem_pool_create,
        .mem_alloc_from_pool_async = l_mem_alloc_from_pool_async,
        .mem_create = l_mem_create,
        .mem_release = l_mem_release,
        .mem_retain_allocation_handle = l_mem_retain_allocation_handle,
        .mem_address_reserve = l_mem_address_reserve,
        .mem_address_free = l_mem_address_free,
        .mem_map = l_mem_map,
        .mem_unmap = l_mem_unmap,
        .mem_set_access = l_mem_set_access,
        .mem_export = l_mem_export,
        .mem_import = l_mem_import,
        .array_create = l_array_create,
        .array3d_create = l_array3d_create,
        .array_destroy = l_array_destroy,
        .mipmap_create = l_mipmap_create,
        .mipmap_destroy = l_mipmap_destroy,
        .array_requirements = l_array_requirements,
        .mipmap_requirements = l_mipmap_requirements,
        .pointer_get_attribute = l_pointer_get_attribute,
        .mem_get_address_range = l_mem_get_address_range,
        .mem_pool_get_attribute = l_mem_pool_get_attribute,
        .mem_pool_set_attribute = l_mem_pool_set_attribute,
        .mem_pool_trim_to = l_mem_pool_trim_to,
        .mem_pool_destroy = l_mem_pool_destroy,
        .device_get_mem_pool = l_device_get_mem_pool,
        .device_set_mem_pool = l_device_set_mem_pool,
        .stream_synchronize = l_stream_synchronize,
        .stream_query = l_stream_query,
        .event_create = l_event_create,
        .event_record = l_event_record,
        .event_query = l_event_query,
        .event_synchronize = l_event_synchronize,
        .graph_create = l_graph_create,
        .graph_destroy = l_graph_destroy,
        .graph_add_mem_alloc_node = l_graph_add_mem_alloc_node,
        .graph_add_mem_free_node = l_graph_add_mem_free_node,
        .graph_get_nodes = l_graph_get_nodes,
        .graph_node_get_type = l_graph_node_get_type,
        .graph_instantiate = l_graph_instantiate,
        .graph_instantiate_with_params = l_graph_instantiate_with_params,
        .graph_exec_destroy = l_graph_exec_destroy,
        .graph_exec_update = l_graph_exec_update,
        .graph_launch = l_graph_launch,
        .graph_upload = l_graph_upload,
        .device_get_graph_mem_attribute = l_device_get_graph_mem_attribute,
        .device_set_graph_mem_attribute = l_device_set_graph_mem_attribute,
        .device_graph_mem_trim = l_device_graph_mem_trim,
        .module_load_data = l_module_load_data,
        .module_get_function = l_module_get_function,
        .launch_kernel = l_launch_kernel,
        .memset_d32 = l_memset_d32,
        .memcpy_dtoh = l_memcpy_dtoh,
    };
}
#endif

#define COUNT(table) (sizeof(table) / sizeof(table)[0])

static void dlsym_functions(const struct function *fns, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        void *p = dlsym(libcuda(), fns[i].versioned);
        if (p == NULL)
            die(EXIT_UNAVAILABLE, "dlsym %s: %s", fns[i].versioned, dlerror());
        set_fn(fns[i].offset, p);
    }
}

static void setup_dlsym(void)
{
    dlsym_functions(g_functions, COUNT(g_functions));
    if (g_need_ext)
        dlsym_functions(g_ext_functions, COUNT(g_ext_functions));
    if (g_need_graph)
        dlsym_functions(g_graph_functions, COUNT(g_graph_functions));
    if (g_need_kernel)
        dlsym_functions(g_kernel_functions, COUNT(g_kernel_functions));
}

/*
 * Look base up through the resolver the client holds. status may be NULL
 * (and is never written by the legacy resolver).
 */
static CUresult lookup(const char *base, void **pfn, int version,
                       cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    if (g_method == M_PROCADDR)
        return g_resolver_v2(base, pfn, version, flags, status);
    return g_resolver_v1(base, pfn, version, flags);
}

/* Look fns up; alternate NULL and non-NULL symbolStatus. */
static void resolve_functions(const struct function *fns, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        bool want_status = i % 2 == 0;
        CUdriverProcAddressQueryResult status = -1;
        void *p = NULL;
        CUresult rc = lookup(fns[i].base, &p, fns[i].version, 0,
                             want_status ? &status : NULL);
        if (rc != CUDA_SUCCESS || p == NULL ||
            (want_status && g_method == M_PROCADDR &&
             status != CU_GET_PROC_ADDRESS_SUCCESS))
            die(EXIT_UNAVAILABLE,
                "cuGetProcAddress(\"%s\", %d): rc=%d status=%d ptr=%p",
                fns[i].base, fns[i].version, rc, status, p);
        set_fn(fns[i].offset, p);
    }
}

static void setup_procaddr(void)
{
    void *p = NULL;
    CUresult rc;
    CUdriverProcAddressQueryResult status = -1;

    /* Find the resolver by name, then ask it for itself, like cudart. */
    if (g_method == M_PROCADDR) {
        PFN_cuGetProcAddress_v2 first;
        void *sym = dlsym(libcuda(), "cuGetProcAddress_v2");
        if (sym == NULL)
            die(EXIT_UNAVAILABLE, "dlsym cuGetProcAddress_v2: %s", dlerror());
        memcpy(&first, &sym, sizeof sym);
        rc = first("cuGetProcAddress", &p, 12000, 0, &status);
        memcpy(&g_resolver_v2, &p, sizeof p);
    } else {
        PFN_cuGetProcAddress_v1 first;
        void *sym = dlsym(libcuda(), "cuGetProcAddress");
        if (sym == NULL)
            die(EXIT_UNAVAILABLE, "dlsym cuGetProcAddress: %s", dlerror());
        memcpy(&first, &sym, sizeof sym);
        rc = first("cuGetProcAddress", &p, 11030, 0);
        memcpy(&g_resolver_v1, &p, sizeof p);
    }
    if (rc != CUDA_SUCCESS || p == NULL)
        die(EXIT_UNAVAILABLE, "resolving cuGetProcAddress itself: rc=%d status=%d",
            rc, status);

    resolve_functions(g_functions, COUNT(g_functions));
    if (g_need_ext)
        resolve_functions(g_ext_functions, COUNT(g_ext_functions));
    if (g_need_graph)
        resolve_functions(g_graph_functions, COUNT(g_graph_functions));
    if (g_need_kernel)
        resolve_functions(g_kernel_functions, COUNT(g_kernel_functions));
}

/* ---- Helpers ------------------------------------------------------------- */

/* Basename of the object that contains p: "null" for NULL, "?" if unknown. */
static const char *lib_of(const void *p)
{
    Dl_info info;
    if (p == NULL)
        return "null";
    if (dladdr(p, &info) == 0 || info.dli_fname == NULL ||
        info.dli_fname[0] == '\0')
        return "?";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash != NULL ? slash + 1 : info.dli_fname;
}

/* A byte count: digits with an optional K, M or G suffix (powers of 1024). */
static size_t parse_size(const char *s)
{
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9')
        die(EXIT_USAGE, "bad size '%s'", s);
    unsigned long long v = strtoull(s, &end, 10);
    unsigned shift = 0;
    switch (*end) {
    case 'K': case 'k': shift = 10; end++; break;
    case 'M': case 'm': shift = 20; end++; break;
    case 'G': case 'g': shift = 30; end++; break;
    default: break;
    }
    if (errno != 0 || *end != '\0' || v > (SIZE_MAX >> shift))
        die(EXIT_USAGE, "bad size '%s'", s);
    return (size_t)v << shift;
}

/* A non-negative decimal integer no larger than max. */
static long parse_uint(const char *s, long max, const char *what)
{
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9')
        die(EXIT_USAGE, "bad %s '%s'", what, s);
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v > max)
        die(EXIT_USAGE, "bad %s '%s'", what, s);
    return v;
}

/* An unsigned number in decimal, or hex with 0x (base auto-detected). */
static unsigned long long parse_ull(const char *s, int base, const char *what)
{
    char *end;
    errno = 0;
    if (*s == '-' || *s == '\0')
        die(EXIT_USAGE, "bad %s '%s'", what, s);
    unsigned long long v = strtoull(s, &end, base);
    if (errno != 0 || *end != '\0')
        die(EXIT_USAGE, "bad %s '%s'", what, s);
    return v;
}

/* A CUDA version number (e.g. 12000); negative values are allowed. */
static int parse_version(const char *s)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || *s == '\0' || v < -1000000 || v > 1000000)
        die(EXIT_USAGE, "bad version '%s'", s);
    return (int)v;
}

/* ---- Slots: remembered allocations ------------------------------------- */

/*
 * items, a growable array of n elements of elem bytes with room for *cap,
 * with room for one more (realloc'ed, doubling from 64, when full).
 */
static void *room_for_one(void *items, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap)
        return items;
    size_t grown = *cap ? *cap * 2 : 64;
    void *p = realloc(items, grown * elem);
    if (p == NULL)
        die(EXIT_SOFTWARE, "out of memory");
    *cap = grown;
    return p;
}

struct slot {
    CUdeviceptr ptr;
    bool live; /* allocated and not yet freed successfully */
};
static struct slot *g_slots;
static size_t g_nslots, g_slots_cap;

/* Remember ptr in the next slot and return the slot's number. */
static size_t add_slot(CUdeviceptr ptr)
{
    g_slots = room_for_one(g_slots, g_nslots, &g_slots_cap, sizeof *g_slots);
    g_slots[g_nslots] = (struct slot){ .ptr = ptr, .live = true };
    return g_nslots++;
}

/* A slot number, "N" or "#N"; its existence is checked when run. */
static size_t parse_slot(const char *arg)
{
    const char *s = arg[0] == '#' ? arg + 1 : arg;
    return (size_t)parse_uint(s, 1L << 40, "slot");
}

/* Slot n, which must exist by now (else a usage error). */
static struct slot *slot(size_t n)
{
    if (n >= g_nslots)
        die(EXIT_USAGE, "no slot #%zu", n);
    return &g_slots[n];
}

/* cuMemCreate handles (%SLOT), with what vmmmap did with them. */
struct hslot {
    CUmemGenericAllocationHandle handle;
    size_t size; /* of the allocation, as far as the client knows */
    CUdeviceptr va; /* where vmmmap mapped it; 0 if not mapped */
};
static struct hslot *g_hslots;
static size_t g_nhslots, g_hslots_cap;

/* Remember handle h of size bytes in the next handle slot; its number. */
static size_t add_hslot(CUmemGenericAllocationHandle h, size_t size)
{
    g_hslots = room_for_one(g_hslots, g_nhslots, &g_hslots_cap,
                            sizeof *g_hslots);
    g_hslots[g_nhslots] = (struct hslot){ .handle = h, .size = size };
    return g_nhslots++;
}

/* Handle slot n, which must exist by now (else a usage error). */
static struct hslot *hslot(size_t n)
{
    if (n >= g_nhslots)
        die(EXIT_USAGE, "no handle slot %%%zu", n);
    return &g_hslots[n];
}

/* Arrays and mipmapped arrays (@SLOT). */
struct aslot {
    bool mipmap;
    CUarray array;
    CUmipmappedArray mip;
};
static struct aslot *g_aslots;
static size_t g_naslots, g_aslots_cap;

static size_t add_aslot(struct aslot a)
{
    g_aslots = room_for_one(g_aslots, g_naslots, &g_aslots_cap, sizeof *g_aslots);
    g_aslots[g_naslots] = a;
    return g_naslots++;
}

/* Array slot n, which must exist by now (else a usage error). */
static struct aslot *aslot(size_t n)
{
    if (n >= g_naslots)
        die(EXIT_USAGE, "no array slot @%zu", n);
    return &g_aslots[n];
}

/* A slot number with an optional one-character prefix ('#', '%' or '@'). */
static size_t parse_prefixed(const char *arg, char prefix, const char *what)
{
    const char *s = arg[0] == prefix ? arg + 1 : arg;
    return (size_t)parse_uint(s, 1L << 40, what);
}

/*
 * A device pointer argument: "%N", where "vmmmap" mapped handle slot N, or
 * a slot ("#N" or "N"), whose pointer it is. Looked at only when the
 * command runs; *label is what the command prints for it.
 */
static CUdeviceptr ptr_arg(const char *arg, char label[32])
{
    if (arg[0] == '%') {
        size_t n = parse_prefixed(arg, '%', "handle slot");
        snprintf(label, 32, "%%%zu", n);
        return hslot(n)->va;
    }
    size_t n = parse_slot(arg);
    snprintf(label, 32, "#%zu", n);
    return slot(n)->ptr;
}

/* ---- Contexts ------------------------------------------------------------ */

/* Primary contexts retained so far, by device ordinal. */
static CUcontext g_ctx[MAX_CACHED_DEVICES];

/* The context from the last "ctxcreate" and the stream from "stream". */
static CUcontext g_created_ctx;
static CUstream g_stream;
/* The client's event ("event"), or NULL. */
static CUevent g_event;

/* The pool from "pool"; the fd and size from the last "vmmexport". */
static CUmemoryPool g_pool;

/* The graph "graphalloc" builds, the one the last "capture-end" gave, and
   the executable graph from "instantiate" (NULL until then). */
static CUgraph g_graph, g_captured;
static CUgraphExec g_exec;
static CUfunction g_func; /* the function "kernel" obtained */
static int g_exported_fd = -1;
static size_t g_exported_size;

/* Device ordinal's primary context, retained once; CUDA_SUCCESS or error. */
static CUresult primary_ctx(int ordinal, CUcontext *ctx)
{
    if (ordinal < MAX_CACHED_DEVICES && g_ctx[ordinal] != NULL) {
        *ctx = g_ctx[ordinal];
        return CUDA_SUCCESS;
    }
    CUdevice dev;
    CUresult rc = api.device_get(&dev, ordinal);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = api.primary_ctx_retain(ctx, dev);
    if (rc == CUDA_SUCCESS && ordinal < MAX_CACHED_DEVICES)
        g_ctx[ordinal] = *ctx;
    return rc;
}

/* Make device ordinal's primary context current. */
static CUresult make_current(int ordinal)
{
    CUcontext ctx;
    CUresult rc = primary_ctx(ordinal, &ctx);
    return rc != CUDA_SUCCESS ? rc : api.ctx_set_current(ctx);
}

/* ---- threads ---------------------------------------------------------- */

struct worker {
    pthread_t thread;
    unsigned index;
    long iters;
    size_t max_mib;
    CUcontext ctx;
    unsigned long ok, oom, other;
};

static uint64_t xorshift64(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

static void count_rc(struct worker *w, CUresult rc)
{
    if (rc == CUDA_ERROR_OUT_OF_MEMORY)
        w->oom++;
    else if (rc != CUDA_SUCCESS)
        w->other++;
}

/* Iterations done by every worker, for churnlimit. */
static atomic_long g_iterations;

/*
 * The workers' first allocations (at most four each) are all made before
 * any is freed: a barrier of every worker, so that the cap is contended
 * however the threads are scheduled (16 workers fill about 544 MiB).
 */
static pthread_barrier_t g_filled;

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    uint64_t rng = 0x9e3779b97f4a7c15ULL * (w->index + 1);
    CUdeviceptr live[4];
    unsigned nlive = 0;
    long fill = w->iters < 4 ? w->iters : 4;

    api.ctx_set_current(w->ctx);
    for (long it = 0; it < w->iters; it++) {
        if (it == fill)
            pthread_barrier_wait(&g_filled);
        if (nlive == 4) {
            unsigned victim = (unsigned)(xorshift64(&rng) % 4);
            CUresult rc = api.mem_free(live[victim]);
            if (rc != CUDA_SUCCESS)
                w->other++;
            live[victim] = live[--nlive];
        }
        atomic_fetch_add(&g_iterations, 1);
        size_t size = (size_t)(xorshift64(&rng) % w->max_mib + 1) * MIB;
        CUdeviceptr p;
        CUresult rc = api.mem_alloc(&p, size);
        if (rc == CUDA_SUCCESS) {
            w->ok++;
            live[nlive++] = p;
        } else {
            count_rc(w, rc);
        }
    }
    if (fill == w->iters)
        pthread_barrier_wait(&g_filled);
    while (nlive > 0) {
        if (api.mem_free(live[--nlive]) != CUDA_SUCCESS)
            w->other++;
    }
    return NULL;
}

/*
 * churnlimit: the workers of cmd_threads, and meanwhile, once a quarter of
 * their iterations are done, the main thread lowers device 0's cap to
 * `low` through vramcap_set_limit and from then on has the stand-in count
 * every charge that takes the device past `low` (vramcap_standin_watch).
 */
static void cmd_churnlimit(long nthreads, long iters, size_t max_size, size_t low)
{
    int (*set)(int, uint64_t) =
        (int (*)(int, uint64_t))dlsym(RTLD_DEFAULT, "vramcap_set_limit");
    unsigned long (*watch)(int, size_t) =
        (unsigned long (*)(int, size_t))dlsym(libcuda(), "vramcap_standin_watch");
    if (set == NULL || watch == NULL) {
        out("churnlimit -> unavailable");
        return;
    }
    struct worker *w = calloc((size_t)nthreads, sizeof *w);
    if (w == NULL)
        die(EXIT_SOFTWARE, "out of memory");
    CUcontext ctx = NULL;
    primary_ctx(0, &ctx);
    atomic_store(&g_iterations, 0);
    pthread_barrier_init(&g_filled, NULL, (unsigned)nthreads);
    for (long i = 0; i < nthreads; i++) {
        w[i].index = (unsigned)i;
        w[i].iters = iters;
        w[i].max_mib = max_size / MIB;
        w[i].ctx = ctx;
        int err = pthread_create(&w[i].thread, NULL, worker_main, &w[i]);
        if (err != 0)
            die(EXIT_SOFTWARE, "pthread_create: %s", strerror(err));
    }
    while (atomic_load(&g_iterations) < nthreads * iters / 4)
        sched_yield();
    int rc = set(0, (uint64_t)low);
    watch(0, low);
    unsigned long ok = 0, oom = 0, other = 0;
    for (long i = 0; i < nthreads; i++) {
        pthread_join(w[i].thread, NULL);
        ok += w[i].ok;
        oom += w[i].oom;
        other += w[i].other;
    }
    unsigned long past = watch(0, 0);
    pthread_barrier_destroy(&g_filled);
    free(w);
    out("churnlimit -> rc=%d past=%lu other=%lu oom=%s", rc, past, other, oom > 0 ? "some" : "none");
    (void)ok;
}

static void cmd_threads(long nthreads, long iters, size_t max_size)
{
    struct worker *w = calloc((size_t)nthreads, sizeof *w);
    if (w == NULL)
        die(EXIT_SOFTWARE, "out of memory");
    CUcontext ctx = NULL;
    primary_ctx(0, &ctx); /* on failure the workers report the errors */

    pthread_barrier_init(&g_filled, NULL, (unsigned)nthreads);
    for (long i = 0; i < nthreads; i++) {
        w[i].index = (unsigned)i;
        w[i].iters = iters;
        w[i].max_mib = max_size / MIB;
        w[i].ctx = ctx;
        int err = pthread_create(&w[i].thread, NULL, worker_main, &w[i]);
        if (err != 0)
            die(EXIT_SOFTWARE, "pthread_create: %s", strerror(err));
    }
    unsigned long ok = 0, oom = 0, other = 0;
    for (long i = 0; i < nthreads; i++) {
        pthread_join(w[i].thread, NULL);
        ok += w[i].ok;
        oom += w[i].oom;
        other += w[i].other;
    }
    pthread_barrier_destroy(&g_filled);
    free(w);
    out("threads -> ok=%lu oom=%lu other=%lu", ok, oom, other);
}

/* ---- fork ------------------------------------------------------------- */

static volatile int g_stop_workers;

static void *busy_main(void *arg)
{
    struct worker *w = arg;
    uint64_t rng = 0x9e3779b97f4a7c15ULL * (w->index + 1);
    api.ctx_set_current(w->ctx);
    while (!g_stop_workers) {
        CUdeviceptr p;
        size_t size = (size_t)(xorshift64(&rng) % 4 + 1) * MIB;
        CUresult rc = api.mem_alloc(&p, size);
        if (rc == CUDA_SUCCESS) {
            w->ok++;
            if (api.mem_free(p) != CUDA_SUCCESS)
                w->other++;
        } else {
            count_rc(w, rc);
        }
    }
    return NULL;
}

/* Waits up to 10 s for a child; 1 when it exited with status 0. */
static int reap_child(pid_t pid)
{
    for (int i = 0; i < 10000; i++) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return WIFEXITED(status) && WEXITSTATUS(status) == 0;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static void cmd_forkbusy(long nthreads, long nforks)
{
    struct worker *w = calloc((size_t)nthreads, sizeof *w);
    if (w == NULL)
        die(EXIT_SOFTWARE, "out of memory");
    CUcontext ctx = NULL;
    primary_ctx(0, &ctx);
    g_stop_workers = 0;
    for (long i = 0; i < nthreads; i++) {
        w[i].index = (unsigned)i;
        w[i].ctx = ctx;
        int err = pthread_create(&w[i].thread, NULL, busy_main, &w[i]);
        if (err != 0)
            die(EXIT_SOFTWARE, "pthread_create: %s", strerror(err));
    }
    void *handle = libcuda();
    fflush(stdout);
    long ok = 0, hung = 0;
    for (long f = 0; f < nforks; f++) {
        pid_t pid = fork();
        if (pid < 0)
            die(EXIT_SOFTWARE, "fork: %s", strerror(errno));
        if (pid == 0) {
            void *sym = dlsym(handle, "cuMemAlloc_v2");
            _exit(sym != NULL ? 0 : 3);
        }
        int r = reap_child(pid);
        ok += r == 1;
        hung += r < 0;
    }
    g_stop_workers = 1;
    for (long i = 0; i < nthreads; i++)
        pthread_join(w[i].thread, NULL);
    free(w);
    out("forkbusy -> forks=%ld ok=%ld hung=%ld", nforks, ok, hung);
}

static void cmd_forkhold(void)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        die(EXIT_SOFTWARE, "fork: %s", strerror(errno));
    if (pid == 0) {
        for (;;)
            pause();
    }
    out("forkhold -> child %ld", (long)pid);
}

/* ---- Commands --------------------------------------------------------- */

/* Stand-in inspection exports, via dlsym on the libcuda handle. */
static void cmd_standin(void)
{
    void *h = libcuda();
    void *p_devices = dlsym(h, "vramcap_standin_devices");
    void *p_used = dlsym(h, "vramcap_standin_used");
    void *p_peak = dlsym(h, "vramcap_standin_peak");
    if (p_devices == NULL || p_used == NULL || p_peak == NULL) {
        out("standin -> unavailable");
        return;
    }
    int (*devices)(void);
    size_t (*used)(int), (*peak)(int);
    memcpy(&devices, &p_devices, sizeof p_devices);
    memcpy(&used, &p_used, sizeof p_used);
    memcpy(&peak, &p_peak, sizeof p_peak);
    for (int i = 0; i < devices(); i++)
        out("standin dev=%d used=%zu peak=%zu", i, used(i), peak(i));
}

/* Stand-in event counters (an extra beyond "standin"). */
static void cmd_counts(void)
{
    void *p = dlsym(libcuda(), "vramcap_standin_count");
    if (p == NULL) {
        out("counts -> unavailable");
        return;
    }
    unsigned long (*count)(const char *);
    memcpy(&count, &p, sizeof p);
    out("counts alloc=%lu free=%lu getprocaddress=%lu alias=%lu sync=%lu "
        "capture=%lu ipc=%lu async=%lu vmm=%lu vmm_host=%lu array=%lu "
        "host_bytes=%lu managed_host_bytes=%lu host_register=%lu event=%lu",
        count("alloc"), count("free"), count("getprocaddress"),
        count("alias"), count("sync"), count("capture"), count("ipc"),
        count("async"), count("vmm"), count("vmm_host"), count("array"),
        count("host_bytes"), count("managed_host_bytes"),
        count("host_register"), count("event"));
}

/* Where the stand-in accounts memory: per device, then pinned host memory. */
static void cmd_kinds(void)
{
    void *h = libcuda();
    void *p_devices = dlsym(h, "vramcap_standin_devices");
    void *p_used = dlsym(h, "vramcap_standin_used");
    void *p_managed_host = dlsym(h, "vramcap_standin_managed_host");
    void *p_count = dlsym(h, "vramcap_standin_count");
    if (p_devices == NULL || p_used == NULL || p_managed_host == NULL ||
        p_count == NULL) {
        out("kinds -> unavailable");
        return;
    }
    int (*devices)(void);
    size_t (*used)(int), (*managed_host)(int);
    unsigned long (*count)(const char *);
    memcpy(&devices, &p_devices, sizeof p_devices);
    memcpy(&used, &p_used, sizeof p_used);
    memcpy(&managed_host, &p_managed_host, sizeof p_managed_host);
    memcpy(&count, &p_count, sizeof p_count);
    for (int i = 0; i < devices(); i++)
        out("kinds dev=%d device=%zu managed_host=%zu", i, used(i),
            managed_host(i));
    out("kinds host=%lu", count("host_bytes"));
}

/* The stand-in's view of slot n's pointer. */
static void cmd_ptrkind(size_t n)
{
    void *p = dlsym(libcuda(), "vramcap_standin_kind");
    if (p == NULL) {
        out("ptrkind -> unavailable");
        return;
    }
    const char *(*kind)(CUdeviceptr);
    memcpy(&kind, &p, sizeof p);
    out("ptrkind #%zu = %s", n, kind(slot(n)->ptr));
}

/* ---- nvml ------------------------------------------------------------- */

/* The NVML functions "nvml" and "nvmlprocs" call, always found with dlsym. */
struct nvml_api {
    nvmlReturn_t (*init)(void);
    nvmlReturn_t (*shutdown)(void);
    nvmlReturn_t (*get_count)(unsigned int *);
    nvmlReturn_t (*get_handle)(unsigned int, nvmlDevice_t *);
    nvmlReturn_t (*get_uuid)(nvmlDevice_t, char *, unsigned int);
    nvmlReturn_t (*get_memory)(nvmlDevice_t, nvmlMemory_t *);
    nvmlReturn_t (*get_memory_v2)(nvmlDevice_t, nvmlMemory_v2_t *);
    nvmlReturn_t (*by_uuid)(const char *, nvmlDevice_t *);
    nvmlReturn_t (*procs)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
};

static const struct {
    const char *name;
    size_t offset; /* of the function pointer in struct nvml_api */
} g_nvml_functions[] = {
    { "nvmlInit_v2", offsetof(struct nvml_api, init) },
    { "nvmlShutdown", offsetof(struct nvml_api, shutdown) },
    { "nvmlDeviceGetCount_v2", offsetof(struct nvml_api, get_count) },
    { "nvmlDeviceGetHandleByIndex_v2", offsetof(struct nvml_api, get_handle) },
    { "nvmlDeviceGetUUID", offsetof(struct nvml_api, get_uuid) },
    { "nvmlDeviceGetMemoryInfo", offsetof(struct nvml_api, get_memory) },
    { "nvmlDeviceGetMemoryInfo_v2", offsetof(struct nvml_api, get_memory_v2) },
    { "nvmlDeviceGetHandleByUUID", offsetof(struct nvml_api, by_uuid) },
    { "nvmlDeviceGetComputeRunningProcesses_v3", offsetof(struct nvml_api, procs) },
};

/* Fills *nv from libnvidia-ml.so.1; false when it or a function is missing. */
static bool nvml_load(struct nvml_api *nv)
{
    static void *lib;
    if (lib == NULL)
        lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    for (size_t i = 0; lib != NULL && i < COUNT(g_nvml_functions); i++) {
        void *p = dlsym(lib, g_nvml_functions[i].name);
        if (p == NULL)
            return false;
        memcpy((char *)nv + g_nvml_functions[i].offset, &p, sizeof p);
    }
    return lib != NULL;
}

/* One line per device; see the top of the file. */
static void cmd_nvml(void)
{
    struct nvml_api nv;
    if (!nvml_load(&nv)) {
        out("nvml -> unavailable");
        return;
    }
    nvmlReturn_t rc = nv.init();
    if (rc != NVML_SUCCESS) {
        out("nvml -> %d", rc);
        return;
    }
    unsigned int count = 0;
    rc = nv.get_count(&count);
    if (rc != NVML_SUCCESS)
        out("nvml -> %d", rc);
    for (unsigned int i = 0; rc == NVML_SUCCESS && i < count; i++) {
        nvmlDevice_t dev;
        char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        nvmlMemory_t mem;
        nvmlMemory_v2_t mem2 = { .version = nvmlMemory_v2 };
        nvmlReturn_t drc = nv.get_handle(i, &dev);
        if (drc == NVML_SUCCESS)
            drc = nv.get_uuid(dev, uuid, sizeof uuid);
        if (drc == NVML_SUCCESS)
            drc = nv.get_memory(dev, &mem);
        if (drc == NVML_SUCCESS)
            drc = nv.get_memory_v2(dev, &mem2);
        if (drc != NVML_SUCCESS)
            out("nvml dev=%u -> %d", i, drc);
        else
            out("nvml dev=%u uuid=%s total=%llu free=%llu used=%llu "
                "v2total=%llu v2free=%llu v2used=%llu v2reserved=%llu",
                i, uuid, mem.total, mem.free, mem.used, mem2.total, mem2.free,
                mem2.used, mem2.reserved);
    }
    nv.shutdown();
}

static bool have_resolver(void)
{
    return g_method == M_PROCADDR || g_method == M_PROCADDR_LEGACY;
}

/* resolve / resolve4 NAME VERSION FLAGS */
static void cmd_resolve(const char *cmd, const char *name, int version,
                        cuuint64_t flags, bool with_status)
{
    if (!have_resolver()) {
        out("%s -> unsupported", cmd);
        return;
    }
    void *p = NULL;
    CUdriverProcAddressQueryResult status = 0; /* printed as is if unwritten */
    bool status_shown = with_status && g_method == M_PROCADDR;
    CUresult rc = lookup(name, &p, version, flags,
                         status_shown ? &status : NULL);
    char status_text[16] = "-";
    if (status_shown)
        snprintf(status_text, sizeof status_text, "%d", status);
    out("%s %s %d %llu -> %d status=%s lib=%s", cmd, name, version,
        (unsigned long long)flags, rc, status_text, lib_of(p));
}

/* batch-copy VERSION D S SIZE: resolve cuMemcpyBatchAsync for VERSION
 * (12080: the form with a failure index; 13000: without) and copy SIZE bytes
 * of slot S onto slot D with it, one copy, on the legacy stream. */
typedef CUresult (*batch12_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
                               void *, size_t *, size_t, size_t *, CUstream);
typedef CUresult (*batch13_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
                               void *, size_t *, size_t, CUstream);

static void cmd_batch_copy(int version, size_t d, size_t s, size_t size)
{
    if (!have_resolver()) {
        out("batch-copy -> unsupported");
        return;
    }
    void *p = NULL;
    CUresult rc = lookup("cuMemcpyBatchAsync", &p, version, 0, NULL);
    if (rc != CUDA_SUCCESS || p == NULL) {
        out("batch-copy %d -> %d (not resolved)", version, rc);
        return;
    }
    CUdeviceptr dsts[1] = { slot(d)->ptr }, srcs[1] = { slot(s)->ptr };
    size_t sizes[1] = { size }, idx[1] = { 0 }, fail = 99;
    unsigned char attrs[64] = { 0 }; /* opaque to the stand-in */
    if (version >= 13000) {
        batch13_fn f;
        memcpy(&f, &p, sizeof p);
        rc = f(dsts, srcs, sizes, 1, attrs, idx, 1, NULL);
        out("batch-copy %d #%zu #%zu -> %d lib=%s", version, d, s, rc, lib_of(p));
    } else {
        batch12_fn f;
        memcpy(&f, &p, sizeof p);
        rc = f(dsts, srcs, sizes, 1, attrs, idx, 1, &fail, NULL);
        out("batch-copy %d #%zu #%zu -> %d fail=%zu lib=%s", version, d, s, rc,
            fail, lib_of(p));
    }
}

/* array-copies @A #S: cuMemcpyAtoD and cuMemcpyDtoA as resolved for 3020,
 * 4 bytes between array A's start and slot S. */
static void cmd_array_copies(size_t a, size_t s)
{
    if (!have_resolver()) {
        out("array-copies -> unsupported");
        return;
    }
    void *atod = NULL, *dtoa = NULL;
    CUresult r1 = lookup("cuMemcpyAtoD", &atod, 3020, 0, NULL);
    CUresult r2 = lookup("cuMemcpyDtoA", &dtoa, 3020, 0, NULL);
    if (r1 != CUDA_SUCCESS || r2 != CUDA_SUCCESS || atod == NULL || dtoa == NULL) {
        out("array-copies -> %d %d (not resolved)", r1, r2);
        return;
    }
    CUresult (*to_dev)(CUdeviceptr, CUarray, size_t, size_t);
    CUresult (*to_array)(CUarray, size_t, CUdeviceptr, size_t);
    memcpy(&to_dev, &atod, sizeof atod);
    memcpy(&to_array, &dtoa, sizeof dtoa);
    CUarray arr = aslot(a)->array;
    CUresult rc1 = to_dev(slot(s)->ptr, arr, 0, 4);
    CUresult rc2 = to_array(arr, 0, slot(s)->ptr, 4);
    out("array-copies @%zu #%zu -> atod=%d dtoa=%d lib=%s,%s", a, s, rc1, rc2,
        lib_of(atod), lib_of(dtoa));
}

/* grid-launches: cuLaunch, cuLaunchGrid and cuLaunchGridAsync as resolved
 * for 2000, of the function "kernel" obtained. */
static void cmd_grid_launches(void)
{
    if (!have_resolver()) {
        out("grid-launches -> unsupported");
        return;
    }
    void *l = NULL, *g = NULL, *ga = NULL;
    CUresult r1 = lookup("cuLaunch", &l, 2000, 0, NULL);
    CUresult r2 = lookup("cuLaunchGrid", &g, 2000, 0, NULL);
    CUresult r3 = lookup("cuLaunchGridAsync", &ga, 2000, 0, NULL);
    if (r1 != CUDA_SUCCESS || r2 != CUDA_SUCCESS || r3 != CUDA_SUCCESS ||
        l == NULL || g == NULL || ga == NULL) {
        out("grid-launches -> %d %d %d (not resolved)", r1, r2, r3);
        return;
    }
    CUresult (*launch)(CUfunction);
    CUresult (*grid)(CUfunction, int, int);
    CUresult (*grid_async)(CUfunction, int, int, CUstream);
    memcpy(&launch, &l, sizeof l);
    memcpy(&grid, &g, sizeof g);
    memcpy(&grid_async, &ga, sizeof ga);
    CUresult a = launch(g_func), b = grid(g_func, 1, 1),
             c = grid_async(g_func, 1, 1, g_stream);
    out("grid-launches -> %d %d %d lib=%s,%s,%s", a, b, c, lib_of(l), lib_of(g),
        lib_of(ga));
}

/* call-resolved cuMemAlloc: resolve now, then allocate 1 MiB through it. */
static void cmd_call_resolved(const char *name)
{
    if (!have_resolver()) {
        out("call-resolved -> unsupported");
        return;
    }
    void *p = NULL;
    CUdriverProcAddressQueryResult status = -1;
    CUresult rc = lookup(name, &p, 3020, 0, &status);
    if (rc != CUDA_SUCCESS || p == NULL) {
        out("call-resolved %s -> unresolved rc=%d", name, rc);
        return;
    }
    CUresult (*alloc)(CUdeviceptr *, size_t);
    memcpy(&alloc, &p, sizeof p);
    CUdeviceptr ptr;
    rc = alloc(&ptr, MIB);
    if (rc == CUDA_SUCCESS)
        out("call-resolved %s -> %d #%zu", name, rc, add_slot(ptr));
    else
        out("call-resolved %s -> %d", name, rc);
}

/* Print "PREFIX -> RC #SLOT" or "PREFIX -> RC". */
static void report_alloc(const char *prefix, CUresult rc, CUdeviceptr ptr)
{
    if (rc == CUDA_SUCCESS)
        out("%s -> %d #%zu", prefix, rc, add_slot(ptr));
    else
        out("%s -> %d", prefix, rc);
}

/* ---- Pools, graphs and per-process NVML -------------------------------- */

/* An attribute name of poolattr / poolset / graphmem / graphmemset. */
struct attr_name {
    const char *name;
    int value;
};
static const struct attr_name g_pool_attrs[] = {
    { "threshold", CU_MEMPOOL_ATTR_RELEASE_THRESHOLD },
    { "reserved", CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT },
    { "reservedhigh", CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH },
    { "used", CU_MEMPOOL_ATTR_USED_MEM_CURRENT },
    { "usedhigh", CU_MEMPOOL_ATTR_USED_MEM_HIGH },
};
static const struct attr_name g_graph_attrs[] = {
    { "used", CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT },
    { "usedhigh", CU_GRAPH_MEM_ATTR_USED_MEM_HIGH },
    { "reserved", CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT },
    { "reservedhigh", CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH },
};

static int parse_attr(const char *s, const struct attr_name *names, size_t n,
                      const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(s, names[i].name) == 0)
            return names[i].value;
    die(EXIT_USAGE, "bad %s '%s'", what, s);
}

/* The current context's device, 0 if there is none. */
static CUdevice current_device(void)
{
    CUdevice dev = 0;
    if (api.ctx_get_device(&dev) != CUDA_SUCCESS)
        dev = 0;
    return dev;
}

/* The client's pool ("pool"), else the current device's current pool. */
static CUmemoryPool client_pool(void)
{
    CUmemoryPool pool = g_pool;
    if (pool == NULL && api.device_get_mem_pool(&pool, current_device()) !=
                            CUDA_SUCCESS)
        pool = NULL;
    return pool;
}

/* The graph "graphalloc" built, else the last captured one (maybe NULL). */
static CUgraph client_graph(void)
{
    return g_graph != NULL ? g_graph : g_captured;
}

/* graphalloc SIZE: an allocation node on the current device. */
static void cmd_graphalloc(size_t size)
{
    CUresult rc = CUDA_SUCCESS;
    if (g_graph == NULL)
        rc = api.graph_create(&g_graph, 0);
    CUdevice dev = current_device();
    CUmemAccessDesc access = {
        .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev },
        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    CUDA_MEM_ALLOC_NODE_PARAMS params = {
        .poolProps = { .allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                       .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE,
                                     .id = dev } },
        .accessDescs = &access, .accessDescCount = 1, .bytesize = size };
    CUgraphNode node = NULL;
    if (rc == CUDA_SUCCESS)
        rc = api.graph_add_mem_alloc_node(&node, g_graph, NULL, 0, &params);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "graphalloc %zu", size);
    report_alloc(prefix, rc, params.dptr);
}

/* graphnodes: the node types of the client's graph. */
static void cmd_graphnodes(void)
{
    CUgraph g = client_graph();
    size_t n = 0;
    CUresult rc = api.graph_get_nodes(g, NULL, &n);
    CUgraphNode *nodes = NULL;
    if (rc == CUDA_SUCCESS && n > 0) {
        nodes = calloc(n, sizeof *nodes);
        if (nodes == NULL)
            die(EXIT_SOFTWARE, "out of memory");
        rc = api.graph_get_nodes(g, nodes, &n);
    }
    char types[512] = "";
    size_t len = 0;
    for (size_t i = 0; rc == CUDA_SUCCESS && i < n; i++) {
        CUgraphNodeType t = -1;
        rc = api.graph_node_get_type(nodes[i], &t);
        int w = snprintf(types + len, sizeof types - len, "%s%d",
                         i > 0 ? "," : "", t);
        if (w > 0 && (size_t)w < sizeof types - len)
            len += (size_t)w;
    }
    free(nodes);
    out("graphnodes -> %d n=%zu types=%s", rc, rc == CUDA_SUCCESS ? n : 0,
        len > 0 ? types : "-");
}

/* instantiate [autofree|upload] */
static void cmd_instantiate(const char *how)
{
    CUresult rc;
    if (how != NULL && strcmp(how, "upload") == 0) {
        CUDA_GRAPH_INSTANTIATE_PARAMS params = {
            .flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD,
            .hUploadStream = g_stream, .result_out = -1 };
        rc = api.graph_instantiate_with_params(&g_exec, client_graph(),
                                               &params);
        out("instantiate upload -> %d result=%d", rc, params.result_out);
        return;
    }
    bool autofree = how != NULL;
    rc = api.graph_instantiate(
        &g_exec, client_graph(),
        autofree ? CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH : 0);
    out("instantiate%s -> %d", autofree ? " autofree" : "", rc);
}

/* Per device: its processes, asked for like nvidia-smi (count, then list). */
static void cmd_nvmlprocs(void)
{
    struct nvml_api nv;
    if (!nvml_load(&nv)) {
        out("nvmlprocs -> unavailable");
        return;
    }
    nvmlReturn_t rc = nv.init();
    unsigned int count = 0;
    if (rc == NVML_SUCCESS)
        rc = nv.get_count(&count);
    if (rc != NVML_SUCCESS) {
        out("nvmlprocs -> %d", rc);
        if (count == 0)
            return;
    }
    for (unsigned int i = 0; rc == NVML_SUCCESS && i < count; i++) {
        nvmlDevice_t dev = NULL, same = NULL;
        char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        nvmlReturn_t drc = nv.get_handle(i, &dev);
        if (drc == NVML_SUCCESS)
            drc = nv.get_uuid(dev, uuid, sizeof uuid);
        if (drc == NVML_SUCCESS)
            drc = nv.by_uuid(uuid, &same);
        if (drc == NVML_SUCCESS && same != dev) {
            out("nvmlprocs dev=%u -> uuid-mismatch", i);
            continue;
        }
        unsigned int n = 0;
        nvmlProcessInfo_t *infos = NULL;
        if (drc == NVML_SUCCESS) {
            drc = nv.procs(dev, &n, NULL);
            if (drc == NVML_ERROR_INSUFFICIENT_SIZE) {
                infos = calloc(n, sizeof *infos);
                if (infos == NULL)
                    die(EXIT_SOFTWARE, "out of memory");
                drc = nv.procs(dev, &n, infos);
            }
        }
        if (drc != NVML_SUCCESS)
            out("nvmlprocs dev=%u -> %d", i, drc);
        else if (n == 0)
            out("nvmlprocs dev=%u none", i);
        for (unsigned int k = 0; drc == NVML_SUCCESS && k < n; k++)
            out("nvmlprocs dev=%u pid=%u used=%llu", i, infos[k].pid,
                infos[k].usedGpuMemory);
        free(infos);
    }
    nv.shutdown();
}

static void usage(void)
{
    fputs("usage: client METHOD CMD...\n"
          "methods: "
#ifdef CLIENT_LINKED
          "linked "
#endif
          "dlsym procaddr procaddr-legacy\n"
          "commands: init | ctx N | noctx | alloc SIZE | pitch W H ELEM |\n"
          "  managed SIZE | free SLOT | freeraw HEX | fill SIZE | freeall |\n"
          "  info | total N | standin | counts | kinds | ptrkind SLOT |\n"
          "  threads T ITERS MAXSIZE | forkbusy T N | forkhold |\n"
          "  resolve NAME VERSION FLAGS | resolve4 NAME VERSION FLAGS |\n"
          "  dlsym NAME | next NAME | default NAME | call-resolved cuMemAlloc\n"
          "  | pairs N SIZE | ptr SLOT | ipc SLOT | sync | stream |\n"
          "  capture-begin | capture-end | ctxcreate | ctxdestroy |\n"
          "  release N | reset N | allocasync SIZE | freeasync SLOT | pool |\n"
          "  poolalloc SIZE | vmm SIZE [host] | vmmmap HSLOT |\n"
          "  vmmunmap HSLOT | vmmretain HSLOT | vmmexport HSLOT | vmmimport |\n"
          "  vmmrelease HSLOT |\n"
          "  array W H FORMAT CHANNELS | array3d W H D FORMAT CHANNELS |\n"
          "  mipmap W H D FORMAT CHANNELS LEVELS | arraydestroy ASLOT |\n"
          "  arraysize ASLOT | nvml\n"
          "SIZE: bytes, or a number with K, M or G (powers of 1024)\n",
          stderr);
    exit(EXIT_USAGE);
}

/*
 * Parse the command at argv[0] and, if run is true, execute it. Returns how
 * many arguments it consumed. main() first calls this with run == false for
 * the whole command line, so bad usage is reported before anything runs.
 */
static void sync_at_exit(void)
{
    out("atexit sync -> %d", api.ctx_synchronize());
}

static int command(int argc, char **argv, bool run)
{
    const char *cmd = argv[0];
    char prefix[128];

#define NEED(n)                                                          \
    do {                                                                 \
        if (argc < (n) + 1)                                              \
            die(EXIT_USAGE, "'%s' needs %d argument(s)", cmd, (n));      \
    } while (0)

    if (strcmp(cmd, "init") == 0) {
        if (!run)
            return 1;
        CUresult rc = api.init(0);
        if (rc == CUDA_SUCCESS)
            rc = make_current(0);
        out("init -> %d", rc);
        return 1;
    }
    if (strcmp(cmd, "ctx") == 0) {
        NEED(1);
        int n = (int)parse_uint(argv[1], 1000000, "device");
        if (!run)
            return 2;
        out("ctx %d -> %d", n, make_current(n));
        return 2;
    }
    if (strcmp(cmd, "noctx") == 0) {
        if (run)
            out("noctx -> %d", api.ctx_set_current(NULL));
        return 1;
    }
    if (strcmp(cmd, "alloc") == 0 || strcmp(cmd, "managed") == 0) {
        NEED(1);
        size_t size = parse_size(argv[1]);
        if (!run)
            return 2;
        CUdeviceptr ptr = 0;
        CUresult rc = cmd[0] == 'a' ? api.mem_alloc(&ptr, size)
                                    : api.mem_alloc_managed(&ptr, size,
                                                            CU_MEM_ATTACH_GLOBAL);
        snprintf(prefix, sizeof prefix, "%s %zu", cmd, size);
        report_alloc(prefix, rc, ptr);
        return 2;
    }
    if (strcmp(cmd, "pitch") == 0) {
        NEED(3);
        size_t width = parse_size(argv[1]);
        size_t height = parse_size(argv[2]);
        unsigned elem = (unsigned)parse_uint(argv[3], 1 << 20, "element size");
        if (!run)
            return 4;
        CUdeviceptr ptr = 0;
        size_t pitch = 0;
        CUresult rc = api.mem_alloc_pitch(&ptr, &pitch, width, height, elem);
        if (rc == CUDA_SUCCESS)
            out("pitch %zu %zu %u -> %d pitch=%zu #%zu", width, height, elem,
                rc, pitch, add_slot(ptr));
        else
            out("pitch %zu %zu %u -> %d", width, height, elem, rc);
        return 4;
    }
    if (strcmp(cmd, "free") == 0) {
        NEED(1);
        const char *s = argv[1][0] == '#' ? argv[1] + 1 : argv[1];
        size_t n = (size_t)parse_uint(s, 1L << 40, "slot");
        if (!run)
            return 2;
        if (n >= g_nslots)
            die(EXIT_USAGE, "no slot #%zu", n);
        CUresult rc = api.mem_free(g_slots[n].ptr);
        if (rc == CUDA_SUCCESS)
            g_slots[n].live = false;
        out("free #%zu -> %d", n, rc);
        return 2;
    }
    if (strcmp(cmd, "freeraw") == 0) {
        NEED(1);
        CUdeviceptr ptr = parse_ull(argv[1], 16, "address");
        if (!run)
            return 2;
        out("freeraw 0x%llx -> %d", ptr, api.mem_free(ptr));
        return 2;
    }
    if (strcmp(cmd, "fill") == 0) {
        NEED(1);
        size_t size = parse_size(argv[1]);
        if (!run)
            return 2;
        unsigned long n = 0;
        CUresult rc = CUDA_SUCCESS;
        while (n < FILL_LIMIT) {
            CUdeviceptr ptr;
            rc = api.mem_alloc(&ptr, size);
            if (rc != CUDA_SUCCESS)
                break;
            add_slot(ptr);
            n++;
        }
        out("fill %zu -> %lu allocs %llu bytes rc=%d", size, n,
            (unsigned long long)n * size, rc);
        return 2;
    }
    if (strcmp(cmd, "freeall") == 0) {
        if (!run)
            return 1;
        unsigned long n = 0;
        CUresult first = CUDA_SUCCESS;
        for (size_t i = 0; i < g_nslots; i++) {
            if (!g_slots[i].live)
                continue;
            CUresult rc = api.mem_free(g_slots[i].ptr);
            if (rc == CUDA_SUCCESS) {
                g_slots[i].live = false;
                n++;
            } else if (first == CUDA_SUCCESS) {
                first = rc;
            }
        }
        out("freeall -> %lu freed rc=%d", n, first);
        return 1;
    }
    if (strcmp(cmd, "info") == 0) {
        if (!run)
            return 1;
        size_t free_bytes = 0, total = 0;
        CUresult rc = api.mem_get_info(&free_bytes, &total);
        out("info -> %d free=%zu total=%zu", rc, free_bytes, total);
        return 1;
    }
    if (strcmp(cmd, "total") == 0) {
        NEED(1);
        int n = (int)parse_uint(argv[1], 1000000, "device");
        if (!run)
            return 2;
        size_t bytes = 0;
        CUresult rc = api.device_total_mem(&bytes, n);
        out("total %d -> %d bytes=%zu", n, rc, bytes);
        return 2;
    }
    if (strcmp(cmd, "standin") == 0) {
        if (run)
            cmd_standin();
        return 1;
    }
    if (strcmp(cmd, "wait") == 0) {
        if (run) {
            out("wait");
            int c;
            while ((c = getchar()) != EOF && c != '\n') {
            }
            out("resumed");
        }
        return 1;
    }
    if (strcmp(cmd, "abiversion") == 0) {
        if (run) {
            int (*f)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "vramcap_version");
            out("abiversion -> %d", f ? f() : -1);
        }
        return 1;
    }
    if (strcmp(cmd, "setlimit") == 0) {
        NEED(2);
        int dev = (int)strtol(argv[1], NULL, 10);
        bool lift = strcmp(argv[2], "max") == 0;
        uint64_t bytes = lift ? UINT64_MAX : (uint64_t)parse_size(argv[2]);
        if (!run)
            return 3;
        int (*f)(int, uint64_t) =
            (int (*)(int, uint64_t))dlsym(RTLD_DEFAULT, "vramcap_set_limit");
        int rc = f ? f(dev, bytes) : -1000;
        if (lift)
            out("setlimit %d max -> %d", dev, rc);
        else
            out("setlimit %d %llu -> %d", dev, (unsigned long long)bytes, rc);
        return 3;
    }
    if (strcmp(cmd, "getlimit") == 0) {
        NEED(1);
        int dev = (int)strtol(argv[1], NULL, 10);
        if (!run)
            return 2;
        uint64_t (*f)(int) = (uint64_t(*)(int))dlsym(RTLD_DEFAULT, "vramcap_get_limit");
        if (!f)
            out("getlimit %d -> missing", dev);
        else if (f(dev) == UINT64_MAX)
            out("getlimit %d -> max", dev);
        else
            out("getlimit %d -> %llu", dev, (unsigned long long)f(dev));
        return 2;
    }
    if (strcmp(cmd, "abistats") == 0) {
        NEED(1);
        int dev = (int)strtol(argv[1], NULL, 10);
        if (!run)
            return 2;
        uint64_t st[12] = {0};
        int (*f)(int, uint64_t *, size_t) =
            (int (*)(int, uint64_t *, size_t))dlsym(RTLD_DEFAULT, "vramcap_memory_stats");
        int rc = f ? f(dev, st, sizeof st) : -1000;
        out("abistats %d -> %d size=%llu limit=%llu soft=%llu held=%llu allocations=%llu pools=%llu "
            "graphs=%llu context=%llu peak=%llu cached=%llu refusals=%llu",
            dev, rc, (unsigned long long)st[0], (unsigned long long)st[1],
            (unsigned long long)st[2],
            (unsigned long long)st[3], (unsigned long long)st[4], (unsigned long long)st[5],
            (unsigned long long)st[6], (unsigned long long)st[7], (unsigned long long)st[8],
            (unsigned long long)st[9], (unsigned long long)st[11]);
        return 2;
    }
    if (strcmp(cmd, "emptycache") == 0) {
        if (run) {
            int64_t (*f)(void) = (int64_t(*)(void))dlsym(RTLD_DEFAULT, "vramcap_empty_cache");
            out("emptycache -> %lld", (long long)(f ? f() : -1000));
        }
        return 1;
    }
    if (strcmp(cmd, "counts") == 0) {
        if (run)
            cmd_counts();
        return 1;
    }
    if (strcmp(cmd, "kcounts") == 0) {
        if (run) {
            void *p = dlsym(libcuda(), "vramcap_standin_count");
            unsigned long (*count)(const char *) = NULL;
            if (p != NULL)
                memcpy(&count, &p, sizeof p);
            if (count == NULL)
                out("kcounts -> unavailable");
            else
                out("kcounts launch=%lu fault=%lu", count("launch"),
                    count("fault"));
        }
        return 1;
    }
    if (strcmp(cmd, "ckstate") == 0) {
        if (run) {
            void *p = dlsym(libcuda(), "vramcap_standin_checkpoint");
            unsigned long (*ck)(const char *) = NULL;
            if (p != NULL)
                memcpy(&ck, &p, sizeof p);
            if (ck == NULL)
                out("ckstate -> unavailable");
            else
                out("ckstate state=%lu checkpoints=%lu restores=%lu "
                    "failures=%lu parked=%lu", ck("state"), ck("checkpoints"),
                    ck("restores"), ck("restore_failures"), ck("parked"));
        }
        return 1;
    }
    if (strcmp(cmd, "kinds") == 0) {
        if (run)
            cmd_kinds();
        return 1;
    }
    if (strcmp(cmd, "ptrkind") == 0) {
        NEED(1);
        size_t n = parse_slot(argv[1]);
        if (run)
            cmd_ptrkind(n);
        return 2;
    }
    if (strcmp(cmd, "threads") == 0) {
        NEED(3);
        long t = parse_uint(argv[1], MAX_THREADS, "thread count");
        long iters = parse_uint(argv[2], 1L << 40, "iteration count");
        size_t max_size = parse_size(argv[3]);
        if (t < 1 || max_size < MIB)
            die(EXIT_USAGE, "threads needs T >= 1 and MAXSIZE >= 1M");
        if (run)
            cmd_threads(t, iters, max_size);
        return 4;
    }
    if (strcmp(cmd, "churnlimit") == 0) {
        NEED(4);
        long t = parse_uint(argv[1], MAX_THREADS, "thread count");
        long iters = parse_uint(argv[2], 1L << 40, "iteration count");
        size_t max_size = parse_size(argv[3]);
        size_t low = parse_size(argv[4]);
        if (t < 1 || max_size < MIB || low < 1)
            die(EXIT_USAGE, "churnlimit needs T >= 1, MAXSIZE >= 1M and LOW >= 1");
        if (run)
            cmd_churnlimit(t, iters, max_size, low);
        return 5;
    }
    if (strcmp(cmd, "forkbusy") == 0) {
        NEED(2);
        long t = parse_uint(argv[1], MAX_THREADS, "thread count");
        long n = parse_uint(argv[2], 10000, "fork count");
        if (t < 1)
            die(EXIT_USAGE, "forkbusy needs T >= 1");
        if (run)
            cmd_forkbusy(t, n);
        return 3;
    }
    if (strcmp(cmd, "forkhold") == 0) {
        if (run)
            cmd_forkhold();
        return 1;
    }
    if (strcmp(cmd, "resolve") == 0 || strcmp(cmd, "resolve4") == 0) {
        NEED(3);
        int version = parse_version(argv[2]);
        cuuint64_t flags = parse_ull(argv[3], 0, "flags");
        if (run)
            cmd_resolve(cmd, argv[1], version, flags,
                        strcmp(cmd, "resolve") == 0);
        return 4;
    }
    if (strcmp(cmd, "dlsym") == 0) {
        NEED(1);
        if (run)
            out("dlsym %s -> lib=%s", argv[1], lib_of(dlsym(libcuda(), argv[1])));
        return 2;
    }
    if (strcmp(cmd, "next") == 0) {
        NEED(1);
        if (run)
            out("next %s -> lib=%s", argv[1], lib_of(dlsym(RTLD_NEXT, argv[1])));
        return 2;
    }
    if (strcmp(cmd, "default") == 0) {
        NEED(1);
        if (run)
            out("default %s -> lib=%s", argv[1], lib_of(dlsym(RTLD_DEFAULT, argv[1])));
        return 2;
    }
    if (strcmp(cmd, "batch-copy") == 0) {
        NEED(4);
        int version = parse_version(argv[1]);
        size_t d = parse_slot(argv[2]), src = parse_slot(argv[3]);
        size_t size = parse_size(argv[4]);
        if (run)
            cmd_batch_copy(version, d, src, size);
        return 5;
    }
    if (strcmp(cmd, "array-copies") == 0) {
        NEED(2);
        size_t a = parse_prefixed(argv[1], '@', "array slot");
        size_t sl = parse_slot(argv[2]);
        if (run)
            cmd_array_copies(a, sl);
        return 3;
    }
    if (strcmp(cmd, "grid-launches") == 0) {
        if (run)
            cmd_grid_launches();
        return 1;
    }
    if (strcmp(cmd, "call-resolved") == 0) {
        NEED(1);
        if (strcmp(argv[1], "cuMemAlloc") != 0)
            die(EXIT_USAGE, "call-resolved supports only cuMemAlloc, not '%s'",
                argv[1]);
        if (run)
            cmd_call_resolved(argv[1]);
        return 2;
    }
    if (strcmp(cmd, "pairs") == 0) {
        NEED(2);
        long n = parse_uint(argv[1], 1L << 40, "pair count");
        size_t size = parse_size(argv[2]);
        if (!run)
            return 3;
        long ok = 0;
        CUresult rc = CUDA_SUCCESS;
        while (ok < n) {
            CUdeviceptr ptr;
            rc = api.mem_alloc(&ptr, size);
            if (rc != CUDA_SUCCESS)
                break;
            rc = api.mem_free(ptr);
            if (rc != CUDA_SUCCESS)
                break;
            ok++;
        }
        out("pairs %ld %zu -> ok=%ld rc=%d", n, size, ok, rc);
        return 3;
    }
    if (strcmp(cmd, "ptr") == 0) {
        NEED(1);
        size_t n = parse_slot(argv[1]);
        if (run)
            out("ptr #%zu = 0x%llx", n, slot(n)->ptr);
        return 2;
    }
    if (strcmp(cmd, "range") == 0) {
        NEED(1);
        size_t n = parse_slot(argv[1]);
        g_need_ext = true;
        if (!run)
            return 2;
        CUdeviceptr base = 0;
        size_t size = 0;
        CUresult rc =
            api.mem_get_address_range(&base, &size, slot(n)->ptr + 4096);
        out("range #%zu -> %d base=%+lld size=%zu", n, rc,
            base ? (long long)(base - slot(n)->ptr) : -1, size);
        return 2;
    }
    if (strcmp(cmd, "ptrquery") == 0) {
        NEED(1);
        size_t n = parse_slot(argv[1]);
        g_need_ext = true;
        if (!run)
            return 2;
        CUdeviceptr at = slot(n)->ptr + 4096;
        int dev = -1;
        CUdeviceptr start = 0;
        CUresult rc = api.pointer_get_attribute(
            &dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, at);
        if (rc == CUDA_SUCCESS)
            rc = api.pointer_get_attribute(
                &start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, at);
        CUdeviceptr base = 0;
        size_t size = 0;
        CUresult rr = api.mem_get_address_range(&base, &size, at);
        long long off = start ? (long long)(start - slot(n)->ptr) : -1;
        long long boff = base ? (long long)(base - slot(n)->ptr) : -1;
        out("ptrquery #%zu -> %d dev=%d start=%+lld; range -> %d base=%+lld "
            "size=%zu",
            n, rc, dev, off, rr, boff, size);
        return 2;
    }
    if (strcmp(cmd, "peer") == 0) {
        /* peer N: the current context may reach device N's memory. */
        NEED(1);
        int n = (int)parse_uint(argv[1], 1000000, "device");
        if (!run)
            return 2;
        CUcontext other;
        CUresult rc = primary_ctx(n, &other);
        out("peer %d -> %d", n,
            rc != CUDA_SUCCESS ? rc : api.ctx_enable_peer_access(other, 0));
        return 2;
    }
    if (strcmp(cmd, "access") == 0) {
        /* access #N DEV: the access flags of slot N's memory for DEV. */
        NEED(2);
        size_t n = parse_slot(argv[1]);
        int dev = (int)parse_uint(argv[2], 1000000, "device");
        if (!run)
            return 3;
        unsigned long long flags = 0;
        CUmemLocation loc = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev };
        CUresult rc = api.mem_get_access(&flags, &loc, slot(n)->ptr);
        out("access #%zu dev=%d -> %d flags=%llu", n, dev, rc, flags);
        return 3;
    }
    if (strcmp(cmd, "ipc") == 0) {
        NEED(1);
        size_t n = parse_slot(argv[1]);
        if (!run)
            return 2;
        CUipcMemHandle handle;
        out("ipc #%zu -> %d", n, api.ipc_get_mem_handle(&handle, slot(n)->ptr));
        return 2;
    }
    if (strcmp(cmd, "sync") == 0) {
        if (run)
            out("sync -> %d", api.ctx_synchronize());
        return 1;
    }
    if (strcmp(cmd, "nochld") == 0) {
        if (run) {
            signal(SIGCHLD, SIG_IGN);
            out("nochld");
        }
        return 1;
    }
    if (strcmp(cmd, "atexit-sync") == 0) {
        if (run)
            atexit(sync_at_exit);
        return 1;
    }
    if (strcmp(cmd, "stream") == 0) {
        if (run)
            out("stream -> %d", api.stream_create(&g_stream, 0));
        return 1;
    }
    if (strcmp(cmd, "stream-nb") == 0) {
        if (run)
            out("stream-nb -> %d",
                api.stream_create(&g_stream, CU_STREAM_NON_BLOCKING));
        return 1;
    }
    if (strcmp(cmd, "stream-prio-nb") == 0) {
        if (run)
            out("stream-prio-nb -> %d",
                api.stream_create_with_priority(&g_stream,
                                                CU_STREAM_NON_BLOCKING, -1));
        return 1;
    }
    if (strcmp(cmd, "capture-begin") == 0) {
        if (run)
            out("capture-begin -> %d",
                api.stream_begin_capture(g_stream,
                                         CU_STREAM_CAPTURE_MODE_RELAXED));
        return 1;
    }
    if (strcmp(cmd, "capture-end") == 0) {
        if (run) {
            CUgraph graph = NULL;
            out("capture-end -> %d", api.stream_end_capture(g_stream, &graph));
            if (graph != NULL)
                g_captured = graph;
        }
        return 1;
    }
    if (strcmp(cmd, "ctxcreate") == 0) {
        if (run)
            out("ctxcreate -> %d", api.ctx_create(&g_created_ctx, NULL, 0, 0));
        return 1;
    }
    if (strcmp(cmd, "ctxdestroy") == 0) {
        if (run)
            out("ctxdestroy -> %d", api.ctx_destroy(g_created_ctx));
        return 1;
    }
    if (strcmp(cmd, "release") == 0 || strcmp(cmd, "reset") == 0) {
        NEED(1);
        int n = (int)parse_uint(argv[1], 1000000, "device");
        if (!run)
            return 2;
        CUresult rc = strcmp(cmd, "release") == 0 ? api.primary_ctx_release(n)
                                                  : api.primary_ctx_reset(n);
        out("%s %d -> %d", cmd, n, rc);
        return 2;
    }
    if (strcmp(cmd, "allocasync") == 0 || strcmp(cmd, "poolalloc") == 0) {
        NEED(1);
        size_t size = parse_size(argv[1]);
        g_need_ext = true;
        if (!run)
            return 2;
        CUdeviceptr ptr = 0;
        CUresult rc = cmd[0] == 'a'
                          ? api.mem_alloc_async(&ptr, size, g_stream)
                          : api.mem_alloc_from_pool_async(&ptr, size, g_pool,
                                                          g_stream);
        snprintf(prefix, sizeof prefix, "%s %zu", cmd, size);
        report_alloc(prefix, rc, ptr);
        return 2;
    }
    if (strcmp(cmd, "freeasync") == 0) {
        NEED(1);
        size_t n = parse_slot(argv[1]);
        g_need_ext = true;
        if (!run)
            return 2;
        CUresult rc = api.mem_free_async(slot(n)->ptr, g_stream);
        if (rc == CUDA_SUCCESS)
            slot(n)->live = false;
        out("freeasync #%zu -> %d", n, rc);
        return 2;
    }
    if (strcmp(cmd, "pool") == 0) {
        g_need_ext = true;
        if (run) {
            CUmemPoolProps props = {
                .allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                .handleTypes = CU_MEM_HANDLE_TYPE_NONE,
                .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0 } };
            out("pool -> %d", api.mem_pool_create(&g_pool, &props));
        }
        return 1;
    }
    if (strcmp(cmd, "vmm") == 0) {
        NEED(1);
        size_t size = parse_size(argv[1]);
        bool host = argc > 2 && strcmp(argv[2], "host") == 0;
        g_need_ext = true;
        if (!run)
            return host ? 3 : 2;
        CUmemAllocationProp prop = {
            .type = CU_MEM_ALLOCATION_TYPE_PINNED,
            .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            .location = { .type = host ? CU_MEM_LOCATION_TYPE_HOST
                                       : CU_MEM_LOCATION_TYPE_DEVICE,
                          .id = 0 } };
        CUmemGenericAllocationHandle h = 0;
        CUresult rc = api.mem_create(&h, size, &prop, 0);
        if (rc == CUDA_SUCCESS)
            out("vmm %zu -> %d %%%zu", size, rc, add_hslot(h, size));
        else
            out("vmm %zu -> %d", size, rc);
        return host ? 3 : 2;
    }
    if (strcmp(cmd, "vmmmap") == 0 || strcmp(cmd, "vmmunmap") == 0 ||
        strcmp(cmd, "vmmretain") == 0 || strcmp(cmd, "vmmexport") == 0 ||
        strcmp(cmd, "vmmrelease") == 0) {
        NEED(1);
        size_t n = parse_prefixed(argv[1], '%', "handle slot");
        g_need_ext = true;
        if (!run)
            return 2;
        struct hslot *hs = hslot(n);
        CUresult rc;
        if (strcmp(cmd, "vmmmap") == 0) {
            CUdeviceptr va = 0;
            rc = api.mem_address_reserve(&va, hs->size, 0, 0, 0);
            if (rc == CUDA_SUCCESS) {
                rc = api.mem_map(va, hs->size, 0, hs->handle, 0);
                if (rc == CUDA_SUCCESS) {
                    CUmemAccessDesc desc = {
                        .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE,
                                      .id = 0 },
                        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
                    rc = api.mem_set_access(va, hs->size, &desc, 1);
                    if (rc != CUDA_SUCCESS)
                        api.mem_unmap(va, hs->size);
                }
                if (rc != CUDA_SUCCESS)
                    api.mem_address_free(va, hs->size);
            }
            if (rc == CUDA_SUCCESS)
                hs->va = va;
        } else if (strcmp(cmd, "vmmunmap") == 0) {
            rc = api.mem_unmap(hs->va, hs->size);
            if (rc == CUDA_SUCCESS) {
                rc = api.mem_address_free(hs->va, hs->size);
                hs->va = 0;
            }
        } else if (strcmp(cmd, "vmmretain") == 0) {
            CUmemGenericAllocationHandle h = 0;
            rc = api.mem_retain_allocation_handle(&h,
                                                  (void *)(uintptr_t)hs->va);
            if (rc == CUDA_SUCCESS) {
                size_t size = hs->size; /* hs may move */
                out("vmmretain %%%zu -> %d %%%zu", n, rc, add_hslot(h, size));
                return 2;
            }
        } else if (strcmp(cmd, "vmmexport") == 0) {
            int fd = -1;
            rc = api.mem_export(&fd, hs->handle,
                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            if (rc == CUDA_SUCCESS) {
                g_exported_fd = fd;
                g_exported_size = hs->size;
            }
        } else {
            rc = api.mem_release(hs->handle);
        }
        out("%s %%%zu -> %d", cmd, n, rc);
        return 2;
    }
    if (strcmp(cmd, "vmmimport") == 0) {
        g_need_ext = true;
        if (!run)
            return 1;
        CUmemGenericAllocationHandle h = 0;
        CUresult rc = api.mem_import(&h, (void *)(intptr_t)g_exported_fd,
                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (rc == CUDA_SUCCESS)
            out("vmmimport -> %d %%%zu", rc, add_hslot(h, g_exported_size));
        else
            out("vmmimport -> %d", rc);
        return 1;
    }
    if (strcmp(cmd, "array") == 0 || strcmp(cmd, "array3d") == 0 ||
        strcmp(cmd, "mipmap") == 0) {
        bool is_2d = strcmp(cmd, "array") == 0;
        bool mip = strcmp(cmd, "mipmap") == 0;
        int nargs = is_2d ? 4 : mip ? 6 : 5;
        NEED(nargs);
        int a = 1;
        CUDA_ARRAY3D_DESCRIPTOR desc = { 0 };
        desc.Width = (size_t)parse_uint(argv[a++], 1L << 40, "width");
        desc.Height = (size_t)parse_uint(argv[a++], 1L << 40, "height");
        if (!is_2d)
            desc.Depth = (size_t)parse_uint(argv[a++], 1L << 40, "depth");
        unsigned long long format = parse_ull(argv[a++], 0, "format");
        if (format > 0x7fffffff)
            die(EXIT_USAGE, "bad format '%s'", argv[a - 1]);
        desc.Format = (CUarray_format)format;
        desc.NumChannels = (unsigned)parse_uint(argv[a++], 1000000, "channels");
        unsigned levels =
            mip ? (unsigned)parse_uint(argv[a++], 1000000, "levels") : 1;
        g_need_ext = true;
        if (!run)
            return nargs + 1;
        struct aslot slot_value = { .mipmap = mip };
        CUresult rc;
        if (is_2d) {
            CUDA_ARRAY_DESCRIPTOR d2 = {
                .Width = desc.Width, .Height = desc.Height,
                .Format = desc.Format, .NumChannels = desc.NumChannels };
            rc = api.array_create(&slot_value.array, &d2);
            snprintf(prefix, sizeof prefix, "array %zu %zu 0x%x %u",
                     desc.Width, desc.Height, (unsigned)desc.Format,
                     desc.NumChannels);
        } else if (!mip) {
            rc = api.array3d_create(&slot_value.array, &desc);
            snprintf(prefix, sizeof prefix, "array3d %zu %zu %zu 0x%x %u",
                     desc.Width, desc.Height, desc.Depth,
                     (unsigned)desc.Format, desc.NumChannels);
        } else {
            rc = api.mipmap_create(&slot_value.mip, &desc, levels);
            snprintf(prefix, sizeof prefix, "mipmap %zu %zu %zu 0x%x %u %u",
                     desc.Width, desc.Height, desc.Depth,
                     (unsigned)desc.Format, desc.NumChannels, levels);
        }
        if (rc == CUDA_SUCCESS)
            out("%s -> %d @%zu", prefix, rc, add_aslot(slot_value));
        else
            out("%s -> %d", prefix, rc);
        return nargs + 1;
    }
    if (strcmp(cmd, "arraydestroy") == 0 || strcmp(cmd, "arraysize") == 0) {
        NEED(1);
        size_t n = parse_prefixed(argv[1], '@', "array slot");
        g_need_ext = true;
        if (!run)
            return 2;
        struct aslot *as = aslot(n);
        if (strcmp(cmd, "arraydestroy") == 0) {
            CUresult rc = as->mipmap ? api.mipmap_destroy(as->mip)
                                     : api.array_destroy(as->array);
            out("arraydestroy @%zu -> %d", n, rc);
            return 2;
        }
        CUdevice dev = 0;
        if (api.ctx_get_device(&dev) != CUDA_SUCCESS)
            dev = 0;
        CUDA_ARRAY_MEMORY_REQUIREMENTS req = { 0 };
        CUresult rc = as->mipmap ? api.mipmap_requirements(&req, as->mip, dev)
                                 : api.array_requirements(&req, as->array, dev);
        out("arraysize @%zu -> %d size=%zu", n, rc,
            rc == CUDA_SUCCESS ? req.size : 0);
        return 2;
    }
    if (strcmp(cmd, "poolattr") == 0 || strcmp(cmd, "graphmem") == 0) {
        NEED(1);
        bool pool = cmd[0] == 'p';
        int attr = pool ? parse_attr(argv[1], g_pool_attrs,
                                     COUNT(g_pool_attrs), "pool attribute")
                        : parse_attr(argv[1], g_graph_attrs,
                                     COUNT(g_graph_attrs), "graph attribute");
        g_need_graph = true;
        if (!run)
            return 2;
        cuuint64_t value = 0;
        CUresult rc = pool ? api.mem_pool_get_attribute(client_pool(), attr,
                                                        &value)
                           : api.device_get_graph_mem_attribute(
                                 current_device(), attr, &value);
        out("%s %s -> %d %llu", cmd, argv[1], rc, (unsigned long long)value);
        return 2;
    }
    if (strcmp(cmd, "poolset") == 0 || strcmp(cmd, "graphmemset") == 0) {
        NEED(2);
        bool pool = cmd[0] == 'p';
        int attr = pool ? parse_attr(argv[1], g_pool_attrs,
                                     COUNT(g_pool_attrs), "pool attribute")
                        : parse_attr(argv[1], g_graph_attrs,
                                     COUNT(g_graph_attrs), "graph attribute");
        bool max = strcmp(argv[2], "max") == 0;
        cuuint64_t value = max ? UINT64_MAX : parse_size(argv[2]);
        g_need_graph = true;
        if (!run)
            return 3;
        CUresult rc = pool ? api.mem_pool_set_attribute(client_pool(), attr,
                                                        &value)
                           : api.device_set_graph_mem_attribute(
                                 current_device(), attr, &value);
        if (max)
            out("%s %s max -> %d", cmd, argv[1], rc);
        else
            out("%s %s %llu -> %d", cmd, argv[1], (unsigned long long)value,
                rc);
        return 3;
    }
    if (strcmp(cmd, "pooltrim") == 0) {
        NEED(1);
        size_t size = parse_size(argv[1]);
        g_need_graph = true;
        if (run)
            out("pooltrim %zu -> %d", size,
                api.mem_pool_trim_to(client_pool(), size));
        return 2;
    }
    if (strcmp(cmd, "setpool") == 0) {
        g_need_graph = true;
        if (run)
            out("setpool -> %d",
                api.device_set_mem_pool(current_device(), g_pool));
        return 1;
    }
    if (strcmp(cmd, "destroypool") == 0) {
        g_need_graph = true;
        if (run)
            out("destroypool -> %d", api.mem_pool_destroy(g_pool));
        return 1;
    }
    if (strcmp(cmd, "kernel") == 0) {
        NEED(1);
        g_need_kernel = true;
        if (!run)
            return 2;
        static CUmodule module;
        CUresult rc = CUDA_SUCCESS;
        if (module == NULL)
            rc = api.module_load_data(&module, "stand-in image");
        if (rc == CUDA_SUCCESS)
            rc = api.module_get_function(&g_func, module, argv[1]);
        out("kernel %s -> %d", argv[1], rc);
        return 2;
    }
    if (strcmp(cmd, "kernel-launch") == 0) {
        NEED(2);
        g_need_kernel = true;
        long times = parse_uint(argv[1], 1000000, "times");
        int n = 0;
        while (n + 2 < argc && n < 8 &&
               (argv[n + 2][0] == '#' || argv[n + 2][0] == '%'))
            n++;
        if (n == 0)
            die(EXIT_USAGE, "kernel-launch: no #SLOT arguments");
        if (!run)
            return 2 + n;
        CUdeviceptr words[8];
        void *params[8];
        for (int i = 0; i < n; i++) {
            char label[32];
            words[i] = ptr_arg(argv[i + 2], label);
            params[i] = &words[i];
        }
        CUresult rc = CUDA_SUCCESS;
        for (long t = 0; t < times && rc == CUDA_SUCCESS; t++)
            rc = api.launch_kernel(g_func, 1, 1, 1, 1, 1, 1, 0, g_stream,
                                   params, NULL);
        out("kernel-launch %ld -> %d", times, rc);
        return 2 + n;
    }
    if (strcmp(cmd, "memset32") == 0) {
        NEED(3);
        g_need_kernel = true;
        size_t size = parse_size(argv[2]);
        unsigned int v = (unsigned int)parse_uint(argv[3], 0xffffffffL, "value");
        if (run) {
            char label[32];
            CUdeviceptr p = ptr_arg(argv[1], label);
            out("memset32 %s -> %d", label, api.memset_d32(p, v, size / 4));
        }
        return 4;
    }
    if (strcmp(cmd, "read32") == 0) {
        NEED(1);
        g_need_kernel = true;
        if (!run)
            return 2;
        char label[32];
        CUdeviceptr p = ptr_arg(argv[1], label);
        unsigned int v = 0;
        CUresult rc = api.memcpy_dtoh(&v, p, sizeof v);
        out("read32 %s -> %d value=%u", label, rc, v);
        return 2;
    }
    if (strcmp(cmd, "streamsync") == 0) {
        g_need_graph = true;
        if (run)
            out("streamsync -> %d", api.stream_synchronize(g_stream));
        return 1;
    }
    if (strcmp(cmd, "streamquery") == 0) {
        g_need_graph = true;
        if (run)
            out("streamquery -> %d", api.stream_query(g_stream));
        return 1;
    }
    if (strcmp(cmd, "event") == 0) {
        g_need_graph = true;
        if (run) {
            CUresult created = api.event_create(&g_event, 0);
            out("event -> %d %d", created,
                created == CUDA_SUCCESS ? api.event_record(g_event, g_stream)
                                        : created);
        }
        return 1;
    }
    if (strcmp(cmd, "eventquery") == 0) {
        g_need_graph = true;
        if (run)
            out("eventquery -> %d", api.event_query(g_event));
        return 1;
    }
    if (strcmp(cmd, "eventsync") == 0) {
        g_need_graph = true;
        if (run)
            out("eventsync -> %d", api.event_synchronize(g_event));
        return 1;
    }
    if (strcmp(cmd, "graphtrim") == 0) {
        g_need_graph = true;
        if (run)
            out("graphtrim -> %d", api.device_graph_mem_trim(current_device()));
        return 1;
    }
    if (strcmp(cmd, "graphalloc") == 0) {
        NEED(1);
        size_t size = parse_size(argv[1]);
        g_need_graph = true;
        if (run)
            cmd_graphalloc(size);
        return 2;
    }
    if (strcmp(cmd, "graphfree") == 0) {
        NEED(1);
        size_t n = parse_slot(argv[1]);
        g_need_graph = true;
        if (!run)
            return 2;
        CUgraphNode node = NULL;
        out("graphfree #%zu -> %d", n,
            api.graph_add_mem_free_node(&node, client_graph(), NULL, 0,
                                        slot(n)->ptr));
        return 2;
    }
    if (strcmp(cmd, "graphnodes") == 0) {
        g_need_graph = true;
        if (run)
            cmd_graphnodes();
        return 1;
    }
    if (strcmp(cmd, "graphdestroy") == 0) {
        g_need_graph = true;
        if (run) {
            CUgraph g = client_graph();
            out("graphdestroy -> %d", api.graph_destroy(g));
            if (g == g_graph)
                g_graph = NULL;
            else
                g_captured = NULL;
        }
        return 1;
    }
    if (strcmp(cmd, "instantiate") == 0) {
        const char *how = NULL;
        if (argc > 1 && (strcmp(argv[1], "autofree") == 0 ||
                         strcmp(argv[1], "upload") == 0))
            how = argv[1];
        g_need_graph = true;
        if (run)
            cmd_instantiate(how);
        return how != NULL ? 2 : 1;
    }
    if (strcmp(cmd, "execupdate") == 0) {
        g_need_graph = true;
        if (run) {
            CUgraphExecUpdateResultInfo info = { .result = -1 };
            CUresult rc = api.graph_exec_update(g_exec, client_graph(), &info);
            out("execupdate -> %d result=%d", rc, info.result);
        }
        return 1;
    }
    if (strcmp(cmd, "launches") == 0) {
        NEED(1);
        g_need_graph = true;
        long times = parse_uint(argv[1], 1000000, "times");
        if (!run)
            return 2;
        CUresult rc = CUDA_SUCCESS;
        for (long t = 0; t < times && rc == CUDA_SUCCESS; t++)
            rc = api.graph_launch(g_exec, g_stream);
        out("launches %ld -> %d", times, rc);
        return 2;
    }
    if (strcmp(cmd, "launch") == 0 || strcmp(cmd, "upload") == 0 ||
        strcmp(cmd, "execdestroy") == 0) {
        g_need_graph = true;
        if (!run)
            return 1;
        CUresult rc = cmd[0] == 'l'   ? api.graph_launch(g_exec, g_stream)
                      : cmd[0] == 'u' ? api.graph_upload(g_exec, g_stream)
                                      : api.graph_exec_destroy(g_exec);
        out("%s -> %d", cmd, rc);
        return 1;
    }
    if (strcmp(cmd, "nvmlprocs") == 0) {
        if (run)
            cmd_nvmlprocs();
        return 1;
    }
    if (strcmp(cmd, "nvml") == 0) {
        if (run)
            cmd_nvml();
        return 1;
    }
#undef NEED
    die(EXIT_USAGE, "unknown command '%s'", cmd);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();

    const char *method = argv[1];
    if (strcmp(method, "linked") == 0) {
#ifdef CLIENT_LINKED
        g_method = M_LINKED;
#else
        die(EXIT_USAGE, "method 'linked' needs client-linked");
#endif
    } else if (strcmp(method, "dlsym") == 0) {
        g_method = M_DLSYM;
    } else if (strcmp(method, "procaddr") == 0) {
        g_method = M_PROCADDR;
    } else if (strcmp(method, "procaddr-legacy") == 0) {
        g_method = M_PROCADDR_LEGACY;
    } else {
        fprintf(stderr, "client: unknown method '%s'\n", method);
        usage();
    }

    /* Check the whole command line before touching the driver. */
    for (int i = 2; i < argc;)
        i += command(argc - i, argv + i, false);

    switch (g_method) {
    case M_LINKED:
#ifdef CLIENT_LINKED
        setup_linked();
#endif
        break;
    case M_DLSYM:
        setup_dlsym();
        break;
    case M_PROCADDR:
    case M_PROCADDR_LEGACY:
        setup_procaddr();
        break;
    }

    for (int i = 2; i < argc;)
        i += command(argc - i, argv + i, true);
    return 0;
}
