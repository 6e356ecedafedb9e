/*
 * cuda_standin.c - a stand-in CUDA driver (installed as libcuda.so.1) for the
 * vramcap integration tests, which run on machines without a GPU.
 *
 * It exports a small part of the CUDA 13 driver API with the real ABI and
 * models what vramcap cares about: devices with a fixed amount of memory,
 * primary and created contexts that own their allocations, a thread-local
 * context stack, exact per-device accounting of every way to allocate that
 * it implements (cuMemAlloc and friends, managed memory with advice about
 * its preferred location, stream-ordered allocation from memory pools,
 * virtual memory management, CUDA arrays), pinned host memory, streams with
 * stream capture and events (state only: nothing ever runs), IPC handles,
 * and cuGetProcAddress's versioned lookup of driver entry points. Device
 * memory is never real: the addresses handed out are fake and must never be
 * dereferenced. Pinned host memory is real up to 64 MiB per allocation.
 *
 * Environment (read once, when the library is loaded):
 *   STANDIN_DEVICES          number of devices, 0..8 (default 2)
 *   STANDIN_TOTAL_MIB        memory per device in MiB, 1..262144 (default 16384)
 *   STANDIN_PROCADDR_ALIASES =1: cuGetProcAddress hands out pointers to
 *                            internal forwarding functions instead of the
 *                            exported ones, as real drivers may do
 *   STANDIN_REPORT           =1: print per-device usage to stderr at exit
 *   STANDIN_CONCURRENT_MANAGED
 *                            0 or 1: what cuDeviceGetAttribute reports for
 *                            CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
 *                            (default 1)
 *   STANDIN_POOL_RETAIN      =1: memory pools keep what they reserved in
 *                            POOL_GRANULE steps until a synchronisation
 *                            trims them to their release threshold, like a
 *                            real driver; default 0: every pool's reserve
 *                            follows its live bytes exactly (granule 1, each
 *                            free trimmed at once), the older model
 *   STANDIN_CONTEXT_MIB      MiB each live context counts against its
 *                            device, 0..4096 (default 0)
 *   STANDIN_DRIVER_VERSION   what cuDriverGetVersion reports and the newest
 *                            cudaVersion cuGetProcAddress accepts,
 *                            13000..99999 (default 13000). From 14000 on it
 *                            plays a future driver: cuGetProcAddress answers
 *                            "cuMemAlloc" at 14000 and later with an
 *                            internal function that is none of the
 *                            variants it answers at 13000
 *
 * The other driver names that cudarc loads eagerly are exported as stubs
 * returning CUDA_ERROR_NOT_SUPPORTED; build.sh generates them from
 * stub-names.txt.
 */
#include "cuda_subset.h"
#include "standin_env.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Constants ---------------------------------------------------------- */

#define DRIVER_VERSION 13000          /* what cuDriverGetVersion reports */
#define MIB ((size_t)1 << 20)
#define CTX_STACK_DEPTH 16            /* per-thread context stack */
#define MAX_CREATED_CTX 64            /* live contexts from cuCtxCreate */
#define CTX_SLOTS 1024                /* handles cycle through these */
#define STREAM_SLOTS 1024             /* live streams */
#define POOL_SLOTS 256                /* created memory pools */
#define ARRAY_SLOTS 4096              /* live arrays, and mipmapped arrays */
#define EVENT_SLOTS 4096              /* live events */
#define VMM_GRANULARITY ((size_t)2 << 20) /* cuMemGetAllocationGranularity */
#define VMM_HANDLE_BASE 0x1000ULL     /* first CUmemGenericAllocationHandle */
#define ARRAY_PITCH_ALIGN 512         /* array rows, and their alignment */

/*
 * Fake address layout: device N hands out addresses from its own 1 TiB
 * window starting at ADDR_BASE + N * ADDR_WINDOW. Allocations are 512-byte
 * aligned and placed at increasing addresses; when the window is used up the
 * search wraps to its start and skips live blocks, so a live address is never
 * handed out twice and blocks never overlap.
 */
#define ADDR_BASE 0x7f0000000000ULL
#define ADDR_WINDOW (1ULL << 40)
#define ADDR_ALIGN 512

/*
 * Three more windows, below the devices' ones (so cuMemFree_v2 never takes
 * their addresses for blocks): virtual address ranges from
 * cuMemAddressReserve, pinned host allocations too large to back with real
 * memory (above HOST_BACKED_MAX; their addresses must never be
 * dereferenced), and the pointers that stream-ordered allocation hands out
 * during a stream capture (graph allocations, never backed). All three are
 * handed out in increasing order and never reused.
 */
#define VA_BASE 0x400000000000ULL
#define VA_WINDOW (1ULL << 44)
#define HOST_BASE 0x500000000000ULL
#define HOST_WINDOW (1ULL << 40)
#define HOST_ALIGN 4096               /* fake host addresses: page-aligned */
#define HOST_BACKED_MAX (64 * MIB)    /* larger host allocations are fake */
#define GRAPH_BASE 0x600000000000ULL
#define GRAPH_WINDOW (1ULL << 40)
#define POOL_GRANULE ((size_t)2 << 20) /* pool and graph reserve steps */

/* The argument checks that open most entry points, with the driver's codes. */
#define CHECK(cond, err)                                                      \
    do {                                                                      \
        if (!(cond))                                                          \
            return (err);                                                     \
    } while (0)

/* ---- State ---------------------------------------------------------------- */

/* Configuration, parsed once from the environment. */
static struct {
    int devices;
    size_t total_bytes;   /* per device */
    bool aliases;         /* STANDIN_PROCADDR_ALIASES=1 */
    bool report;          /* STANDIN_REPORT=1 */
    int concurrent_managed; /* STANDIN_CONCURRENT_MANAGED */
    bool pool_retain;     /* STANDIN_POOL_RETAIN=1 */
    size_t context_bytes; /* STANDIN_CONTEXT_MIB, in bytes */
    int driver_version;   /* STANDIN_DRIVER_VERSION */
} g_cfg;
static pthread_once_t g_cfg_once = PTHREAD_ONCE_INIT;

/*
 * A context object: one primary context per device (g_ctx, permanent
 * handles; active while retained) and up to MAX_CREATED_CTX live contexts
 * from cuCtxCreate (g_created). Created handles are taken round-robin from
 * CTX_SLOTS slots, so a destroyed handle stays invalid for a long time
 * before its slot is reused. live is only used by created contexts and is
 * protected by g_lock.
 */
struct CUctx_st {
    CUdevice dev;
    bool live;
};
static struct CUctx_st g_ctx[MAX_DEVICES];
static struct CUctx_st g_created[CTX_SLOTS];
static size_t g_created_next;  /* where the search for a free slot starts */
static int g_created_live;     /* live created contexts */

/*
 * A memory pool: one default pool per device (g_default_pools, permanent)
 * and up to POOL_SLOTS pools from cuMemPoolCreate (g_pools). A pool
 * reserves memory from its device (reserved, which is what counts against
 * the device) and hands it out to its allocations (used, their bytes; no
 * fragmentation). An allocation first takes the free reserve (reserved -
 * used); what is missing grows the reserve, rounded up to the pool
 * granule (POOL_GRANULE with STANDIN_POOL_RETAIN=1, else 1 byte). Frees
 * lower used only; synchronisations trim the reserve (see
 * pool_trim_locked). A destroyed pool's slot is reused only once its last
 * allocation is freed. Protected by g_lock.
 */
struct CUmemPoolHandle_st {
    int dev;
    bool live;            /* created and not destroyed (default: always) */
    size_t used;          /* bytes of its live allocations */
    size_t peak;          /* high-water mark of used since the last reset */
    size_t reserved;      /* bytes it holds of its device */
    size_t reserved_peak; /* high-water mark of reserved since the last reset */
    size_t max_size;      /* CUmemPoolProps.maxSize; 0: only the device's */
    int reuse[3];         /* CU_MEMPOOL_ATTR_REUSE_* (attributes 1..3) */
    cuuint64_t release_threshold;
};
static struct CUmemPoolHandle_st g_default_pools[MAX_DEVICES];
static struct CUmemPoolHandle_st g_pools[POOL_SLOTS];
static size_t g_pools_next;

/* One allocation. */
struct block {
    CUdeviceptr addr;     /* start address (512-aligned) */
    size_t span;          /* address space reserved: bytes rounded up to 512 */
    size_t bytes;         /* bytes accounted against the device */
    CUcontext owner;      /* the context current when it was allocated;
                             NULL for pool allocations (the device's) */
    CUmemoryPool pool;    /* stream-ordered: the pool it came from */
    bool ipc;             /* cuMemAlloc_v2 / cuMemAllocPitch_v2: exportable */
    bool managed;         /* cuMemAllocManaged */
    bool on_host;         /* managed, advised to prefer the host: its bytes
                             count in managed_host, not used */
    unsigned int accessed_by; /* managed: advised accessors, bit N device N,
                                 bit MAX_DEVICES the host */
    bool live;            /* false: freed, awaiting removal from the array */
};

/*
 * A CUDA array or mipmapped array, owned by the context current when it was
 * created. size is what cu*GetMemoryRequirements report, bytes what counts
 * against the device (0 for sparse and deferred-mapping arrays, which have
 * no backing memory of their own). Slots are taken round-robin like stream
 * handles. Protected by g_lock.
 */
struct array_state {
    CUcontext owner;
    size_t size;
    size_t bytes;
    bool live;
};
struct CUarray_st {
    struct array_state a;
};
struct CUmipmappedArray_st {
    struct array_state a;
};
static struct CUarray_st g_arrays[ARRAY_SLOTS];
static struct CUmipmappedArray_st g_mipmaps[ARRAY_SLOTS];
static size_t g_arrays_next, g_mipmaps_next;

/*
 * Virtual memory management, protected by g_lock. An allocation from
 * cuMemCreate (g_vmm_allocs, never reused) counts against its device (or
 * nothing, on the host) until no handle references it and no mapping uses
 * it. Handle values are VMM_HANDLE_BASE + index into g_vmm_handles; each
 * names one allocation (several may: cuMemImportFromShareableHandle). A
 * handle is valid while its allocation's reference count is above 0.
 */
struct vmm_alloc {
    int dev;              /* -1: host memory, counted against nothing */
    size_t size;
    long refs;            /* create, retain, import: +1; release: -1 */
    long maps;            /* live mappings of it */
    bool live;            /* false: its memory went back */
    uint32_t tag;         /* its contents: every 32-bit word holds tag (see
                             "Kernels and copies") */
};
struct vmm_map {          /* a cuMemMap'ed range */
    CUdeviceptr va;
    size_t size;
    CUmemGenericAllocationHandle handle; /* the handle it was mapped with */
    /* cuMemSetAccess's flags for each device (none until granted; a
       mapping made afresh has none, as on the real driver) */
    unsigned char access[MAX_DEVICES];
};
struct va_range {         /* a cuMemAddressReserve'd range */
    CUdeviceptr va;
    size_t size;
};
static struct vmm_alloc *g_vmm_allocs;
static size_t g_vmm_nallocs, g_vmm_allocs_cap;
static size_t *g_vmm_handles;             /* handle index -> allocation */
static size_t g_vmm_nhandles, g_vmm_handles_cap;
static struct vmm_map *g_vmm_maps;        /* live mappings, unordered */
static size_t g_vmm_nmaps, g_vmm_maps_cap;
static struct va_range *g_va_ranges;      /* live reservations, unordered */
static size_t g_va_nranges, g_va_ranges_cap;
static CUdeviceptr g_va_next = VA_BASE;   /* next reservation address */
static CUdeviceptr g_graph_next = GRAPH_BASE; /* next graph allocation */

/*
 * A stream from cuStreamCreate, owned by the context current at creation;
 * ctx == NULL marks a free slot. Protected by g_lock. Handles are taken
 * round-robin like those of created contexts.
 */
struct CUstream_st {
    CUcontext ctx;
    unsigned int flags;
    CUstreamCaptureStatus capture;
    CUgraph graph;        /* while capturing: the graph being built */
};
static struct CUstream_st g_streams[STREAM_SLOTS];
static size_t g_streams_next;

/*
 * An event from cuEventCreate, owned by the context current at creation;
 * ctx == NULL marks a free slot. Nothing runs on streams, so a recorded
 * event is complete at once, and so is one never recorded. Protected by
 * g_lock; handles are taken round-robin like stream handles.
 */
struct CUevent_st {
    CUcontext ctx;
    unsigned int flags;   /* CUevent_flags, only stored */
};
static struct CUevent_st g_events[EVENT_SLOTS];
static size_t g_events_next;

/*
 * Pinned host allocations (cuMemHostAlloc, cuMemAllocHost_v2), live ones
 * only, unordered; protected by g_lock. They count against no device and
 * belong to the process, not a context. Up to HOST_BACKED_MAX bytes they are
 * real (calloc); larger ones get a fake address from the host window.
 */
struct host_alloc {
    uintptr_t addr;
    size_t bytes;
    unsigned int flags;   /* CU_MEMHOSTALLOC_* */
    bool backed;          /* addr is calloc'ed memory */
    bool registered;      /* the program's own memory, cuMemHostRegister'ed */
};
static struct host_alloc *g_host_allocs;
static size_t g_host_nallocs, g_host_allocs_cap;
static size_t g_host_bytes;               /* sum of their bytes */
static uintptr_t g_host_next = HOST_BASE; /* next fake host address */

/*
 * Graphs, protected by g_lock. A graph (cuGraphCreate, or the one a stream
 * capture builds) holds nodes of four kinds: memory allocation, memory
 * free, child graph and kernel nodes (a launch on a capturing stream makes
 * one, with a copy of its parameters; a launch of the executable graph runs
 * them as launches run). A child graph node owns a clone of its graph
 * (owner set). Every allocation node gets a fixed address from the graph
 * window and an entry in g_gallocs (never removed, the window is never
 * reused), which says whether a launch made it live. An executable graph
 * lists the allocations (entries of g_gallocs) and frees (addresses) of its
 * graph, child graphs included. Live graphs and executable graphs are
 * registered in g_graphs / g_execs so that handles can be checked.
 */
struct CUgraphNode_st {
    CUgraph graph;               /* the graph it belongs to */
    CUgraphNodeType type;        /* MEM_ALLOC, MEM_FREE or GRAPH */
    CUdeviceptr dptr;            /* allocation: its address; free: freed */
    size_t bytes;                /* allocation: its size */
    size_t galloc;               /* allocation: its entry in g_gallocs */
    CUmemPoolProps props;        /* allocation: as given */
    CUmemAccessDesc *access;     /* allocation: a copy of accessDescs */
    size_t naccess;
    CUgraph child;               /* child graph node: the graph it owns */
    CUfunction func;             /* kernel: the function and its words */
    int nparams;
    CUdeviceptr words[8];
    void *wptrs[8];              /* kernel: &words[i], as kernelParams */
};
struct CUgraph_st {
    CUgraphNode *nodes;
    size_t nnodes, cap;
    CUgraphNode owner;           /* the child graph node owning it, if any */
    int execs;                   /* live executable graphs made from it */
};
struct CUgraphExec_st {
    CUgraph graph;               /* NULL once the graph is destroyed */
    unsigned long long flags;    /* CUDA_GRAPH_INSTANTIATE_FLAG_* */
    size_t *allocs;              /* entries of g_gallocs */
    size_t nallocs;
    CUdeviceptr *frees;
    size_t nfrees;
    struct exec_kernel *kernels; /* kernel nodes, child graphs included */
    size_t nkernels;
};
/* A kernel node as instantiated: the node it was made from, its function
 * and parameter words. */
struct exec_kernel {
    CUgraphNode node;
    struct CUfunc_st *func;
    int nparams;
    CUdeviceptr words[8];
};
struct galloc {
    CUdeviceptr addr;
    size_t bytes;
    int dev;
    bool live;                   /* allocated by a launch, not yet freed */
};
static struct galloc *g_gallocs;
static size_t g_ngallocs, g_gallocs_cap;
static CUgraph *g_graphs;
static size_t g_ngraphs, g_graphs_cap;
static CUgraphExec *g_execs;
static size_t g_nexecs, g_execs_cap;

static CUresult graph_alloc_node_locked(CUgraph g, size_t bytes,
                                        const CUmemPoolProps *props,
                                        const CUmemAccessDesc *access,
                                        size_t naccess, CUgraphNode *out);
static CUresult graph_free_node_locked(CUgraph g, CUdeviceptr dptr,
                                       CUgraphNode *out);
static long galloc_index_locked(CUdeviceptr addr);
static void galloc_free_locked(size_t i);

/*
 * Per-device bookkeeping, protected by g_lock.
 *
 * blocks is sorted by address and its ranges never overlap. Freeing only
 * marks a block dead (a binary search, no memmove); dead blocks are dropped
 * when a new block is placed over them or, in bulk, once they are more than
 * half of the array. Without wrap-around new blocks are appended, so
 * allocation and free are O(log n) amortized even with millions of blocks.
 */
struct device_state {
    struct block *blocks;
    size_t nblocks;       /* entries in blocks, live and dead */
    size_t ndead;         /* dead entries in blocks */
    size_t cap;
    CUdeviceptr next;     /* where the next address search starts */
    size_t used;          /* sum of live blocks' bytes (not those of managed
                             blocks preferring the host) */
    size_t peak;          /* high-water mark of used */
    size_t managed_host;  /* live managed bytes preferring the host */
    unsigned long allocs; /* successful allocations */
    unsigned long frees;  /* successful frees */
    int primary_refs;     /* primary context retain count */
    struct CUmemPoolHandle_st *mempool; /* current pool (cuDeviceSetMemPool) */
    size_t graph_reserved; /* graph memory pool: bytes held (in used) */
    size_t graph_used;     /* bytes of live graph allocations */
    size_t graph_reserved_peak, graph_used_peak;
    size_t watch;          /* 0, or a limit: see vramcap_standin_watch */
    unsigned long past_watch; /* charges that took used past watch */
};
static struct device_state g_dev[MAX_DEVICES];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static atomic_bool g_initialized;          /* cuInit succeeded */
static atomic_ulong g_getprocaddress_calls; /* calls of either resolver */
static atomic_ulong g_alias_calls;         /* calls through alias pointers */
static atomic_ulong g_sync_calls;          /* cuCtxSynchronize calls */
static atomic_ulong g_captures;            /* stream captures begun */
static atomic_ulong g_ipc_calls;           /* cuIpcGetMemHandle calls */
static atomic_ulong g_async_allocs;        /* stream-ordered allocations */
static atomic_ulong g_vmm_creates;         /* cuMemCreate on a device */
static atomic_ulong g_vmm_host_creates;    /* cuMemCreate on the host */
static atomic_ulong g_host_registers;      /* cuMemHostRegister calls that pinned */
static atomic_ulong g_array_creates;       /* arrays of all three kinds */
static atomic_ulong g_event_records;       /* successful cuEventRecord(_ptsz) */
static atomic_ulong g_launches;            /* successful kernel launches */
static atomic_ulong g_faults;              /* launches or copies that named an
                                              address reserved but unmapped */

/*
 * The calling thread's context stack; the top (t_stack[t_depth - 1]) is its
 * current context, none when t_depth is 0.
 */
static _Thread_local CUcontext t_stack[CTX_STACK_DEPTH];
static _Thread_local int t_depth;

/* ---- Configuration -------------------------------------------------------- */

static bool env_flag(const char *name)
{
    const char *s = getenv(name);
    return s != NULL && strcmp(s, "1") == 0;
}

static void config_init(void)
{
    g_cfg.devices = (int)env_long("STANDIN_DEVICES", DEFAULT_DEVICES, 0,
                                  MAX_DEVICES, true);
    g_cfg.total_bytes = (size_t)env_long("STANDIN_TOTAL_MIB", DEFAULT_TOTAL_MIB,
                                         1, MAX_TOTAL_MIB, true) * MIB;
    g_cfg.aliases = env_flag("STANDIN_PROCADDR_ALIASES");
    g_cfg.report = env_flag("STANDIN_REPORT");
    g_cfg.concurrent_managed = (int)env_long("STANDIN_CONCURRENT_MANAGED", 1,
                                             0, 1, true);
    g_cfg.pool_retain = env_flag("STANDIN_POOL_RETAIN");
    g_cfg.context_bytes = (size_t)env_long("STANDIN_CONTEXT_MIB", 0, 0, 4096,
                                           true) * MIB;
    g_cfg.driver_version = (int)env_long("STANDIN_DRIVER_VERSION",
                                         DRIVER_VERSION, DRIVER_VERSION, 99999,
                                         true);
    for (int i = 0; i < MAX_DEVICES; i++) {
        g_ctx[i].dev = i;
        g_dev[i].next = ADDR_BASE + (CUdeviceptr)i * ADDR_WINDOW;
        g_default_pools[i] = (struct CUmemPoolHandle_st){
            .dev = i, .live = true, .reuse = { 1, 1, 1 } };
        g_dev[i].mempool = &g_default_pools[i];
    }
}

/*
 * Parse the configuration exactly once (pthread_once makes this thread-safe).
 * The constructor does it at load time; cuInit, the resolvers and the
 * inspection exports call it too, so the order of constructors across
 * libraries does not matter. Every other entry point needs cuInit first.
 */
static void config(void)
{
    pthread_once(&g_cfg_once, config_init);
}

__attribute__((constructor)) static void standin_load(void)
{
    config();
}

__attribute__((destructor)) static void standin_unload(void)
{
    if (!g_cfg.report)
        return;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_cfg.devices; i++)
        fprintf(stderr, "standin: dev=%d used=%zu peak=%zu allocs=%lu frees=%lu\n",
                i, g_dev[i].used, g_dev[i].peak, g_dev[i].allocs,
                g_dev[i].frees);
    pthread_mutex_unlock(&g_lock);
}

/* ---- Helpers -------------------------------------------------------------- */

static bool checkpoint_gate(void); /* checkpoint_standin.c */

static bool initialized(void)
{
    return checkpoint_gate() && atomic_load(&g_initialized);
}

static bool valid_device(CUdevice dev)
{
    return dev >= 0 && dev < g_cfg.devices;
}

/* The calling thread's current context, or NULL if there is none. */
static CUcontext current_ctx(void)
{
    return t_depth > 0 ? t_stack[t_depth - 1] : NULL;
}

/* Device of the calling thread's current context, or -1 if there is none. */
static int current_device(void)
{
    CUcontext ctx = current_ctx();
    return ctx != NULL ? ctx->dev : -1;
}

/*
 * Index of p in the array base of n elements of size elem, or -1 if p does
 * not point at one of them (compared as integers: p may be any value).
 */
static long array_index(const void *p, const void *base, size_t n, size_t elem)
{
    uintptr_t u = (uintptr_t)p, b = (uintptr_t)base;
    if (u < b || u - b >= n * elem || (u - b) % elem != 0)
        return -1;
    return (long)((u - b) / elem);
}

/*
 * The round-robin handle tables (created contexts, streams, events, pools,
 * arrays): the index of the first slot from *next on, wrapping, that is_free
 * accepts, and *next moves past it; -1 when there is none (*next unchanged).
 * arg is handed to is_free. Caller holds g_lock.
 */
static long take_slot_locked(size_t *next, size_t nslots,
                             bool (*is_free)(size_t i, const void *arg),
                             const void *arg)
{
    for (size_t n = 0; n < nslots; n++) {
        size_t i = (*next + n) % nslots;
        if (is_free(i, arg)) {
            *next = (i + 1) % nslots;
            return (long)i;
        }
    }
    return -1;
}

/* True if ctx is the primary context handle of a simulated device. */
static bool is_primary(CUcontext ctx)
{
    long i = array_index(ctx, g_ctx, MAX_DEVICES, sizeof g_ctx[0]);
    return i >= 0 && i < g_cfg.devices;
}

/* True if ctx is a created context handle (live or destroyed). */
static bool is_created(CUcontext ctx)
{
    return array_index(ctx, g_created, CTX_SLOTS, sizeof g_created[0]) >= 0;
}

/*
 * True if ctx names a context that exists: a primary context (active or not)
 * or a created context not yet destroyed. Caller holds g_lock.
 */
static bool ctx_exists_locked(CUcontext ctx)
{
    return is_primary(ctx) || (is_created(ctx) && ctx->live);
}

static bool ctx_exists(CUcontext ctx)
{
    if (is_primary(ctx))
        return true;
    pthread_mutex_lock(&g_lock);
    bool exists = ctx_exists_locked(ctx);
    pthread_mutex_unlock(&g_lock);
    return exists;
}

/*
 * The calling thread's current context for an entry point that needs one:
 * CUDA_ERROR_INVALID_CONTEXT if there is none, CUDA_ERROR_CONTEXT_IS_DESTROYED
 * if it is a created context that was destroyed since it was made current
 * (by another thread, or lower in this thread's stack).
 */
static CUresult check_current(CUcontext *out)
{
    CUcontext ctx = current_ctx();
    if (ctx == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx_exists(ctx))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    *out = ctx;
    return CUDA_SUCCESS;
}

/*
 * Whether ctx can allocate: a created context that still exists, or a
 * primary context that is active (retained). Caller holds g_lock.
 */
static bool ctx_usable_locked(CUcontext ctx)
{
    if (is_primary(ctx))
        return g_dev[ctx->dev].primary_refs > 0;
    return is_created(ctx) && ctx->live;
}

/* Index of the first block of d that ends after addr (d->nblocks if none). */
static size_t first_block_ending_after(const struct device_state *d,
                                       CUdeviceptr addr)
{
    size_t lo = 0, hi = d->nblocks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->blocks[mid].addr + d->blocks[mid].span > addr)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/*
 * Find room for span bytes in device dev's address window. On success stores
 * the address, and the range [*first, *last) of dead blocks to replace with
 * the new block (empty: insert at *first) so that blocks stays sorted.
 * Caller holds g_lock.
 */
static bool find_address(int dev, size_t span, CUdeviceptr *addr,
                         size_t *first, size_t *last)
{
    struct device_state *d = &g_dev[dev];
    const CUdeviceptr base = ADDR_BASE + (CUdeviceptr)dev * ADDR_WINDOW;
    const CUdeviceptr end = base + ADDR_WINDOW;
    CUdeviceptr cand = d->next;
    bool wrapped = false;

    for (;;) {
        if (cand > end || span > end - cand) {
            /* Past the end of the window: search once more from its start. */
            if (wrapped)
                return false;
            wrapped = true;
            cand = base;
            continue;
        }
        /* The first live block that ends after cand must start after us. */
        size_t i = first_block_ending_after(d, cand);
        size_t j = i;
        while (j < d->nblocks && !d->blocks[j].live)
            j++;
        if (j == d->nblocks || d->blocks[j].addr >= cand + span) {
            *addr = cand;
            *first = i;
            *last = j;
            return true;
        }
        /* Overlaps live block j: try right after it. */
        cand = d->blocks[j].addr + d->blocks[j].span;
    }
}

/* Put b into d->blocks in place of the dead blocks [first, last). */
static bool insert_block(struct device_state *d, size_t first, size_t last,
                         struct block b)
{
    if (last > first) {
        /* Reuse the first dead entry and drop the others. */
        d->blocks[first] = b;
        memmove(&d->blocks[first + 1], &d->blocks[last],
                (d->nblocks - last) * sizeof d->blocks[0]);
        d->nblocks -= last - first - 1;
        d->ndead -= last - first;
        return true;
    }
    if (d->nblocks == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 256;
        struct block *grown = realloc(d->blocks, cap * sizeof *grown);
        if (grown == NULL)
            return false;
        d->blocks = grown;
        d->cap = cap;
    }
    memmove(&d->blocks[first + 1], &d->blocks[first],
            (d->nblocks - first) * sizeof d->blocks[0]);
    d->blocks[first] = b;
    d->nblocks++;
    return true;
}

/* Drop all dead blocks from d->blocks. */
static void compact_blocks(struct device_state *d)
{
    size_t n = 0;
    for (size_t i = 0; i < d->nblocks; i++)
        if (d->blocks[i].live)
            d->blocks[n++] = d->blocks[i];
    d->nblocks = n;
    d->ndead = 0;
}

static void pool_after_free_locked(struct CUmemPoolHandle_st *p);

/*
 * Mark block i of d freed: a pool allocation goes back to its pool (whose
 * reserve is what counts against the device), any other block counts as a
 * free; managed memory preferring the host leaves managed_host instead of
 * used. Caller holds g_lock.
 */
static void free_block_locked(struct device_state *d, size_t i)
{
    struct block *b = &d->blocks[i];
    b->live = false;
    d->ndead++;
    if (b->pool != NULL) {
        b->pool->used -= b->bytes;
        pool_after_free_locked(b->pool);
        return;
    }
    if (b->on_host)
        d->managed_host -= b->bytes;
    else
        d->used -= b->bytes;
    d->frees++;
}

/* Compact d->blocks once dead blocks are most of it. Caller holds g_lock. */
static void maybe_compact(struct device_state *d)
{
    if (d->ndead > 64 && d->ndead > d->nblocks / 2)
        compact_blocks(d);
}

/* Destroy a live array owned by ctx, returning its bytes. Holds g_lock. */
static void release_array_locked(struct array_state *a, CUcontext ctx)
{
    if (a->live && a->owner == ctx) {
        g_dev[ctx->dev].used -= a->bytes;
        a->live = false;
    }
}

static void graph_free_locked(CUgraph g);

/* Free a stream slot, and the graph of a capture still in progress. */
static void destroy_stream_locked(struct CUstream_st *s)
{
    if (s->graph != NULL)
        graph_free_locked(s->graph);
    *s = (struct CUstream_st){ 0 };
}

/*
 * Release everything ctx owns: its live allocations (each counted as a
 * free), its arrays, its streams (ending any capture on them) and its
 * events. Pool allocations and cuMemCreate memory belong to the device, not
 * a context, and pinned host memory to the process; they stay. Used when a
 * context is destroyed and when a primary context is deactivated or reset.
 * Caller holds g_lock.
 */
static void release_ctx_locked(CUcontext ctx)
{
    struct device_state *d = &g_dev[ctx->dev];
    for (size_t i = 0; i < d->nblocks; i++)
        if (d->blocks[i].live && d->blocks[i].owner == ctx)
            free_block_locked(d, i);
    maybe_compact(d);
    for (size_t i = 0; i < ARRAY_SLOTS; i++) {
        release_array_locked(&g_arrays[i].a, ctx);
        release_array_locked(&g_mipmaps[i].a, ctx);
    }
    for (size_t i = 0; i < STREAM_SLOTS; i++)
        if (g_streams[i].ctx == ctx)
            destroy_stream_locked(&g_streams[i]);
    for (size_t i = 0; i < EVENT_SLOTS; i++)
        if (g_events[i].ctx == ctx)
            g_events[i] = (struct CUevent_st){ 0 };
}

/* Device dev's free bytes: its total less this process's use and what
 * other processes hold (STANDIN_FOREIGN_FILE, read at each call, as the
 * checkpoint model's restore and the NVML stand-in read it). Caller holds
 * g_lock. */
static size_t free_locked(int dev)
{
    size_t held = g_dev[dev].used + (size_t)standin_foreign_bytes();
    return held >= g_cfg.total_bytes ? 0 : g_cfg.total_bytes - held;
}

/* Whether bytes more fit on device dev. Caller holds g_lock. */
static bool fits_locked(int dev, size_t bytes)
{
    return bytes <= free_locked(dev);
}

/* Count bytes (known to fit) against device dev. Caller holds g_lock. */
static void charge_locked(int dev, size_t bytes)
{
    struct device_state *d = &g_dev[dev];
    d->used += bytes;
    if (d->used > d->peak)
        d->peak = d->used;
    if (d->watch != 0 && bytes > 0 && d->used > d->watch)
        d->past_watch++;
}

/*
 * Give block b (its bytes, span, owner and kind set) an address in device
 * dev's window and count it, storing the address in *out. False if it does
 * not fit. A pool block counts nothing here: its pool's reserve does.
 * Caller holds g_lock.
 */
static bool place_block_locked(int dev, struct block b, CUdeviceptr *out)
{
    struct device_state *d = &g_dev[dev];
    size_t first, last;
    size_t charge = b.pool != NULL ? 0 : b.bytes;
    if (!fits_locked(dev, charge) ||
        !find_address(dev, b.span, &b.addr, &first, &last))
        return false;
    b.live = true;
    if (!insert_block(d, first, last, b))
        return false;
    d->next = b.addr + b.span;
    charge_locked(dev, charge);
    *out = b.addr;
    return true;
}

/*
 * Account bytes (reserving span bytes of address space) on the device of
 * context ctx, owned by ctx, and return the new block's address. Returns
 * CUDA_SUCCESS, CUDA_ERROR_CONTEXT_IS_DESTROYED (ctx destroyed, or an
 * inactive primary context) or CUDA_ERROR_OUT_OF_MEMORY.
 */
static CUresult account_alloc(CUcontext ctx, size_t bytes, size_t span,
                              bool ipc, bool managed, CUdeviceptr *out)
{
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;

    pthread_mutex_lock(&g_lock);
    if (!ctx_usable_locked(ctx)) {
        rc = CUDA_ERROR_CONTEXT_IS_DESTROYED;
    } else if (place_block_locked(ctx->dev,
                                  (struct block){ .span = span, .bytes = bytes,
                                                  .owner = ctx, .ipc = ipc,
                                                  .managed = managed },
                                  out)) {
        g_dev[ctx->dev].allocs++;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/*
 * Common path of the cuMemAlloc family; ipc: the block may be exported with
 * cuIpcGetMemHandle; managed: from cuMemAllocManaged.
 */
static CUresult alloc_common(CUdeviceptr *dptr, size_t bytes, size_t span,
                             bool ipc, bool managed)
{
    CUcontext ctx = current_ctx();
    if (ctx == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return account_alloc(ctx, bytes, span, ipc, managed, dptr);
}

static size_t round_up(size_t n, size_t align)
{
    return (n + align - 1) / align * align;
}

/* Span for a plain allocation of bytes, or 0 if it cannot possibly fit. */
static size_t span_for(size_t bytes)
{
    return bytes > g_cfg.total_bytes ? 0 : round_up(bytes, ADDR_ALIGN);
}

/* ---- Pool reserves ------------------------------------------------------- */

/* The step in which pools grow: POOL_GRANULE, or 1 in the older model. */
static size_t pool_granule(void)
{
    return g_cfg.pool_retain ? POOL_GRANULE : 1;
}

/*
 * Make room in p for an allocation of bytes (at most the device's total):
 * take the free reserve, grow by what is missing rounded up to the granule.
 * False, and nothing changed, when the growth does not fit on the device or
 * would take the reserve past the pool's maxSize. Caller holds g_lock.
 */
static bool pool_reserve_locked(struct CUmemPoolHandle_st *p, size_t bytes)
{
    size_t free_reserve = p->reserved - p->used;
    if (bytes <= free_reserve)
        return true;
    size_t grow = round_up(bytes - free_reserve, pool_granule());
    if (p->max_size != 0 &&
        (p->reserved > p->max_size || grow > p->max_size - p->reserved))
        return false;
    if (!fits_locked(p->dev, grow))
        return false;
    charge_locked(p->dev, grow);
    p->reserved += grow;
    if (p->reserved > p->reserved_peak)
        p->reserved_peak = p->reserved;
    return true;
}

/*
 * Release p's reserve down to max(used, keep), both rounded up to the
 * granule; never grows it. This is cuMemPoolTrimTo(keep) (the real driver
 * releases until fewer than keep bytes would remain, or nothing unused is
 * left) and the trim at a synchronisation (keep: the release threshold).
 * Caller holds g_lock.
 */
static void pool_trim_locked(struct CUmemPoolHandle_st *p, cuuint64_t keep)
{
    size_t g = pool_granule();
    size_t target = round_up(p->used, g);
    if (keep > target)
        target = keep >= p->reserved ? p->reserved : round_up((size_t)keep, g);
    if (target >= p->reserved)
        return;
    g_dev[p->dev].used -= p->reserved - target;
    p->reserved = target;
}

/*
 * After a free from p: a destroyed pool gives back what its live
 * allocations no longer need at once; in the older model every pool trims
 * to its threshold at once (its frees complete and are seen at once).
 */
static void pool_after_free_locked(struct CUmemPoolHandle_st *p)
{
    if (!p->live)
        pool_trim_locked(p, 0);
    else if (!g_cfg.pool_retain)
        pool_trim_locked(p, p->release_threshold);
}

/*
 * A synchronisation on device dev: every pool of the device has seen its
 * frees complete (nothing is ever pending here) and trims to its release
 * threshold. Graph memory is not trimmed (cuDeviceGraphMemTrim does that).
 * Caller holds g_lock.
 */
static void sync_pools_locked(int dev)
{
    pool_trim_locked(&g_default_pools[dev],
                     g_default_pools[dev].release_threshold);
    for (size_t i = 0; i < POOL_SLOTS; i++) {
        struct CUmemPoolHandle_st *p = &g_pools[i];
        if (p->dev == dev && (p->live || p->reserved > 0))
            pool_trim_locked(p, p->live ? p->release_threshold : 0);
    }
}

/* ---- Context footprint ---------------------------------------------------- */

/* Count a new context's footprint on dev; false if it does not fit. */
static bool ctx_charge_locked(int dev)
{
    if (!fits_locked(dev, g_cfg.context_bytes))
        return false;
    charge_locked(dev, g_cfg.context_bytes);
    return true;
}

static void ctx_uncharge_locked(int dev)
{
    g_dev[dev].used -= g_cfg.context_bytes;
}

/* ---- Initialization and version ------------------------------------------ */

/*
 * Each entry point is followed by LOCAL(name): a hidden alias with the same
 * address. The stand-in refers to its own functions only through these, so an
 * LD_PRELOADed library that exports the same names (the vramcap shim) can not
 * interpose on the stand-in's internal references. In particular,
 * cuGetProcAddress really returns the stand-in's functions.
 */
#define LOCAL(name) \
    extern __typeof__(name) local_##name \
        __attribute__((alias(#name), visibility("hidden")));

/*
 * An entry point and its per-thread default stream twin NAME_ptsz (each with
 * its LOCAL alias), taking the parameters PARAMS: both return IMPL(ARGS...,
 * ptsz), with ptsz false for NAME and true for NAME_ptsz.
 */
#define WITH_PTSZ(name, params, impl, ...)                                    \
    CUresult name params { return impl(__VA_ARGS__, false); }                 \
    LOCAL(name)                                                               \
    CUresult name##_ptsz params { return impl(__VA_ARGS__, true); }           \
    LOCAL(name##_ptsz)

CUresult cuInit(unsigned int flags)
{
    config();
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (g_cfg.devices == 0)
        return CUDA_ERROR_NO_DEVICE;
    atomic_store(&g_initialized, true);
    return CUDA_SUCCESS;
}
LOCAL(cuInit)

CUresult cuDriverGetVersion(int *driverVersion)
{
    if (driverVersion == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    config();
    *driverVersion = g_cfg.driver_version;
    return CUDA_SUCCESS;
}
LOCAL(cuDriverGetVersion)

/* ---- Devices -------------------------------------------------------------- */

CUresult cuDeviceGetCount(int *count)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(count != NULL, CUDA_ERROR_INVALID_VALUE);
    *count = g_cfg.devices;
    return CUDA_SUCCESS;
}
LOCAL(cuDeviceGetCount)

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(device != NULL, CUDA_ERROR_INVALID_VALUE);
    CHECK(valid_device(ordinal), CUDA_ERROR_INVALID_DEVICE);
    *device = ordinal;
    return CUDA_SUCCESS;
}
LOCAL(cuDeviceGet)

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    CHECK(valid_device(dev), CUDA_ERROR_INVALID_DEVICE);
    snprintf(name, (size_t)len, "vramcap stand-in %d", dev);
    return CUDA_SUCCESS;
}
LOCAL(cuDeviceGetName)

/* UUID of device dev: GPU-5ca1ab1e-0000-4000-8000-00000000000N. */
static CUresult device_uuid(CUuuid *uuid, CUdevice dev)
{
    static const unsigned char tmpl[16] = {
        0x5c, 0xa1, 0xab, 0x1e, 0x00, 0x00, 0x40, 0x00,
        0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    };
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(uuid != NULL, CUDA_ERROR_INVALID_VALUE);
    CHECK(valid_device(dev), CUDA_ERROR_INVALID_DEVICE);
    memcpy(uuid->bytes, tmpl, sizeof tmpl);
    uuid->bytes[15] = (char)dev;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return device_uuid(uuid, dev);
}
LOCAL(cuDeviceGetUuid)

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return device_uuid(uuid, dev);
}
LOCAL(cuDeviceGetUuid_v2)

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(bytes != NULL, CUDA_ERROR_INVALID_VALUE);
    CHECK(valid_device(dev), CUDA_ERROR_INVALID_DEVICE);
    *bytes = g_cfg.total_bytes;
    return CUDA_SUCCESS;
}
LOCAL(cuDeviceTotalMem_v2)

/*
 * Every attribute of every device reads as 1, except
 * CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: STANDIN_CONCURRENT_MANAGED.
 */
CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(pi != NULL, CUDA_ERROR_INVALID_VALUE);
    CHECK(valid_device(dev), CUDA_ERROR_INVALID_DEVICE);
    *pi = attrib == CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
              ? g_cfg.concurrent_managed
              : 1;
    return CUDA_SUCCESS;
}
LOCAL(cuDeviceGetAttribute)

/* ---- Contexts ------------------------------------------------------------- */

/*
 * Primary contexts are static objects that live as long as the library, so a
 * primary context keeps its handle. Retain counts a reference and activates
 * it; releasing the last reference (or cuDevicePrimaryCtxReset_v2)
 * deactivates it and releases everything it owns, like the real driver. An
 * inactive primary context may still be current; allocating in it gives
 * CUDA_ERROR_CONTEXT_IS_DESTROYED until it is retained again.
 */
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(pctx != NULL, CUDA_ERROR_INVALID_VALUE);
    CHECK(valid_device(dev), CUDA_ERROR_INVALID_DEVICE);
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_dev[dev].primary_refs > 0 || ctx_charge_locked(dev))
        g_dev[dev].primary_refs++;
    else
        rc = CUDA_ERROR_OUT_OF_MEMORY; /* no room for its footprint */
    pthread_mutex_unlock(&g_lock);
    if (rc == CUDA_SUCCESS)
        *pctx = &g_ctx[dev];
    return rc;
}
LOCAL(cuDevicePrimaryCtxRetain)

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(valid_device(dev), CUDA_ERROR_INVALID_DEVICE);
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_dev[dev].primary_refs > 0) {
        if (--g_dev[dev].primary_refs == 0) {
            release_ctx_locked(&g_ctx[dev]);
            ctx_uncharge_locked(dev);
        }
    } else {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuDevicePrimaryCtxRelease_v2)

/* Flags are always 0 (cuDevicePrimaryCtxSetFlags is a stub). */
CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags,
                                    int *active)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(flags != NULL && active != NULL, CUDA_ERROR_INVALID_VALUE);
    CHECK(valid_device(dev), CUDA_ERROR_INVALID_DEVICE);
    pthread_mutex_lock(&g_lock);
    *active = g_dev[dev].primary_refs > 0;
    pthread_mutex_unlock(&g_lock);
    *flags = 0;
    return CUDA_SUCCESS;
}
LOCAL(cuDevicePrimaryCtxGetState)

/* Releases everything the primary context owns and deactivates it. */
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(valid_device(dev), CUDA_ERROR_INVALID_DEVICE);
    pthread_mutex_lock(&g_lock);
    release_ctx_locked(&g_ctx[dev]);
    if (g_dev[dev].primary_refs > 0)
        ctx_uncharge_locked(dev);
    g_dev[dev].primary_refs = 0;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}
LOCAL(cuDevicePrimaryCtxReset_v2)

static bool created_slot_free(size_t i, const void *arg)
{
    (void)arg;
    return !g_created[i].live;
}

/*
 * A new context, pushed onto the calling thread's stack. Execution affinity
 * and CIG parameters are not modelled (CUDA_ERROR_NOT_SUPPORTED); a full
 * context stack gives CUDA_ERROR_INVALID_VALUE and MAX_CREATED_CTX live
 * contexts CUDA_ERROR_OUT_OF_MEMORY.
 */
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                        unsigned int flags, CUdevice dev)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (pctx == NULL || (flags & ~(unsigned int)CU_CTX_FLAGS_MASK) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (ctxCreateParams != NULL &&
        (ctxCreateParams->numExecAffinityParams != 0 ||
         ctxCreateParams->execAffinityParams != NULL ||
         ctxCreateParams->cigParams != NULL))
        return CUDA_ERROR_NOT_SUPPORTED;
    CHECK(valid_device(dev), CUDA_ERROR_INVALID_DEVICE);
    if (t_depth == CTX_STACK_DEPTH)
        return CUDA_ERROR_INVALID_VALUE;

    CUcontext ctx = NULL;
    pthread_mutex_lock(&g_lock);
    long i = g_created_live < MAX_CREATED_CTX
                 ? take_slot_locked(&g_created_next, CTX_SLOTS,
                                    created_slot_free, NULL)
                 : -1;
    if (i >= 0 && ctx_charge_locked(dev)) {
        ctx = &g_created[i];
        ctx->dev = dev;
        ctx->live = true;
        g_created_live++;
    }
    pthread_mutex_unlock(&g_lock);
    if (ctx == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    t_stack[t_depth++] = ctx;
    *pctx = ctx;
    return CUDA_SUCCESS;
}
LOCAL(cuCtxCreate_v4)

/*
 * Destroys a created context and releases everything it owns. It is removed
 * from the calling thread's stack (every occurrence, so it can not become
 * current again here); threads where it is still current get
 * CUDA_ERROR_CONTEXT_IS_DESTROYED.
 */
CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (is_primary(ctx))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&g_lock);
    if (is_created(ctx) && ctx->live) {
        release_ctx_locked(ctx);
        ctx_uncharge_locked(ctx->dev);
        ctx->live = false;
        g_created_live--;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    if (rc == CUDA_SUCCESS) {
        int n = 0;
        for (int i = 0; i < t_depth; i++)
            if (t_stack[i] != ctx)
                t_stack[n++] = t_stack[i];
        t_depth = n;
    }
    return rc;
}
LOCAL(cuCtxDestroy_v2)

/* A full stack (CTX_STACK_DEPTH) gives CUDA_ERROR_INVALID_VALUE. */
CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (ctx == NULL || !ctx_exists(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == CTX_STACK_DEPTH)
        return CUDA_ERROR_INVALID_VALUE;
    t_stack[t_depth++] = ctx;
    return CUDA_SUCCESS;
}
LOCAL(cuCtxPushCurrent_v2)

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext ctx = t_stack[--t_depth];
    if (pctx != NULL)
        *pctx = ctx;
    return CUDA_SUCCESS;
}
LOCAL(cuCtxPopCurrent_v2)

/*
 * Like the real driver: replaces the top of the stack (pushes onto an empty
 * one); NULL pops the top (nothing to do on an empty stack).
 */
CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (ctx == NULL) {
        if (t_depth > 0)
            t_depth--;
        return CUDA_SUCCESS;
    }
    if (!ctx_exists(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == 0)
        t_depth = 1;
    t_stack[t_depth - 1] = ctx;
    return CUDA_SUCCESS;
}
LOCAL(cuCtxSetCurrent)

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(pctx != NULL, CUDA_ERROR_INVALID_VALUE);
    *pctx = current_ctx();
    return CUDA_SUCCESS;
}
LOCAL(cuCtxGetCurrent)

CUresult cuCtxGetDevice(CUdevice *device)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(device != NULL, CUDA_ERROR_INVALID_VALUE);
    CUcontext ctx;
    CUresult rc = check_current(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    *device = ctx->dev;
    return CUDA_SUCCESS;
}
LOCAL(cuCtxGetDevice)

/* True if a stream capture is active (not invalidated). Caller holds g_lock. */
static bool capture_active_locked(void)
{
    for (size_t i = 0; i < STREAM_SLOTS; i++)
        if (g_streams[i].ctx != NULL &&
            g_streams[i].capture == CU_STREAM_CAPTURE_STATUS_ACTIVE)
            return true;
    return false;
}

/*
 * There is no work to wait for; only the context is checked. While any
 * stream capture is active, synchronizing is illegal: like the real driver
 * this fails and invalidates every active capture. Otherwise the pools of
 * the context's device trim to their release thresholds.
 */
CUresult cuCtxSynchronize(void)
{
    atomic_fetch_add_explicit(&g_sync_calls, 1, memory_order_relaxed);
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUcontext ctx;
    CUresult rc = check_current(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < STREAM_SLOTS; i++) {
        if (g_streams[i].ctx != NULL &&
            g_streams[i].capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
            g_streams[i].capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
            rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    if (rc == CUDA_SUCCESS)
        sync_pools_locked(ctx->dev);
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuCtxSynchronize)

/* ---- Streams and stream capture ------------------------------------------- */

/*
 * Streams only carry capture state. A handle is CU_STREAM_LEGACY,
 * CU_STREAM_PER_THREAD, NULL (the legacy stream, or the per-thread stream in
 * the _ptsz variants) or a stream from cuStreamCreate. Capturing either
 * default stream is not modelled: it gives
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (the real driver refuses it for the
 * legacy stream). Other handles that are not live streams give
 * CUDA_ERROR_INVALID_HANDLE.
 */
enum stream_kind { STREAM_LEGACY, STREAM_PER_THREAD, STREAM_CREATED };

static enum stream_kind stream_kind(CUstream h, bool ptsz)
{
    if (h == NULL)
        return ptsz ? STREAM_PER_THREAD : STREAM_LEGACY;
    if (h == CU_STREAM_LEGACY)
        return STREAM_LEGACY;
    if (h == CU_STREAM_PER_THREAD)
        return STREAM_PER_THREAD;
    return STREAM_CREATED;
}

/* The live created stream h, or NULL. Caller holds g_lock. */
static struct CUstream_st *live_stream_locked(CUstream h)
{
    if (array_index(h, g_streams, STREAM_SLOTS, sizeof g_streams[0]) < 0 ||
        h->ctx == NULL)
        return NULL;
    return h;
}

static bool stream_slot_free(size_t i, const void *arg)
{
    (void)arg;
    return g_streams[i].ctx == NULL;
}

/* Flags: CU_STREAM_DEFAULT or CU_STREAM_NON_BLOCKING. */
CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (phStream == NULL ||
        (Flags != CU_STREAM_DEFAULT && Flags != CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx;
    CUresult rc = check_current(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    long i = take_slot_locked(&g_streams_next, STREAM_SLOTS, stream_slot_free,
                              NULL);
    if (i >= 0) {
        g_streams[i] = (struct CUstream_st){
            .ctx = ctx, .flags = Flags,
            .capture = CU_STREAM_CAPTURE_STATUS_NONE };
        *phStream = &g_streams[i];
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuStreamCreate)

/* Streams carry no priority: cuStreamCreate with the same flags. */
CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    (void)priority;
    return cuStreamCreate(phStream, flags);
}
LOCAL(cuStreamCreateWithPriority)

/* Destroying a capturing stream ends its capture. */
CUresult cuStreamDestroy_v2(CUstream hStream)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUresult rc = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_lock);
    struct CUstream_st *s = live_stream_locked(hStream);
    if (s != NULL) {
        destroy_stream_locked(s);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuStreamDestroy_v2)

static CUgraph graph_new_locked(void);

/* Common part of the four cuStreamBeginCapture variants. */
static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, bool ptsz)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL &&
        mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
        mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    if (stream_kind(h, ptsz) != STREAM_CREATED)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    CUresult rc = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_lock);
    struct CUstream_st *s = live_stream_locked(h);
    if (s != NULL && s->capture != CU_STREAM_CAPTURE_STATUS_NONE) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
    } else if (s != NULL && (s->graph = graph_new_locked()) == NULL) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (s != NULL) {
        s->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
        atomic_fetch_add_explicit(&g_captures, 1, memory_order_relaxed);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* CUDA 10.0 ABI: no mode argument, global mode. */
WITH_PTSZ(cuStreamBeginCapture, (CUstream hStream),
          begin_capture, hStream, CU_STREAM_CAPTURE_MODE_GLOBAL)

WITH_PTSZ(cuStreamBeginCapture_v2, (CUstream hStream,
           CUstreamCaptureMode mode),
          begin_capture, hStream, mode)

/*
 * Ends the capture either way: the graph it built if it was still active
 * (the caller owns it now), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED and NULL
 * if it was invalidated (the graph is dropped).
 * Streams that are not capturing give CUDA_ERROR_ILLEGAL_STATE.
 */
static CUresult end_capture(CUstream h, CUgraph *phGraph, bool ptsz)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (phGraph == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *phGraph = NULL;
    if (stream_kind(h, ptsz) != STREAM_CREATED)
        return CUDA_ERROR_ILLEGAL_STATE;
    CUresult rc = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_lock);
    struct CUstream_st *s = live_stream_locked(h);
    if (s != NULL) {
        switch (s->capture) {
        case CU_STREAM_CAPTURE_STATUS_ACTIVE:
            *phGraph = s->graph;
            s->graph = NULL;
            rc = CUDA_SUCCESS;
            break;
        case CU_STREAM_CAPTURE_STATUS_INVALIDATED:
            rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
            break;
        default:
            rc = CUDA_ERROR_ILLEGAL_STATE;
            break;
        }
        if (s->graph != NULL)
            graph_free_locked(s->graph);
        s->graph = NULL;
        s->capture = CU_STREAM_CAPTURE_STATUS_NONE;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

WITH_PTSZ(cuStreamEndCapture, (CUstream hStream, CUgraph *phGraph),
          end_capture, hStream, phGraph)

/*
 * A created stream reports its own status. The legacy stream would depend on
 * any capturing stream: while a capture is active anywhere in the process it
 * gives CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, otherwise NONE. The per-thread
 * stream is never capturing.
 */
static CUresult is_capturing(CUstream h, CUstreamCaptureStatus *status,
                             bool ptsz)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(status != NULL, CUDA_ERROR_INVALID_VALUE);
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    switch (stream_kind(h, ptsz)) {
    case STREAM_LEGACY:
        if (capture_active_locked())
            rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        else
            *status = CU_STREAM_CAPTURE_STATUS_NONE;
        break;
    case STREAM_PER_THREAD:
        *status = CU_STREAM_CAPTURE_STATUS_NONE;
        break;
    case STREAM_CREATED: {
        struct CUstream_st *s = live_stream_locked(h);
        if (s != NULL)
            *status = s->capture;
        else
            rc = CUDA_ERROR_INVALID_HANDLE;
        break;
    }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

WITH_PTSZ(cuStreamIsCapturing, (CUstream hStream,
           CUstreamCaptureStatus *captureStatus),
          is_capturing, hStream, captureStatus)

/* ---- Memory --------------------------------------------------------------- */

/*
 * Legacy 32-bit ABI (CUDA < 3.2). The address is truncated to 32 bits, so the
 * block can never be freed; it exists so tests can tell variants apart.
 */
CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(dptr != NULL, CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr addr;
    CUresult rc = alloc_common(&addr, bytesize, span_for(bytesize), false,
                               false);
    if (rc == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)addr;
    return rc;
}
LOCAL(cuMemAlloc)

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(dptr != NULL, CUDA_ERROR_INVALID_VALUE);
    return alloc_common(dptr, bytesize, span_for(bytesize), true, false);
}
LOCAL(cuMemAlloc_v2)

/* Pitch is WidthInBytes rounded up to 512; pitch * Height bytes are used. */
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch,
                            size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (dptr == NULL || pPitch == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (current_device() < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ElementSizeBytes != 4 && ElementSizeBytes != 8 &&
        ElementSizeBytes != 16)
        return CUDA_ERROR_INVALID_VALUE;
    if (WidthInBytes == 0 || Height == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (WidthInBytes > g_cfg.total_bytes)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t pitch = round_up(WidthInBytes, ADDR_ALIGN);
    if (Height > g_cfg.total_bytes / pitch)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t bytes = pitch * Height;
    CUresult rc = alloc_common(dptr, bytes, bytes, true, false);
    if (rc == CUDA_SUCCESS)
        *pPitch = pitch;
    return rc;
}
LOCAL(cuMemAllocPitch_v2)

/*
 * Managed memory is accounted against the current context's device, until
 * cuMemAdvise makes the host its preferred location.
 */
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize,
                           unsigned int flags)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(dptr != NULL, CUDA_ERROR_INVALID_VALUE);
    if (current_device() < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_common(dptr, bytesize, span_for(bytesize), false, true);
}
LOCAL(cuMemAllocManaged)

/*
 * The live block that starts at dptr: its device and index, or false.
 * Caller holds g_lock.
 */
static bool find_block_locked(CUdeviceptr dptr, int *dev, size_t *index)
{
    if (dptr < ADDR_BASE ||
        dptr - ADDR_BASE >= (CUdeviceptr)g_cfg.devices * ADDR_WINDOW)
        return false;
    *dev = (int)((dptr - ADDR_BASE) / ADDR_WINDOW);
    const struct device_state *d = &g_dev[*dev];
    *index = first_block_ending_after(d, dptr);
    return *index < d->nblocks && d->blocks[*index].addr == dptr &&
           d->blocks[*index].live;
}

/*
 * The live block whose address range (its span) contains p: its device and
 * index, or false. Caller holds g_lock.
 */
static bool find_containing_locked(CUdeviceptr p, int *dev, size_t *index)
{
    if (p < ADDR_BASE ||
        p - ADDR_BASE >= (CUdeviceptr)g_cfg.devices * ADDR_WINDOW)
        return false;
    *dev = (int)((p - ADDR_BASE) / ADDR_WINDOW);
    const struct device_state *d = &g_dev[*dev];
    *index = first_block_ending_after(d, p);
    return *index < d->nblocks && d->blocks[*index].addr <= p &&
           d->blocks[*index].live;
}

/*
 * Index in g_host_allocs of the live pinned host allocation that starts at
 * p (inside: that contains p), or -1. Real host addresses may lie in a
 * device's address window, so the frees look here first. Caller holds
 * g_lock.
 */
static long host_index_locked(uintptr_t p, bool inside)
{
    for (size_t i = 0; i < g_host_nallocs; i++) {
        const struct host_alloc *h = &g_host_allocs[i];
        if (p == h->addr || (inside && p > h->addr && p - h->addr < h->bytes))
            return (long)i;
    }
    return -1;
}

/*
 * Frees a block of any device and context (the device is found from the
 * address window), stream-ordered allocations included (the driver allows
 * it); a current context is needed all the same. 0 is accepted
 * like the real driver; any other address that is not the start of a live
 * block (pinned host memory included) is CUDA_ERROR_INVALID_VALUE.
 */
CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUcontext ctx;
    CUresult rc = check_current(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (dptr == 0)
        return CUDA_SUCCESS;

    int dev;
    size_t i;
    rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    long gi = galloc_index_locked(dptr);
    if (gi >= 0) {
        if (g_gallocs[gi].live) {
            galloc_free_locked((size_t)gi);
            rc = CUDA_SUCCESS;
        }
    } else if (host_index_locked((uintptr_t)dptr, false) < 0 &&
               find_block_locked(dptr, &dev, &i)) {
        free_block_locked(&g_dev[dev], i);
        maybe_compact(&g_dev[dev]);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemFree_v2)

CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(free != NULL && total != NULL, CUDA_ERROR_INVALID_VALUE);
    CUcontext ctx;
    CUresult rc = check_current(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&g_lock);
    *free = free_locked(ctx->dev);
    pthread_mutex_unlock(&g_lock);
    *total = g_cfg.total_bytes;
    return CUDA_SUCCESS;
}
LOCAL(cuMemGetInfo_v2)

/*
 * Only the start of a live cuMemAlloc_v2 or cuMemAllocPitch_v2 block can be
 * exported (anything else is CUDA_ERROR_INVALID_VALUE); the handle holds the
 * address in its first bytes, the rest is zero. Every call is counted.
 */
CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    atomic_fetch_add_explicit(&g_ipc_calls, 1, memory_order_relaxed);
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (pHandle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx;
    CUresult rc = check_current(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    int dev;
    size_t i;
    rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (find_block_locked(dptr, &dev, &i) && g_dev[dev].blocks[i].ipc) {
        memset(pHandle, 0, sizeof *pHandle);
        memcpy(pHandle->reserved, &dptr, sizeof dptr);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuIpcGetMemHandle)

/*
 * Two distinct no-op functions, so tests can see whether the legacy-stream or
 * the per-thread-default-stream (_ptsz) variant was selected.
 */
static CUresult memset_d8(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                          CUstream hStream, bool ptsz)
{
    (void)dstDevice; (void)uc; (void)N; (void)hStream; (void)ptsz;
    return initialized() ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}
WITH_PTSZ(cuMemsetD8Async, (CUdeviceptr dstDevice, unsigned char uc, size_t N,
           CUstream hStream),
          memset_d8, dstDevice, uc, N, hStream)

/* ---- Stream-ordered allocation and memory pools --------------------------- */

/*
 * A stream-ordered call works in the stream's context: a created stream's
 * own (the one current when it was created), the calling thread's current
 * context for the legacy and per-thread streams. Those two never capture
 * here; legacy-stream implicit synchronisation with capturing streams is not
 * modelled.
 *
 * First step, without g_lock: the current context for the default streams
 * (*ctx stays NULL for created streams).
 */
static CUresult stream_current(CUstream h, bool ptsz, CUcontext *ctx)
{
    *ctx = NULL;
    if (stream_kind(h, ptsz) == STREAM_CREATED)
        return CUDA_SUCCESS;
    return check_current(ctx);
}

/*
 * Second step, holding g_lock: a created stream's context and capture
 * status (CUDA_ERROR_INVALID_HANDLE if it is not a live stream).
 */
static CUresult stream_target_locked(CUstream h, bool ptsz, CUcontext *ctx,
                                     CUstreamCaptureStatus *capture)
{
    *capture = CU_STREAM_CAPTURE_STATUS_NONE;
    if (stream_kind(h, ptsz) != STREAM_CREATED)
        return CUDA_SUCCESS;
    struct CUstream_st *s = live_stream_locked(h);
    if (s == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    *ctx = s->ctx;
    *capture = s->capture;
    return CUDA_SUCCESS;
}

/*
 * pool if it names a pool that can be used: a simulated device's default
 * pool or a created pool not yet destroyed; NULL otherwise. Caller holds
 * g_lock.
 */
static struct CUmemPoolHandle_st *pool_locked(CUmemoryPool pool)
{
    long i = array_index(pool, g_default_pools, MAX_DEVICES,
                         sizeof g_default_pools[0]);
    if (i >= 0)
        return i < g_cfg.devices ? pool : NULL;
    if (array_index(pool, g_pools, POOL_SLOTS, sizeof g_pools[0]) < 0)
        return NULL;
    return pool->live ? pool : NULL;
}

/* The graph a created stream h is capturing into, or NULL. Holds g_lock. */
static CUgraph capture_graph_locked(CUstream h, bool ptsz)
{
    if (stream_kind(h, ptsz) != STREAM_CREATED)
        return NULL;
    struct CUstream_st *s = live_stream_locked(h);
    return s != NULL ? s->graph : NULL;
}

/*
 * The allocation of cuMemAllocAsync (pool NULL: the current pool of the
 * stream's device) and cuMemAllocFromPoolAsync: from the pool's reserve
 * (pool_reserve_locked), which is what counts against the device. On a
 * capturing stream the allocation becomes a memory allocation node of the
 * graph being captured (graph != NULL): a pointer from the graph window
 * that counts nothing until the graph is launched (*counted stays false).
 * Caller holds g_lock.
 */
static CUresult alloc_async_locked(CUdeviceptr *dptr, size_t bytes,
                                   CUmemoryPool pool, CUcontext ctx,
                                   CUstreamCaptureStatus capture,
                                   CUgraph graph, bool *counted)
{
    struct CUmemPoolHandle_st *p =
        pool != NULL ? pool_locked(pool) : g_dev[ctx->dev].mempool;
    CHECK(p != NULL, CUDA_ERROR_INVALID_VALUE);
    if (!ctx_usable_locked(ctx))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    size_t span = span_for(bytes);
    if (capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        CUmemPoolProps props = {
            .allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
            .location = { .type = CU_MEM_LOCATION_TYPE_DEVICE, .id = p->dev } };
        CUgraphNode node;
        CUresult rc = graph_alloc_node_locked(graph, bytes, &props, NULL, 0,
                                              &node);
        if (rc == CUDA_SUCCESS)
            *dptr = node->dptr;
        return rc;
    }
    size_t reserved_before = p->reserved;
    if (span == 0 || !pool_reserve_locked(p, bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (!place_block_locked(p->dev,
                            (struct block){ .span = span, .bytes = bytes,
                                            .pool = p },
                            dptr)) {
        /* No address space: give back the growth made for it. */
        g_dev[p->dev].used -= p->reserved - reserved_before;
        p->reserved = reserved_before;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->used += bytes;
    if (p->used > p->peak)
        p->peak = p->used;
    *counted = true;
    return CUDA_SUCCESS;
}

/* Common part of the four stream-ordered allocation entry points. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize,
                            CUmemoryPool pool, bool from_pool,
                            CUstream hStream, bool ptsz)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (dptr == NULL || bytesize == 0 || (from_pool && pool == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx;
    CUresult rc = stream_current(hStream, ptsz, &ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUstreamCaptureStatus capture;
    bool counted = false;
    pthread_mutex_lock(&g_lock);
    rc = stream_target_locked(hStream, ptsz, &ctx, &capture);
    if (rc == CUDA_SUCCESS)
        rc = alloc_async_locked(dptr, bytesize, from_pool ? pool : NULL, ctx,
                                capture, capture_graph_locked(hStream, ptsz),
                                &counted);
    pthread_mutex_unlock(&g_lock);
    if (counted)
        atomic_fetch_add_explicit(&g_async_allocs, 1, memory_order_relaxed);
    return rc;
}

WITH_PTSZ(cuMemAllocAsync, (CUdeviceptr *dptr, size_t bytesize,
           CUstream hStream),
          alloc_async, dptr, bytesize, NULL, false, hStream)

WITH_PTSZ(cuMemAllocFromPoolAsync, (CUdeviceptr *dptr, size_t bytesize,
           CUmemoryPool pool, CUstream hStream),
          alloc_async, dptr, bytesize, pool, true, hStream)

/*
 * Frees at once, whatever the stream. 0 is accepted like by cuMemFree_v2;
 * any live block can be freed (the driver frees cuMemAlloc memory this way
 * too) except managed memory (CUDA_ERROR_NOT_SUPPORTED, as the real driver
 * says); pinned host memory is no block (CUDA_ERROR_INVALID_VALUE); a pool
 * block goes back to its pool. During a capture only graph allocations
 * (addresses of allocation nodes) can be freed: the free becomes a free
 * node of the graph being captured (freeing one twice in a graph, or
 * anything else: CUDA_ERROR_INVALID_VALUE). Outside a capture a graph
 * allocation a launch made live is freed (graph memory in use falls; the
 * graph pool keeps its reserve); one that is not live gives
 * CUDA_ERROR_INVALID_VALUE. Caller holds g_lock.
 */
static CUresult free_async_locked(CUdeviceptr dptr,
                                  CUstreamCaptureStatus capture,
                                  CUgraph graph)
{
    if (capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (dptr == 0)
        return CUDA_SUCCESS;
    if (capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        CUgraphNode node;
        return graph_free_node_locked(graph, dptr, &node);
    }
    long gi = galloc_index_locked(dptr);
    if (gi >= 0) {
        if (!g_gallocs[gi].live)
            return CUDA_ERROR_INVALID_VALUE;
        galloc_free_locked((size_t)gi);
        return CUDA_SUCCESS;
    }
    int dev;
    size_t i;
    if (host_index_locked((uintptr_t)dptr, false) >= 0 ||
        !find_block_locked(dptr, &dev, &i))
        return CUDA_ERROR_INVALID_VALUE;
    if (g_dev[dev].blocks[i].managed)
        return CUDA_ERROR_NOT_SUPPORTED;
    free_block_locked(&g_dev[dev], i);
    maybe_compact(&g_dev[dev]);
    return CUDA_SUCCESS;
}

static CUresult free_async(CUdeviceptr dptr, CUstream hStream, bool ptsz)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUcontext ctx;
    CUresult rc = stream_current(hStream, ptsz, &ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUstreamCaptureStatus capture;
    pthread_mutex_lock(&g_lock);
    rc = stream_target_locked(hStream, ptsz, &ctx, &capture);
    if (rc == CUDA_SUCCESS)
        rc = free_async_locked(dptr, capture,
                               capture_graph_locked(hStream, ptsz));
    pthread_mutex_unlock(&g_lock);
    return rc;
}

WITH_PTSZ(cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream),
          free_async, dptr, hStream)

/* A destroyed pool's slot is free once its last allocation is. */
static bool pool_slot_free(size_t i, const void *arg)
{
    (void)arg;
    return !g_pools[i].live && g_pools[i].used == 0 &&
           g_pools[i].reserved == 0;
}

/*
 * Only pinned device pools: any other allocation type or location (host,
 * managed pools) is CUDA_ERROR_INVALID_VALUE here. maxSize, if not 0, caps
 * the pool's live bytes; the other properties are not looked at. Too many
 * live pools give CUDA_ERROR_OUT_OF_MEMORY.
 */
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (pool == NULL || poolProps == NULL ||
        poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !valid_device(poolProps->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    long i = take_slot_locked(&g_pools_next, POOL_SLOTS, pool_slot_free, NULL);
    if (i >= 0) {
        g_pools[i] = (struct CUmemPoolHandle_st){
            .dev = poolProps->location.id, .live = true,
            .max_size = poolProps->maxSize, .reuse = { 1, 1, 1 } };
        *pool = &g_pools[i];
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemPoolCreate)

/*
 * A default pool can not be destroyed (CUDA_ERROR_INVALID_VALUE). Like the
 * real driver, destroying a pool with live allocations succeeds; they stay
 * valid and counted until freed. The reserve beyond what they need goes
 * back at once, the rest as they are freed. A device whose current pool it
 * was gets its default pool back as the current one.
 */
CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct CUmemPoolHandle_st *p = pool_locked(pool);
    if (p != NULL &&
        array_index(p, g_pools, POOL_SLOTS, sizeof g_pools[0]) >= 0) {
        p->live = false;
        pool_trim_locked(p, 0);
        for (int d = 0; d < MAX_DEVICES; d++)
            if (g_dev[d].mempool == p)
                g_dev[d].mempool = &g_default_pools[d];
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemPoolDestroy)

/* The reserve goes down to max(used, minBytesToKeep): pool_trim_locked. */
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    pthread_mutex_lock(&g_lock);
    struct CUmemPoolHandle_st *p = pool_locked(pool);
    if (p != NULL)
        pool_trim_locked(p, minBytesToKeep);
    pthread_mutex_unlock(&g_lock);
    return p != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
LOCAL(cuMemPoolTrimTo)

/*
 * The reuse attributes (int) are stored and read back; the release
 * threshold (cuuint64_t; UINT64_MAX keeps everything) is what
 * synchronisations trim the pool to. The current amounts are read-only;
 * the high-water marks can only be reset, with 0, to the current amount.
 * Reserved is what the pool holds of its device, used its live
 * allocations' bytes.
 */
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                               void *value)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(value != NULL, CUDA_ERROR_INVALID_VALUE);
    int i;
    cuuint64_t u;
    memcpy(&i, value, sizeof i);
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&g_lock);
    struct CUmemPoolHandle_st *p = pool_locked(pool);
    if (p == NULL) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        switch (attr) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
            p->reuse[attr - 1] = i;
            break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            memcpy(&p->release_threshold, value, sizeof p->release_threshold);
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            memcpy(&u, value, sizeof u);
            if (u != 0)
                rc = CUDA_ERROR_INVALID_VALUE;
            else if (attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH)
                p->peak = p->used;
            else
                p->reserved_peak = p->reserved;
            break;
        default:
            rc = CUDA_ERROR_INVALID_VALUE;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemPoolSetAttribute)

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr,
                               void *value)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(value != NULL, CUDA_ERROR_INVALID_VALUE);
    CUresult rc = CUDA_SUCCESS;
    cuuint64_t u = 0;
    pthread_mutex_lock(&g_lock);
    struct CUmemPoolHandle_st *p = pool_locked(pool);
    if (p == NULL) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        switch (attr) {
        case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
        case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
            memcpy(value, &p->reuse[attr - 1], sizeof p->reuse[0]);
            break;
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
            u = p->release_threshold;
            memcpy(value, &u, sizeof u);
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
            u = p->reserved;
            memcpy(value, &u, sizeof u);
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
            u = p->used;
            memcpy(value, &u, sizeof u);
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
            u = p->reserved_peak;
            memcpy(value, &u, sizeof u);
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            u = p->peak;
            memcpy(value, &u, sizeof u);
            break;
        default:
            rc = CUDA_ERROR_INVALID_VALUE;
            break;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemPoolGetAttribute)

static CUresult device_pool(CUmemoryPool *pool, CUdevice dev, bool current)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(pool != NULL, CUDA_ERROR_INVALID_VALUE);
    CHECK(valid_device(dev), CUDA_ERROR_INVALID_DEVICE);
    pthread_mutex_lock(&g_lock);
    *pool = current ? g_dev[dev].mempool : &g_default_pools[dev];
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    return device_pool(pool_out, dev, false);
}
LOCAL(cuDeviceGetDefaultMemPool)

/* The device's current pool: its default pool unless cuDeviceSetMemPool. */
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    return device_pool(pool, dev, true);
}
LOCAL(cuDeviceGetMemPool)

/*
 * Makes a live pool of the device its current pool (what cuMemAllocAsync
 * allocates from); a pool of another device or no live pool gives
 * CUDA_ERROR_INVALID_VALUE.
 */
CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(valid_device(dev), CUDA_ERROR_INVALID_DEVICE);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct CUmemPoolHandle_st *p = pool_locked(pool);
    if (p != NULL && p->dev == dev) {
        g_dev[dev].mempool = p;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuDeviceSetMemPool)

static CUresult stream_get_device(CUstream h, CUdevice *device, bool ptsz)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(device != NULL, CUDA_ERROR_INVALID_VALUE);
    CUcontext ctx;
    CUresult rc = stream_current(h, ptsz, &ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUstreamCaptureStatus capture;
    pthread_mutex_lock(&g_lock);
    rc = stream_target_locked(h, ptsz, &ctx, &capture);
    pthread_mutex_unlock(&g_lock);
    if (rc == CUDA_SUCCESS)
        *device = ctx->dev;
    return rc;
}

WITH_PTSZ(cuStreamGetDevice, (CUstream hStream, CUdevice *device),
          stream_get_device, hStream, device)

/* ---- Stream synchronisation ---------------------------------------------- */

/*
 * Nothing runs, so there is nothing to wait for: the stream is checked and
 * the pools of its device trim to their release thresholds. Synchronizing a
 * capturing stream is illegal, as with the real driver: it invalidates the
 * capture and gives CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (an already
 * invalidated one gives CUDA_ERROR_STREAM_CAPTURE_INVALIDATED).
 */
static CUresult stream_synchronize(CUstream h, bool ptsz)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUcontext ctx;
    CUresult rc = stream_current(h, ptsz, &ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUstreamCaptureStatus capture;
    pthread_mutex_lock(&g_lock);
    rc = stream_target_locked(h, ptsz, &ctx, &capture);
    if (rc == CUDA_SUCCESS && capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        live_stream_locked(h)->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
        rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    } else if (rc == CUDA_SUCCESS &&
               capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
        rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    } else if (rc == CUDA_SUCCESS) {
        sync_pools_locked(ctx->dev);
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/*
 * Nothing runs, so a stream is always idle: the stream is checked as by the
 * stream-ordered calls and the answer is CUDA_SUCCESS (a capturing stream
 * too: querying does not end a capture, unlike synchronizing).
 */
static CUresult stream_query(CUstream h, bool ptsz)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUcontext ctx;
    CUresult rc = stream_current(h, ptsz, &ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUstreamCaptureStatus capture;
    pthread_mutex_lock(&g_lock);
    rc = stream_target_locked(h, ptsz, &ctx, &capture);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

WITH_PTSZ(cuStreamQuery, (CUstream hStream), stream_query, hStream)

CUresult cuStreamSynchronize(CUstream hStream)
{
    return stream_synchronize(hStream, false);
}
LOCAL(cuStreamSynchronize)

CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    return stream_synchronize(hStream, true);
}
LOCAL(cuStreamSynchronize_ptsz)

/* ---- Graphs ---------------------------------------------------------------- */

/* Append p to a growable pointer array; false when out of memory. */
static bool push_ptr(void ***items, size_t *n, size_t *cap, void *p)
{
    if (*n == *cap) {
        size_t grown = *cap ? *cap * 2 : 16;
        void **q = realloc(*items, grown * sizeof *q);
        if (q == NULL)
            return false;
        *items = q;
        *cap = grown;
    }
    (*items)[(*n)++] = p;
    return true;
}

/* Remove p from a pointer array (order not kept); false if absent. */
static bool drop_ptr(void **items, size_t *n, const void *p)
{
    for (size_t i = 0; i < *n; i++) {
        if (items[i] == p) {
            items[i] = items[--*n];
            return true;
        }
    }
    return false;
}

static bool has_ptr(void *const *items, size_t n, const void *p)
{
    for (size_t i = 0; i < n; i++)
        if (items[i] == p)
            return true;
    return false;
}

#define PTRS(a) ((void ***)(void *)&(a))

static bool graph_live_locked(CUgraph g)
{
    return g != NULL && has_ptr((void *const *)g_graphs, g_ngraphs, g);
}

static bool exec_live_locked(CUgraphExec e)
{
    return e != NULL && has_ptr((void *const *)g_execs, g_nexecs, e);
}

/* A node of a live graph, or NULL. */
static CUgraphNode node_live_locked(CUgraphNode n)
{
    if (n == NULL)
        return NULL;
    for (size_t i = 0; i < g_ngraphs; i++)
        if (has_ptr((void *const *)g_graphs[i]->nodes, g_graphs[i]->nnodes, n))
            return n;
    return NULL;
}

/* A new empty graph, registered; NULL when out of memory. */
static CUgraph graph_new_locked(void)
{
    CUgraph g = calloc(1, sizeof *g);
    if (g != NULL && !push_ptr(PTRS(g_graphs), &g_ngraphs, &g_graphs_cap, g)) {
        free(g);
        g = NULL;
    }
    return g;
}

/* Destroy g, the graphs its child nodes own, and its nodes. */
static void graph_free_locked(CUgraph g)
{
    for (size_t i = 0; i < g->nnodes; i++) {
        CUgraphNode n = g->nodes[i];
        if (n->child != NULL)
            graph_free_locked(n->child);
        free(n->access);
        free(n);
    }
    free(g->nodes);
    for (size_t i = 0; i < g_nexecs; i++)
        if (g_execs[i]->graph == g)
            g_execs[i]->graph = NULL;
    drop_ptr((void **)g_graphs, &g_ngraphs, g);
    free(g);
}

/* A new node of type in g; NULL when out of memory. */
static CUgraphNode graph_add_node_locked(CUgraph g, CUgraphNodeType type)
{
    CUgraphNode n = calloc(1, sizeof *n);
    if (n == NULL)
        return NULL;
    n->graph = g;
    n->type = type;
    if (!push_ptr(PTRS(g->nodes), &g->nnodes, &g->cap, n)) {
        free(n);
        return NULL;
    }
    return n;
}

/* Whether g or a graph nested in it holds memory nodes. */
static bool graph_has_mem_locked(CUgraph g)
{
    for (size_t i = 0; i < g->nnodes; i++) {
        CUgraphNode n = g->nodes[i];
        if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC ||
            n->type == CU_GRAPH_NODE_TYPE_MEM_FREE ||
            (n->child != NULL && graph_has_mem_locked(n->child)))
            return true;
    }
    return false;
}

/* The entry of g_gallocs for exactly addr, or -1. */
static long galloc_index_locked(CUdeviceptr addr)
{
    if (addr < GRAPH_BASE || addr >= g_graph_next)
        return -1;
    for (size_t i = 0; i < g_ngallocs; i++)
        if (g_gallocs[i].addr == addr)
            return (long)i;
    return -1;
}

/* A live graph allocation is freed: graph memory in use falls. */
static void galloc_free_locked(size_t i)
{
    struct galloc *a = &g_gallocs[i];
    a->live = false;
    g_dev[a->dev].graph_used -= a->bytes;
}

/* The dependencies of a new node: every one a node of g. */
static CUresult check_deps_locked(CUgraph g, const CUgraphNode *deps,
                                  size_t ndeps)
{
    if (ndeps > 0 && deps == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < ndeps; i++)
        if (!has_ptr((void *const *)g->nodes, g->nnodes, deps[i]))
            return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/*
 * An allocation node of bytes in g, with its own address from the graph
 * window (fixed for good). Only pinned memory on a device; a graph owned by
 * a child graph node can take no memory nodes (CUDA_ERROR_INVALID_VALUE).
 */
static CUresult graph_alloc_node_locked(CUgraph g, size_t bytes,
                                        const CUmemPoolProps *props,
                                        const CUmemAccessDesc *access,
                                        size_t naccess, CUgraphNode *out)
{
    if (g == NULL || g->owner != NULL || bytes == 0 ||
        props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        !valid_device(props->location.id) || (naccess > 0 && access == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < naccess; i++)
        if (access[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            !valid_device(access[i].location.id))
            return CUDA_ERROR_INVALID_VALUE;
    size_t span = span_for(bytes);
    if (span == 0 || span > GRAPH_BASE + GRAPH_WINDOW - g_graph_next)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (g_ngallocs == g_gallocs_cap) {
        size_t cap = g_gallocs_cap ? g_gallocs_cap * 2 : 64;
        struct galloc *grown = realloc(g_gallocs, cap * sizeof *grown);
        if (grown == NULL)
            return CUDA_ERROR_OUT_OF_MEMORY;
        g_gallocs = grown;
        g_gallocs_cap = cap;
    }
    CUmemAccessDesc *copy = NULL;
    if (naccess > 0) {
        copy = malloc(naccess * sizeof *copy);
        if (copy == NULL)
            return CUDA_ERROR_OUT_OF_MEMORY;
        memcpy(copy, access, naccess * sizeof *copy);
    }
    CUgraphNode n = graph_add_node_locked(g, CU_GRAPH_NODE_TYPE_MEM_ALLOC);
    if (n == NULL) {
        free(copy);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    n->dptr = g_graph_next;
    n->bytes = bytes;
    n->props = *props;
    n->access = copy;
    n->naccess = naccess;
    n->galloc = g_ngallocs;
    g_gallocs[g_ngallocs++] = (struct galloc){
        .addr = n->dptr, .bytes = bytes, .dev = props->location.id };
    g_graph_next += span;
    *out = n;
    return CUDA_SUCCESS;
}

/*
 * A free node of dptr in g: dptr must be the address of an allocation node
 * (of any graph) not yet freed in g, else CUDA_ERROR_INVALID_VALUE, like
 * the real driver.
 */
static CUresult graph_free_node_locked(CUgraph g, CUdeviceptr dptr,
                                       CUgraphNode *out)
{
    if (g == NULL || g->owner != NULL || galloc_index_locked(dptr) < 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < g->nnodes; i++)
        if (g->nodes[i]->type == CU_GRAPH_NODE_TYPE_MEM_FREE &&
            g->nodes[i]->dptr == dptr)
            return CUDA_ERROR_INVALID_VALUE;
    CUgraphNode n = graph_add_node_locked(g, CU_GRAPH_NODE_TYPE_MEM_FREE);
    if (n == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    n->dptr = dptr;
    *out = n;
    return CUDA_SUCCESS;
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(phGraph != NULL && flags == 0, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&g_lock);
    CUgraph g = graph_new_locked();
    pthread_mutex_unlock(&g_lock);
    if (g == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phGraph = g;
    return CUDA_SUCCESS;
}
LOCAL(cuGraphCreate)

/*
 * A graph owned by a child graph node goes with its node's graph
 * (CUDA_ERROR_INVALID_VALUE here). Executable graphs made from it stay.
 */
CUresult cuGraphDestroy(CUgraph hGraph)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (graph_live_locked(hGraph) && hGraph->owner == NULL) {
        graph_free_locked(hGraph);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuGraphDestroy)

CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                const CUgraphNode *dependencies,
                                size_t numDependencies,
                                CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(phGraphNode != NULL && nodeParams != NULL, CUDA_ERROR_INVALID_VALUE);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (graph_live_locked(hGraph))
        rc = check_deps_locked(hGraph, dependencies, numDependencies);
    if (rc == CUDA_SUCCESS)
        rc = graph_alloc_node_locked(hGraph, nodeParams->bytesize,
                                     &nodeParams->poolProps,
                                     nodeParams->accessDescs,
                                     nodeParams->accessDescCount, phGraphNode);
    if (rc == CUDA_SUCCESS)
        nodeParams->dptr = (*phGraphNode)->dptr;
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuGraphAddMemAllocNode)

CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                               const CUgraphNode *dependencies,
                               size_t numDependencies, CUdeviceptr dptr)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(phGraphNode != NULL, CUDA_ERROR_INVALID_VALUE);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (graph_live_locked(hGraph))
        rc = check_deps_locked(hGraph, dependencies, numDependencies);
    if (rc == CUDA_SUCCESS)
        rc = graph_free_node_locked(hGraph, dptr, phGraphNode);
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuGraphAddMemFreeNode)

/* accessDescs points at the node's own copy, valid while the node lives. */
CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode,
                                      CUDA_MEM_ALLOC_NODE_PARAMS *params_out)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(params_out != NULL, CUDA_ERROR_INVALID_VALUE);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    CUgraphNode n = node_live_locked(hNode);
    if (n != NULL && n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
        *params_out = (CUDA_MEM_ALLOC_NODE_PARAMS){
            .poolProps = n->props, .accessDescs = n->access,
            .accessDescCount = n->naccess, .bytesize = n->bytes,
            .dptr = n->dptr };
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuGraphMemAllocNodeGetParams)

CUresult cuGraphMemFreeNodeGetParams(CUgraphNode hNode, CUdeviceptr *dptr_out)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(dptr_out != NULL, CUDA_ERROR_INVALID_VALUE);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    CUgraphNode n = node_live_locked(hNode);
    if (n != NULL && n->type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
        *dptr_out = n->dptr;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuGraphMemFreeNodeGetParams)

/* A kernel node's function and words, copied from src into n. */
static void node_copy_kernel(CUgraphNode n, CUgraphNode src)
{
    n->func = src->func;
    n->nparams = src->nparams;
    for (int i = 0; i < 8; i++) {
        n->words[i] = src->words[i];
        n->wptrs[i] = &n->words[i];
    }
}

/* A registered copy of g (child graph nodes only), owned by owner. */
static CUgraph graph_clone_locked(CUgraph g, CUgraphNode owner)
{
    CUgraph c = graph_new_locked();
    if (c == NULL)
        return NULL;
    c->owner = owner;
    for (size_t i = 0; i < g->nnodes; i++) {
        CUgraphNode n = graph_add_node_locked(c, g->nodes[i]->type);
        if (n != NULL)
            node_copy_kernel(n, g->nodes[i]);
        if (n == NULL ||
            (g->nodes[i]->child != NULL &&
             (n->child = graph_clone_locked(g->nodes[i]->child, n)) == NULL)) {
            graph_free_locked(c);
            return NULL;
        }
    }
    return c;
}

/*
 * The child graph is cloned into the node. Like the real driver's
 * cuGraphAddChildGraphNode, a child graph holding memory allocation or free
 * nodes is refused (CUDA_ERROR_INVALID_VALUE): only cuGraphAddNode with
 * ownership moved takes those, and that is not modelled.
 */
CUresult cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                  const CUgraphNode *dependencies,
                                  size_t numDependencies, CUgraph childGraph)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(phGraphNode != NULL, CUDA_ERROR_INVALID_VALUE);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (graph_live_locked(hGraph) && graph_live_locked(childGraph) &&
        hGraph != childGraph && !graph_has_mem_locked(childGraph))
        rc = check_deps_locked(hGraph, dependencies, numDependencies);
    if (rc == CUDA_SUCCESS) {
        CUgraphNode n = graph_add_node_locked(hGraph, CU_GRAPH_NODE_TYPE_GRAPH);
        if (n != NULL && (n->child = graph_clone_locked(childGraph, n)) == NULL) {
            drop_ptr((void **)hGraph->nodes, &hGraph->nnodes, n);
            free(n);
            n = NULL;
        }
        if (n == NULL)
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        else
            *phGraphNode = n;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuGraphAddChildGraphNode)

/* The node's own graph, not a copy: memory nodes can not be added to it. */
CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(phGraph != NULL, CUDA_ERROR_INVALID_VALUE);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    CUgraphNode n = node_live_locked(hNode);
    if (n != NULL && n->type == CU_GRAPH_NODE_TYPE_GRAPH) {
        *phGraph = n->child;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuGraphChildGraphNodeGetGraph)

/*
 * nodes NULL: *numNodes is set to the number of nodes. Otherwise up to
 * *numNodes are stored (in the order they were added), the rest of the
 * array set to NULL, and *numNodes becomes the number stored.
 */
CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(numNodes != NULL, CUDA_ERROR_INVALID_VALUE);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (graph_live_locked(hGraph)) {
        if (nodes == NULL) {
            *numNodes = hGraph->nnodes;
        } else {
            size_t n = 0;
            for (; n < *numNodes && n < hGraph->nnodes; n++)
                nodes[n] = hGraph->nodes[n];
            for (size_t i = n; i < *numNodes; i++)
                nodes[i] = NULL;
            *numNodes = n;
        }
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuGraphGetNodes)

CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(type != NULL, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&g_lock);
    CUgraphNode n = node_live_locked(hNode);
    if (n != NULL)
        *type = n->type;
    pthread_mutex_unlock(&g_lock);
    return n != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
LOCAL(cuGraphNodeGetType)

/* A kernel node's function and parameters (pointers into the node, valid
 * while it lives); v1 writes the fields before kern. */
static CUresult kernel_node_params(CUgraphNode hNode,
                                   CUDA_KERNEL_NODE_PARAMS *p, bool v2)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(p != NULL, CUDA_ERROR_INVALID_VALUE);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    CUgraphNode n = node_live_locked(hNode);
    if (n != NULL && n->type == CU_GRAPH_NODE_TYPE_KERNEL) {
        CUDA_KERNEL_NODE_PARAMS k = { .func = n->func, .gridDimX = 1,
            .gridDimY = 1, .gridDimZ = 1, .blockDimX = 1, .blockDimY = 1,
            .blockDimZ = 1, .kernelParams = n->wptrs };
        memcpy(p, &k, v2 ? sizeof k : offsetof(CUDA_KERNEL_NODE_PARAMS, kern));
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuGraphKernelNodeGetParams(CUgraphNode hNode,
                                    CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    return kernel_node_params(hNode, nodeParams, false);
}
LOCAL(cuGraphKernelNodeGetParams)

CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hNode,
                                       CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    return kernel_node_params(hNode, nodeParams, true);
}
LOCAL(cuGraphKernelNodeGetParams_v2)

/* Collect g's allocations, frees and kernels (child graphs included) into e. */
static bool exec_collect_locked(CUgraphExec e, CUgraph g)
{
    for (size_t i = 0; i < g->nnodes; i++) {
        CUgraphNode n = g->nodes[i];
        if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
            size_t *a = realloc(e->allocs, (e->nallocs + 1) * sizeof *a);
            if (a == NULL)
                return false;
            e->allocs = a;
            a[e->nallocs++] = n->galloc;
        } else if (n->type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
            CUdeviceptr *f = realloc(e->frees, (e->nfrees + 1) * sizeof *f);
            if (f == NULL)
                return false;
            e->frees = f;
            f[e->nfrees++] = n->dptr;
        } else if (n->type == CU_GRAPH_NODE_TYPE_KERNEL) {
            struct exec_kernel *k =
                realloc(e->kernels, (e->nkernels + 1) * sizeof *k);
            if (k == NULL)
                return false;
            e->kernels = k;
            k[e->nkernels].node = n;
            k[e->nkernels].func = n->func;
            k[e->nkernels].nparams = n->nparams;
            memcpy(k[e->nkernels].words, n->words, sizeof n->words);
            e->nkernels++;
        } else if (n->child != NULL && !exec_collect_locked(e, n->child)) {
            return false;
        }
    }
    return true;
}

static void exec_free(CUgraphExec e)
{
    free(e->allocs);
    free(e->frees);
    free(e->kernels);
    free(e);
}

/* Destroy the live executable graph e. Caller holds g_lock. */
static void exec_destroy_locked(CUgraphExec e)
{
    if (e->graph != NULL)
        e->graph->execs--;
    drop_ptr((void **)g_execs, &g_nexecs, e);
    exec_free(e);
}

static CUresult graph_reserve_locked(CUgraphExec e, bool autofree);
static CUresult run_kernel_locked(const struct CUfunc_st *fn,
                                  const CUdeviceptr *words);

#define INSTANTIATE_FLAGS                                   \
    (CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |      \
     CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH |            \
     CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY)

/*
 * Common part of the instantiation entry points. As the real driver
 * documents, a graph holding memory nodes can have only one executable
 * graph at a time (another instantiation: CUDA_ERROR_INVALID_VALUE).
 * Instantiating reserves nothing; uploading or launching does.
 */
static CUresult instantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                            unsigned long long flags)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(phGraphExec != NULL, CUDA_ERROR_INVALID_VALUE);
    CHECK((flags & ~(unsigned long long)INSTANTIATE_FLAGS) == 0,
          CUDA_ERROR_INVALID_VALUE);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (graph_live_locked(hGraph) &&
        (hGraph->execs == 0 || !graph_has_mem_locked(hGraph))) {
        CUgraphExec e = calloc(1, sizeof *e);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        if (e != NULL) {
            e->graph = hGraph;
            e->flags = flags;
            if (exec_collect_locked(e, hGraph) &&
                push_ptr(PTRS(g_execs), &g_nexecs, &g_execs_cap, e)) {
                hGraph->execs++;
                *phGraphExec = e;
                rc = CUDA_SUCCESS;
            } else {
                exec_free(e);
            }
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* The 10.0 and 11.0 ABI: no flags; no diagnostics are ever written. */
static CUresult instantiate_logged(CUgraphExec *phGraphExec, CUgraph hGraph,
                                   CUgraphNode *phErrorNode, char *logBuffer,
                                   size_t bufferSize)
{
    if (phErrorNode != NULL)
        *phErrorNode = NULL;
    if (logBuffer != NULL && bufferSize > 0)
        logBuffer[0] = '\0';
    return instantiate(phGraphExec, hGraph, 0);
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                            CUgraphNode *phErrorNode, char *logBuffer,
                            size_t bufferSize)
{
    return instantiate_logged(phGraphExec, hGraph, phErrorNode, logBuffer,
                              bufferSize);
}
LOCAL(cuGraphInstantiate)

CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                               CUgraphNode *phErrorNode, char *logBuffer,
                               size_t bufferSize)
{
    return instantiate_logged(phGraphExec, hGraph, phErrorNode, logBuffer,
                              bufferSize);
}
LOCAL(cuGraphInstantiate_v2)

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                     unsigned long long flags)
{
    return instantiate(phGraphExec, hGraph, flags);
}
LOCAL(cuGraphInstantiateWithFlags)

static CUresult graph_upload(CUgraphExec e, CUstream h, bool ptsz);

/*
 * The flags of cuGraphInstantiateWithFlags plus UPLOAD (then the graph is
 * uploaded to hUploadStream; a failed upload destroys the new executable
 * graph and gives the upload's error). result_out says SUCCESS or ERROR;
 * hErrNode_out is always NULL.
 */
static CUresult instantiate_with_params(CUgraphExec *phGraphExec,
                                        CUgraph hGraph,
                                        CUDA_GRAPH_INSTANTIATE_PARAMS *p,
                                        bool ptsz)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(p != NULL && phGraphExec != NULL, CUDA_ERROR_INVALID_VALUE);
    p->hErrNode_out = NULL;
    p->result_out = CUDA_GRAPH_INSTANTIATE_ERROR;
    bool upload = (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0;
    CUgraphExec e = NULL;
    CUresult rc = instantiate(&e, hGraph,
                              p->flags & ~(cuuint64_t)
                                             CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);
    if (rc == CUDA_SUCCESS && upload) {
        rc = graph_upload(e, p->hUploadStream, ptsz);
        if (rc != CUDA_SUCCESS) {
            pthread_mutex_lock(&g_lock);
            exec_destroy_locked(e);
            pthread_mutex_unlock(&g_lock);
        }
    }
    if (rc == CUDA_SUCCESS) {
        *phGraphExec = e;
        p->result_out = CUDA_GRAPH_INSTANTIATE_SUCCESS;
    }
    return rc;
}

WITH_PTSZ(cuGraphInstantiateWithParams, (CUgraphExec *phGraphExec,
           CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams),
          instantiate_with_params, phGraphExec, hGraph, instantiateParams)

/*
 * Its allocations that a launch made live stay live and counted until
 * freed, as with the real driver.
 */
CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (exec_live_locked(hGraphExec)) {
        exec_destroy_locked(hGraphExec);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuGraphExecDestroy)

/*
 * Make room in the graph pools for e's allocations: per device, what its
 * allocations that are not live need beyond the graph pool's free reserve
 * (reserved - used) grows the reserve, rounded up to POOL_GRANULE, counted
 * against the device. With autofree the live ones count as freed first.
 * Either every growth fits or nothing changes (CUDA_ERROR_OUT_OF_MEMORY).
 * Caller holds g_lock.
 */
static CUresult graph_reserve_locked(CUgraphExec e, bool autofree)
{
    size_t need[MAX_DEVICES] = { 0 }, freed[MAX_DEVICES] = { 0 };
    size_t grow[MAX_DEVICES] = { 0 };
    for (size_t i = 0; i < e->nallocs; i++) {
        const struct galloc *a = &g_gallocs[e->allocs[i]];
        if (!a->live)
            need[a->dev] += a->bytes;
        else if (autofree) {
            need[a->dev] += a->bytes;
            freed[a->dev] += a->bytes;
        }
    }
    for (int d = 0; d < g_cfg.devices; d++) {
        const struct device_state *s = &g_dev[d];
        size_t free_reserve = s->graph_reserved - (s->graph_used - freed[d]);
        if (need[d] > g_cfg.total_bytes)
            return CUDA_ERROR_OUT_OF_MEMORY;
        if (need[d] > free_reserve)
            grow[d] = round_up(need[d] - free_reserve, POOL_GRANULE);
        if (!fits_locked(d, grow[d]))
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    for (int d = 0; d < g_cfg.devices; d++) {
        struct device_state *s = &g_dev[d];
        charge_locked(d, grow[d]);
        s->graph_reserved += grow[d];
        if (s->graph_reserved > s->graph_reserved_peak)
            s->graph_reserved_peak = s->graph_reserved;
    }
    return CUDA_SUCCESS;
}

/* The stream of a launch or upload: checked like the stream-ordered calls. */
static CUresult graph_stream(CUstream h, bool ptsz, CUcontext *ctx,
                             CUstreamCaptureStatus *capture)
{
    CUresult rc = stream_current(h, ptsz, ctx);
    if (rc == CUDA_SUCCESS)
        rc = stream_target_locked(h, ptsz, ctx, capture);
    if (rc == CUDA_SUCCESS && !ctx_usable_locked(*ctx))
        rc = CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (rc == CUDA_SUCCESS && *capture != CU_STREAM_CAPTURE_STATUS_NONE)
        rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* not modelled */
    return rc;
}

CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                              CUgraphExecUpdateResultInfo *resultInfo)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    pthread_mutex_lock(&g_lock);
    CUresult rc = exec_live_locked(hGraphExec) && graph_live_locked(hGraph)
                      ? CUDA_SUCCESS
                      : CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st fresh = { 0 };
    if (rc == CUDA_SUCCESS && !exec_collect_locked(&fresh, hGraph))
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (rc == CUDA_SUCCESS &&
        (fresh.nkernels != hGraphExec->nkernels || fresh.nallocs > 0 ||
         fresh.nfrees > 0 || hGraphExec->nallocs > 0 || hGraphExec->nfrees > 0))
        rc = CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    if (rc == CUDA_SUCCESS) {
        free(hGraphExec->kernels);
        hGraphExec->kernels = fresh.kernels;
        fresh.kernels = NULL;
    }
    free(fresh.kernels);
    free(fresh.allocs);
    free(fresh.frees);
    pthread_mutex_unlock(&g_lock);
    if (resultInfo != NULL && rc != CUDA_ERROR_INVALID_VALUE)
        *resultInfo = (CUgraphExecUpdateResultInfo){
            .result = rc == CUDA_SUCCESS ? 0 : 1 };
    return rc;
}
LOCAL(cuGraphExecUpdate_v2)

static CUresult exec_kernel_set(CUgraphExec e, CUgraphNode hNode,
                                const CUDA_KERNEL_NODE_PARAMS *p)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(p != NULL && p->kernelParams != NULL && p->extra == NULL,
          CUDA_ERROR_INVALID_VALUE);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; exec_live_locked(e) && i < e->nkernels; i++) {
        struct exec_kernel *k = &e->kernels[i];
        if (k->node != hNode || (p->func != NULL && p->func != k->func))
            continue;
        for (int j = 0; j < k->nparams && j < 8; j++)
            memcpy(&k->words[j], p->kernelParams[j], sizeof k->words[j]);
        rc = CUDA_SUCCESS;
        break;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuGraphExecKernelNodeSetParams(CUgraphExec hGraphExec,
                                        CUgraphNode hNode,
                                        const CUDA_KERNEL_NODE_PARAMS *p)
{
    return exec_kernel_set(hGraphExec, hNode, p);
}
LOCAL(cuGraphExecKernelNodeSetParams)

CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec hGraphExec,
                                           CUgraphNode hNode,
                                           const CUDA_KERNEL_NODE_PARAMS *p)
{
    return exec_kernel_set(hGraphExec, hNode, p);
}
LOCAL(cuGraphExecKernelNodeSetParams_v2)

/* Reserves what a launch of e will need (graph_reserve_locked). */
static CUresult graph_upload(CUgraphExec e, CUstream h, bool ptsz)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUcontext ctx = NULL;
    CUstreamCaptureStatus capture;
    pthread_mutex_lock(&g_lock);
    CUresult rc = exec_live_locked(e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        rc = graph_stream(h, ptsz, &ctx, &capture);
    if (rc == CUDA_SUCCESS)
        rc = graph_reserve_locked(e, false);
    pthread_mutex_unlock(&g_lock);
    return rc;
}

WITH_PTSZ(cuGraphUpload, (CUgraphExec hGraphExec, CUstream hStream),
          graph_upload, hGraphExec, hStream)

/*
 * A launch runs at once: its allocations become live (graph memory in use
 * rises by their bytes, from the graph pool's reserve, grown as needed),
 * then its free nodes free what they name (if live), then its kernels run
 * as launches do (the first fault is the answer). As the real driver
 * documents, launching while an allocation of a previous launch is still
 * live gives CUDA_ERROR_INVALID_VALUE, unless the executable graph was made
 * with AUTO_FREE_ON_LAUNCH: then those are freed first.
 */
static CUresult graph_launch(CUgraphExec e, CUstream h, bool ptsz)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUcontext ctx = NULL;
    CUstreamCaptureStatus capture;
    pthread_mutex_lock(&g_lock);
    CUresult rc = exec_live_locked(e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        rc = graph_stream(h, ptsz, &ctx, &capture);
    bool autofree =
        rc == CUDA_SUCCESS &&
        (e->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) != 0;
    for (size_t i = 0; rc == CUDA_SUCCESS && !autofree && i < e->nallocs; i++)
        if (g_gallocs[e->allocs[i]].live)
            rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        rc = graph_reserve_locked(e, autofree);
    if (rc == CUDA_SUCCESS) {
        for (size_t i = 0; i < e->nallocs; i++)
            if (g_gallocs[e->allocs[i]].live)
                galloc_free_locked(e->allocs[i]);
        for (size_t i = 0; i < e->nallocs; i++) {
            struct galloc *a = &g_gallocs[e->allocs[i]];
            struct device_state *s = &g_dev[a->dev];
            a->live = true;
            s->graph_used += a->bytes;
            if (s->graph_used > s->graph_used_peak)
                s->graph_used_peak = s->graph_used;
        }
        for (size_t i = 0; i < e->nfrees; i++) {
            long gi = galloc_index_locked(e->frees[i]);
            if (gi >= 0 && g_gallocs[gi].live)
                galloc_free_locked((size_t)gi);
        }
        for (size_t i = 0; i < e->nkernels; i++) {
            CUresult k = run_kernel_locked(e->kernels[i].func,
                                           e->kernels[i].words);
            if (rc == CUDA_SUCCESS)
                rc = k;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

WITH_PTSZ(cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream),
          graph_launch, hGraphExec, hStream)

/*
 * The device's graph memory: used is the live graph allocations' bytes,
 * reserved what the graph pool holds (counted against the device). The
 * high-water marks can only be reset, with 0, to the current amounts.
 */
static CUresult graph_mem_attribute(CUdevice device, CUgraphMem_attribute attr,
                                    void *value, bool set)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(valid_device(device), CUDA_ERROR_INVALID_DEVICE);
    CHECK(value != NULL, CUDA_ERROR_INVALID_VALUE);
    CUresult rc = CUDA_SUCCESS;
    cuuint64_t u;
    memcpy(&u, value, sizeof u);
    pthread_mutex_lock(&g_lock);
    struct device_state *s = &g_dev[device];
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
        u = s->graph_used;
        rc = set ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
        break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
        u = s->graph_reserved;
        rc = set ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
        break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
        if (set && u == 0)
            s->graph_used_peak = s->graph_used;
        else if (set)
            rc = CUDA_ERROR_INVALID_VALUE;
        u = s->graph_used_peak;
        break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
        if (set && u == 0)
            s->graph_reserved_peak = s->graph_reserved;
        else if (set)
            rc = CUDA_ERROR_INVALID_VALUE;
        u = s->graph_reserved_peak;
        break;
    default:
        rc = CUDA_ERROR_INVALID_VALUE;
        break;
    }
    pthread_mutex_unlock(&g_lock);
    if (rc == CUDA_SUCCESS && !set)
        memcpy(value, &u, sizeof u);
    return rc;
}

CUresult cuDeviceGetGraphMemAttribute(CUdevice device,
                                      CUgraphMem_attribute attr, void *value)
{
    return graph_mem_attribute(device, attr, value, false);
}
LOCAL(cuDeviceGetGraphMemAttribute)

CUresult cuDeviceSetGraphMemAttribute(CUdevice device,
                                      CUgraphMem_attribute attr, void *value)
{
    return graph_mem_attribute(device, attr, value, true);
}
LOCAL(cuDeviceSetGraphMemAttribute)

/* The graph pool gives back its reserve beyond its live allocations. */
CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(valid_device(device), CUDA_ERROR_INVALID_DEVICE);
    pthread_mutex_lock(&g_lock);
    struct device_state *s = &g_dev[device];
    size_t keep = round_up(s->graph_used, POOL_GRANULE);
    if (keep < s->graph_reserved) {
        s->used -= s->graph_reserved - keep;
        s->graph_reserved = keep;
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}
LOCAL(cuDeviceGraphMemTrim)

/* ---- Virtual memory management -------------------------------------------- */

/*
 * Validate cuMemCreate-style properties: pinned memory on a device (*dev its
 * ordinal) or on the host (*dev = -1; any of the three host location types).
 */
static CUresult check_alloc_prop(const CUmemAllocationProp *prop, int *dev)
{
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return CUDA_ERROR_INVALID_VALUE;
    switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        if (!valid_device(prop->location.id))
            return CUDA_ERROR_INVALID_DEVICE;
        *dev = prop->location.id;
        return CUDA_SUCCESS;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        *dev = -1;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/*
 * array (of *cap elements of elem bytes) reallocated to twice the capacity,
 * *cap updated; NULL (array and *cap unchanged) if out of memory.
 */
static void *grow_array(void *array, size_t *cap, size_t elem)
{
    size_t new_cap = *cap != 0 ? *cap * 2 : 64;
    void *grown = realloc(array, new_cap * elem);
    if (grown != NULL)
        *cap = new_cap;
    return grown;
}

/* The allocation behind handle value h, valid or not (NULL if unknown). */
static struct vmm_alloc *vmm_alloc_of_locked(CUmemGenericAllocationHandle h)
{
    if (h < VMM_HANDLE_BASE || h - VMM_HANDLE_BASE >= g_vmm_nhandles)
        return NULL;
    return &g_vmm_allocs[g_vmm_handles[h - VMM_HANDLE_BASE]];
}

/* The allocation behind a valid handle, or NULL. Caller holds g_lock. */
static struct vmm_alloc *vmm_handle_locked(CUmemGenericAllocationHandle h)
{
    struct vmm_alloc *a = vmm_alloc_of_locked(h);
    return a != NULL && a->refs > 0 ? a : NULL;
}

/* A new handle value for allocation index alloc; 0 if out of memory. */
static CUmemGenericAllocationHandle vmm_new_handle_locked(size_t alloc)
{
    if (g_vmm_nhandles == g_vmm_handles_cap) {
        size_t *grown = grow_array(g_vmm_handles, &g_vmm_handles_cap,
                                   sizeof *grown);
        if (grown == NULL)
            return 0;
        g_vmm_handles = grown;
    }
    g_vmm_handles[g_vmm_nhandles] = alloc;
    return VMM_HANDLE_BASE + g_vmm_nhandles++;
}

/* Give a's memory back once no handle references it and nothing maps it. */
static void vmm_maybe_free_locked(struct vmm_alloc *a)
{
    if (a->live && a->refs == 0 && a->maps == 0) {
        a->live = false;
        if (a->dev >= 0)
            g_dev[a->dev].used -= a->size;
    }
}

/* Whether [a, a + an) and [b, b + bn) overlap. */
static bool ranges_overlap(CUdeviceptr a, size_t an, CUdeviceptr b, size_t bn)
{
    return a < b + bn && b < a + an;
}

/* Whether [inner, inner + in) lies within [outer, outer + on). */
static bool range_within(CUdeviceptr inner, size_t in, CUdeviceptr outer,
                         size_t on)
{
    return inner >= outer && in <= on && inner - outer <= on - in;
}

/* The mapping that contains p, or NULL. Caller holds g_lock. */
static const struct vmm_map *mapping_of_locked(CUdeviceptr p)
{
    for (size_t i = 0; i < g_vmm_nmaps; i++)
        if (range_within(p, 1, g_vmm_maps[i].va, g_vmm_maps[i].size))
            return &g_vmm_maps[i];
    return NULL;
}

/* Both options give 2 MiB, for device and host memory alike. */
CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                       const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (granularity == NULL || prop == NULL ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult rc = check_alloc_prop(prop, &dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    *granularity = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}
LOCAL(cuMemGetAllocationGranularity)

/*
 * Device memory counts against prop->location.id at once; host memory
 * against nothing. No context is needed. requestedHandleTypes and allocFlags
 * are not looked at.
 */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                     const CUmemAllocationProp *prop, unsigned long long flags)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (handle == NULL || prop == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int dev;
    CUresult rc = check_alloc_prop(prop, &dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (size == 0 || size % VMM_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* STANDIN_VMM_HOST_FAIL (read at each call): host memory is refused,
     * as a locked-memory or container limit makes the real driver do. */
    if (dev < 0 && getenv("STANDIN_VMM_HOST_FAIL") != NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;

    rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    if (g_vmm_nallocs == g_vmm_allocs_cap) {
        struct vmm_alloc *grown = grow_array(g_vmm_allocs, &g_vmm_allocs_cap,
                                             sizeof *grown);
        if (grown != NULL)
            g_vmm_allocs = grown;
    }
    if (g_vmm_nallocs < g_vmm_allocs_cap &&
        (dev < 0 || fits_locked(dev, size))) {
        CUmemGenericAllocationHandle h = vmm_new_handle_locked(g_vmm_nallocs);
        if (h != 0) {
            g_vmm_allocs[g_vmm_nallocs++] = (struct vmm_alloc){
                .dev = dev, .size = size, .refs = 1, .live = true };
            if (dev >= 0)
                charge_locked(dev, size);
            *handle = h;
            rc = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (rc == CUDA_SUCCESS)
        atomic_fetch_add_explicit(dev >= 0 ? &g_vmm_creates
                                           : &g_vmm_host_creates,
                                  1, memory_order_relaxed);
    return rc;
}
LOCAL(cuMemCreate)

/*
 * Drops one reference; the handle is invalid once there are none, and the
 * memory goes back once it is also unmapped everywhere.
 */
CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct vmm_alloc *a = vmm_handle_locked(handle);
    if (a != NULL) {
        a->refs--;
        vmm_maybe_free_locked(a);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemRelease)

/*
 * The handle value that the mapping containing addr was made with (the real
 * driver guarantees the same value), with one more reference.
 */
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
                                     void *addr)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(handle != NULL, CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)addr;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    const struct vmm_map *m = mapping_of_locked(p);
    if (m != NULL) {
        vmm_alloc_of_locked(m->handle)->refs++;
        *handle = m->handle;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemRetainAllocationHandle)

/*
 * A fresh range from the VA window, aligned to the granularity or to
 * alignment if larger (a power of two, or 0); the addr hint is ignored.
 * size must be a multiple of the granularity; flags must be 0.
 */
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                             CUdeviceptr addr, unsigned long long flags)
{
    (void)addr;
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (ptr == NULL || size == 0 || size % VMM_GRANULARITY != 0 || flags != 0 ||
        (alignment & (alignment - 1)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > VMM_GRANULARITY ? alignment : VMM_GRANULARITY;
    if (align > VA_WINDOW || size > VA_WINDOW)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    CUdeviceptr va = (g_va_next + align - 1) / align * align;
    if (g_va_nranges == g_va_ranges_cap) {
        struct va_range *grown = grow_array(g_va_ranges, &g_va_ranges_cap,
                                            sizeof *grown);
        if (grown != NULL)
            g_va_ranges = grown;
    }
    if (g_va_nranges < g_va_ranges_cap &&
        range_within(va, size, VA_BASE, VA_WINDOW)) {
        g_va_ranges[g_va_nranges++] =
            (struct va_range){ .va = va, .size = size };
        g_va_next = va + size;
        *ptr = va;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemAddressReserve)

/*
 * ptr and size must be exactly a reservation's. A reservation that still has
 * mappings in it can not be freed here (CUDA_ERROR_INVALID_VALUE).
 */
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_va_nranges; i++) {
        if (g_va_ranges[i].va != ptr || g_va_ranges[i].size != size)
            continue;
        bool mapped = false;
        for (size_t m = 0; m < g_vmm_nmaps; m++)
            mapped |= ranges_overlap(ptr, size, g_vmm_maps[m].va,
                                     g_vmm_maps[m].size);
        if (!mapped) {
            g_va_ranges[i] = g_va_ranges[--g_va_nranges];
            rc = CUDA_SUCCESS;
        }
        break;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemAddressFree)

/*
 * Maps the first size bytes of the handle's allocation at ptr: offset must be
 * 0 (as documented), ptr and size multiples of the granularity, the range
 * inside one reservation and not overlapping another mapping.
 */
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                  CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (size == 0 || size % VMM_GRANULARITY != 0 ||
        ptr % VMM_GRANULARITY != 0 || offset != 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct vmm_alloc *a = vmm_handle_locked(handle);
    bool reserved = false, overlaps = false;
    for (size_t i = 0; i < g_va_nranges; i++)
        reserved |= range_within(ptr, size, g_va_ranges[i].va,
                                 g_va_ranges[i].size);
    for (size_t i = 0; i < g_vmm_nmaps; i++)
        overlaps |= ranges_overlap(ptr, size, g_vmm_maps[i].va,
                                   g_vmm_maps[i].size);
    if (a != NULL && size <= a->size && reserved && !overlaps) {
        if (g_vmm_nmaps == g_vmm_maps_cap) {
            struct vmm_map *grown = grow_array(g_vmm_maps, &g_vmm_maps_cap,
                                               sizeof *grown);
            if (grown != NULL)
                g_vmm_maps = grown;
        }
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        if (g_vmm_nmaps < g_vmm_maps_cap) {
            g_vmm_maps[g_vmm_nmaps++] = (struct vmm_map){
                .va = ptr, .size = size, .handle = handle };
            a->maps++;
            rc = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemMap)

/*
 * Removes the mappings inside [ptr, ptr + size), which must contain at least
 * one and cut none in part. An allocation whose handles were all released
 * goes back with its last mapping.
 */
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    size_t inside = 0;
    bool cut = false;
    for (size_t i = 0; i < g_vmm_nmaps; i++) {
        const struct vmm_map *m = &g_vmm_maps[i];
        if (range_within(m->va, m->size, ptr, size))
            inside++;
        else if (ranges_overlap(m->va, m->size, ptr, size))
            cut = true;
    }
    if (inside > 0 && !cut) {
        for (size_t i = 0; i < g_vmm_nmaps;) {
            if (range_within(g_vmm_maps[i].va, g_vmm_maps[i].size, ptr, size)) {
                struct vmm_alloc *a = vmm_alloc_of_locked(g_vmm_maps[i].handle);
                a->maps--;
                vmm_maybe_free_locked(a);
                g_vmm_maps[i] = g_vmm_maps[--g_vmm_nmaps];
            } else {
                i++;
            }
        }
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemUnmap)

/*
 * Nothing is enforced: the descriptors are checked (device or host
 * locations, PROT_NONE / READ / READWRITE) and the range must be mapped
 * completely.
 */
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size,
                        const CUmemAccessDesc *desc, size_t count)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (desc == NULL || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        CUmemAccess_flags f = desc[i].flags;
        if (f != CU_MEM_ACCESS_FLAGS_PROT_NONE &&
            f != CU_MEM_ACCESS_FLAGS_PROT_READ &&
            f != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
        switch (desc[i].location.type) {
        case CU_MEM_LOCATION_TYPE_DEVICE:
            if (!valid_device(desc[i].location.id))
                return CUDA_ERROR_INVALID_DEVICE;
            break;
        case CU_MEM_LOCATION_TYPE_HOST:
        case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
            break;
        default:
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    /* Mappings never overlap, so their overlaps with the range add up. */
    size_t covered = 0;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_vmm_nmaps; i++) {
        const struct vmm_map *m = &g_vmm_maps[i];
        if (!ranges_overlap(m->va, m->size, ptr, size))
            continue;
        CUdeviceptr lo = m->va > ptr ? m->va : ptr;
        CUdeviceptr hi = m->va + m->size < ptr + size ? m->va + m->size
                                                      : ptr + size;
        covered += hi - lo;
    }
    /* Recorded per mapping and device (host locations are not asked). */
    if (covered == size) {
        for (size_t i = 0; i < g_vmm_nmaps; i++) {
            struct vmm_map *m = &g_vmm_maps[i];
            if (!ranges_overlap(m->va, m->size, ptr, size))
                continue;
            for (size_t k = 0; k < count; k++)
                if (desc[k].location.type == CU_MEM_LOCATION_TYPE_DEVICE)
                    m->access[desc[k].location.id] =
                        (unsigned char)desc[k].flags;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return covered == size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
LOCAL(cuMemSetAccess)

/* The access flags of the mapping at PTR for LOCATION (a device). */
CUresult cuMemGetAccess(unsigned long long *flags,
                        const CUmemLocation *location, CUdeviceptr ptr)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(flags != NULL && location != NULL, CUDA_ERROR_INVALID_VALUE);
    CHECK(location->type == CU_MEM_LOCATION_TYPE_DEVICE &&
              valid_device(location->id),
          CUDA_ERROR_INVALID_DEVICE);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    const struct vmm_map *m = mapping_of_locked(ptr);
    if (m != NULL) {
        *flags = m->access[location->id];
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemGetAccess)

/*
 * The range the driver knows P in: the live allocation (cuMemAlloc and
 * the like) or the VMM mapping that contains it, with its device (-1: VMM
 * memory on the host). An address reserved with nothing mapped behind it
 * is in none, as on r580, where a pointer query of it answers
 * CUDA_ERROR_INVALID_VALUE and cuMemGetAddressRange CUDA_ERROR_NOT_FOUND
 * (scripts/gpu/research/unmapped_query.cu, session 21). Takes g_lock.
 */
static bool known_range(CUdeviceptr p, int *dev, CUdeviceptr *start,
                        size_t *size)
{
    size_t i;
    bool known = true;
    pthread_mutex_lock(&g_lock);
    const struct vmm_map *m = NULL;
    if (find_containing_locked(p, dev, &i)) {
        *start = g_dev[*dev].blocks[i].addr;
        *size = g_dev[*dev].blocks[i].bytes;
    } else if ((m = mapping_of_locked(p)) != NULL) {
        *dev = vmm_alloc_of_locked(m->handle)->dev;
        *start = m->va;
        *size = m->size;
    } else {
        known = false;
    }
    pthread_mutex_unlock(&g_lock);
    return known;
}

/*
 * Five attributes of the memory at PTR: its type, device, range and
 * whether it is mapped; the others answer CUDA_ERROR_NOT_SUPPORTED (not
 * modelled), as does VMM memory on the host. An address the driver does
 * not know (above) answers CUDA_ERROR_INVALID_VALUE.
 */
CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
                               CUdeviceptr ptr)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(data != NULL, CUDA_ERROR_INVALID_VALUE);
    int dev = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    if (!known_range(ptr, &dev, &start, &size))
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0)
        return CUDA_ERROR_NOT_SUPPORTED;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = dev;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = start;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = size;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(bool *)data = true;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_NOT_SUPPORTED;
}
LOCAL(cuPointerGetAttribute)

/* The start and size of the range the driver knows DPTR in (above). */
CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize,
                                 CUdeviceptr dptr)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    int dev = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    if (!known_range(dptr, &dev, &start, &size))
        return CUDA_ERROR_NOT_FOUND;
    if (pbase != NULL)
        *pbase = start;
    if (psize != NULL)
        *psize = size;
    return CUDA_SUCCESS;
}
LOCAL(cuMemGetAddressRange_v2)

/*
 * Peer access from the current context's device to PEER's, recorded per
 * pair: a second ask answers CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED. (On
 * the real driver it maps the peer's cuMemAlloc memory for this device;
 * VMM memory needs cuMemSetAccess besides, which the stand-in's
 * cuMemGetAccess shows.)
 */
static unsigned g_peer_access[MAX_DEVICES]; /* bit d of [p]: d reaches p */
CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(flags == 0, CUDA_ERROR_INVALID_VALUE);
    CUcontext ctx;
    CUresult rc = check_current(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!ctx_exists(peer))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (peer->dev == ctx->dev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_lock);
    unsigned bit = 1u << ctx->dev;
    rc = (g_peer_access[peer->dev] & bit)
             ? CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
             : CUDA_SUCCESS;
    g_peer_access[peer->dev] |= bit;
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuCtxEnablePeerAccess)

/*
 * Only POSIX file descriptors: other real types give
 * CUDA_ERROR_NOT_SUPPORTED, anything else CUDA_ERROR_INVALID_VALUE.
 */
static CUresult check_shareable_type(CUmemAllocationHandleType type)
{
    switch (type) {
    case CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR:
        return CUDA_SUCCESS;
    case CU_MEM_HANDLE_TYPE_WIN32:
    case CU_MEM_HANDLE_TYPE_WIN32_KMT:
    case CU_MEM_HANDLE_TYPE_FABRIC:
        return CUDA_ERROR_NOT_SUPPORTED;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/*
 * The "file descriptor" is (int)handle: not a real descriptor, and it holds
 * no reference (importing it works while the allocation's memory is there).
 */
CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                      CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType handleType,
                                      unsigned long long flags)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (shareableHandle == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = check_shareable_type(handleType);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&g_lock);
    bool valid = vmm_handle_locked(handle) != NULL;
    pthread_mutex_unlock(&g_lock);
    if (!valid)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = (int)handle;
    memcpy(shareableHandle, &fd, sizeof fd);
    return CUDA_SUCCESS;
}
LOCAL(cuMemExportToShareableHandle)

/* osHandle is the descriptor cast to a pointer, as for the real driver. */
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                        void *osHandle,
                                        CUmemAllocationHandleType shHandleType)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(handle != NULL, CUDA_ERROR_INVALID_VALUE);
    CUresult rc = check_shareable_type(shHandleType);
    if (rc != CUDA_SUCCESS)
        return rc;
    int fd = (int)(intptr_t)osHandle;
    rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    struct vmm_alloc *a =
        fd >= 0 ? vmm_alloc_of_locked((CUmemGenericAllocationHandle)fd) : NULL;
    if (a != NULL && a->live) {
        CUmemGenericAllocationHandle h =
            vmm_new_handle_locked(g_vmm_handles[fd - VMM_HANDLE_BASE]);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        if (h != 0) {
            a->refs++;
            *handle = h;
            rc = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemImportFromShareableHandle)

/* ---- Arrays --------------------------------------------------------------- */

/* Bytes per channel of an array format; 0 for formats not modelled. */
static size_t format_bytes(CUarray_format format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    default:
        return 0;
    }
}

/*
 * Bytes of one level of w x h x d elements of elem bytes: rows rounded up to
 * ARRAY_PITCH_ALIGN, times max(h, 1) and max(d, 1). False on overflow.
 */
static bool level_bytes(size_t w, size_t h, size_t d, size_t elem, size_t *out)
{
    size_t row;
    if (__builtin_mul_overflow(w, elem, &row) ||
        row > SIZE_MAX - (ARRAY_PITCH_ALIGN - 1))
        return false;
    row = round_up(row, ARRAY_PITCH_ALIGN);
    return !__builtin_mul_overflow(row, h != 0 ? h : 1, out) &&
           !__builtin_mul_overflow(*out, d != 0 ? d : 1, out);
}

/*
 * The size of an array with levels levels (1 unless mipmapped), each level
 * halving width, height and depth (at least 1; a layered array's depth
 * counts layers and is not halved). SIZE_MAX if it overflows. Descriptors
 * the model does not take give CUDA_ERROR_INVALID_VALUE: width 0, a format
 * not modelled, 1, 2 or 4 channels, unknown flags, no levels or more levels
 * than halving the largest extent down to 1 gives. Layered, cubemap and
 * other flag-specific extent rules are not checked.
 */
static CUresult array_size(const CUDA_ARRAY3D_DESCRIPTOR *desc,
                           unsigned int levels, size_t *size)
{
    size_t elem = format_bytes(desc->Format);
    unsigned int ch = desc->NumChannels;
    if (desc->Width == 0 || elem == 0 || (ch != 1 && ch != 2 && ch != 4) ||
        (desc->Flags & ~0x1ffu) != 0 || levels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    elem *= ch;
    bool layered = (desc->Flags & CUDA_ARRAY3D_LAYERED) != 0;
    size_t largest = desc->Width;
    if (desc->Height > largest)
        largest = desc->Height;
    if (!layered && desc->Depth > largest)
        largest = desc->Depth;
    unsigned int max_levels = 1;
    while (max_levels < 64 && (largest >> max_levels) != 0)
        max_levels++;
    if (levels > max_levels)
        return CUDA_ERROR_INVALID_VALUE;

    size_t total = 0;
    for (unsigned int l = 0; l < levels; l++) {
        size_t w = desc->Width >> l, h = desc->Height >> l;
        size_t d = layered ? desc->Depth : desc->Depth >> l;
        size_t bytes;
        if (!level_bytes(w != 0 ? w : 1, h != 0 ? h : 1, d != 0 ? d : 1, elem,
                         &bytes) ||
            bytes > SIZE_MAX - total) {
            *size = SIZE_MAX;
            return CUDA_SUCCESS;
        }
        total += bytes;
    }
    *size = total;
    return CUDA_SUCCESS;
}

/* Slot i of the arrays (mip false) or the mipmapped arrays. */
static struct array_state *array_at(bool mip, size_t i)
{
    return mip ? &g_mipmaps[i].a : &g_arrays[i].a;
}

/* arg: the bool mip of array_at. */
static bool array_slot_free(size_t i, const void *arg)
{
    return !array_at(*(const bool *)arg, i)->live;
}

/*
 * Create an array of size bytes in the current context, counted against its
 * device unless it has no backing memory (backed false); its slot in *index.
 * Too many live arrays give CUDA_ERROR_OUT_OF_MEMORY.
 */
static CUresult array_create(bool mip, size_t size, bool backed, size_t *index)
{
    CUcontext ctx;
    CUresult rc = check_current(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (size == SIZE_MAX)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t bytes = backed ? size : 0;
    size_t *next = mip ? &g_mipmaps_next : &g_arrays_next;
    rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    if (!ctx_usable_locked(ctx)) {
        rc = CUDA_ERROR_CONTEXT_IS_DESTROYED;
    } else if (fits_locked(ctx->dev, bytes)) {
        long i = take_slot_locked(next, ARRAY_SLOTS, array_slot_free, &mip);
        if (i >= 0) {
            *array_at(mip, (size_t)i) = (struct array_state){
                .owner = ctx, .size = size, .bytes = bytes, .live = true };
            charge_locked(ctx->dev, bytes);
            *index = (size_t)i;
            rc = CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&g_lock);
    if (rc == CUDA_SUCCESS)
        atomic_fetch_add_explicit(&g_array_creates, 1, memory_order_relaxed);
    return rc;
}

/* A 1D (Height 0) or 2D array. */
CUresult cuArrayCreate_v2(CUarray *pHandle,
                          const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (pHandle == NULL || pAllocateArray == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUDA_ARRAY3D_DESCRIPTOR desc = {
        .Width = pAllocateArray->Width, .Height = pAllocateArray->Height,
        .Format = pAllocateArray->Format,
        .NumChannels = pAllocateArray->NumChannels };
    size_t size, i;
    CUresult rc = array_size(&desc, 1, &size);
    if (rc == CUDA_SUCCESS)
        rc = array_create(false, size, true, &i);
    if (rc == CUDA_SUCCESS)
        *pHandle = &g_arrays[i];
    return rc;
}
LOCAL(cuArrayCreate_v2)

/* Sparse and deferred-mapping arrays have no memory of their own. */
static bool backed(const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    return (desc->Flags &
            (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) == 0;
}

CUresult cuArray3DCreate_v2(CUarray *pHandle,
                            const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (pHandle == NULL || pAllocateArray == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    size_t size, i;
    CUresult rc = array_size(pAllocateArray, 1, &size);
    if (rc == CUDA_SUCCESS)
        rc = array_create(false, size, backed(pAllocateArray), &i);
    if (rc == CUDA_SUCCESS)
        *pHandle = &g_arrays[i];
    return rc;
}
LOCAL(cuArray3DCreate_v2)

CUresult cuMipmappedArrayCreate(
    CUmipmappedArray *pHandle,
    const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
    unsigned int numMipmapLevels)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (pHandle == NULL || pMipmappedArrayDesc == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    size_t size, i;
    CUresult rc = array_size(pMipmappedArrayDesc, numMipmapLevels, &size);
    if (rc == CUDA_SUCCESS)
        rc = array_create(true, size, backed(pMipmappedArrayDesc), &i);
    if (rc == CUDA_SUCCESS)
        *pHandle = &g_mipmaps[i];
    return rc;
}
LOCAL(cuMipmappedArrayCreate)

/*
 * a is NULL for a handle that is no array at all. Like cuMemFree_v2 this
 * needs a current context, of any device.
 */
static CUresult array_destroy(struct array_state *a)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUcontext ctx;
    CUresult rc = check_current(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_lock);
    if (a != NULL && a->live) {
        g_dev[a->owner->dev].used -= a->bytes;
        a->live = false;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuArrayDestroy(CUarray hArray)
{
    bool known =
        array_index(hArray, g_arrays, ARRAY_SLOTS, sizeof g_arrays[0]) >= 0;
    return array_destroy(known ? &hArray->a : NULL);
}
LOCAL(cuArrayDestroy)

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    bool known = array_index(hMipmappedArray, g_mipmaps, ARRAY_SLOTS,
                             sizeof g_mipmaps[0]) >= 0;
    return array_destroy(known ? &hMipmappedArray->a : NULL);
}
LOCAL(cuMipmappedArrayDestroy)

/*
 * The modelled size and 512-byte alignment, for every array. (The real
 * driver documents CUDA_ERROR_INVALID_VALUE for arrays created without
 * CUDA_ARRAY3D_DEFERRED_MAPPING; the stand-in answers for all of them.)
 */
static CUresult array_requirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req,
                                   const struct array_state *a, CUdevice dev)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(req != NULL, CUDA_ERROR_INVALID_VALUE);
    CHECK(valid_device(dev), CUDA_ERROR_INVALID_DEVICE);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (a != NULL && a->live) {
        memset(req, 0, sizeof *req);
        req->size = a->size;
        req->alignment = ARRAY_PITCH_ALIGN;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

CUresult cuArrayGetMemoryRequirements(
    CUDA_ARRAY_MEMORY_REQUIREMENTS *memoryRequirements, CUarray array,
    CUdevice device)
{
    bool known =
        array_index(array, g_arrays, ARRAY_SLOTS, sizeof g_arrays[0]) >= 0;
    return array_requirements(memoryRequirements, known ? &array->a : NULL,
                              device);
}
LOCAL(cuArrayGetMemoryRequirements)

CUresult cuMipmappedArrayGetMemoryRequirements(
    CUDA_ARRAY_MEMORY_REQUIREMENTS *memoryRequirements,
    CUmipmappedArray mipmap, CUdevice device)
{
    bool known = array_index(mipmap, g_mipmaps, ARRAY_SLOTS,
                             sizeof g_mipmaps[0]) >= 0;
    return array_requirements(memoryRequirements, known ? &mipmap->a : NULL,
                              device);
}
LOCAL(cuMipmappedArrayGetMemoryRequirements)

/* ---- Pinned host memory --------------------------------------------------- */

#define HOST_ALLOC_FLAGS                                  \
    ((unsigned int)(CU_MEMHOSTALLOC_PORTABLE |            \
                    CU_MEMHOSTALLOC_DEVICEMAP |           \
                    CU_MEMHOSTALLOC_WRITECOMBINED))

/* Whether g_host_allocs has room for one more entry (grown when full). */
static bool host_slot_locked(void)
{
    if (g_host_nallocs == g_host_allocs_cap) {
        struct host_alloc *grown = grow_array(g_host_allocs,
                                              &g_host_allocs_cap,
                                              sizeof *grown);
        if (grown != NULL)
            g_host_allocs = grown;
    }
    return g_host_nallocs < g_host_allocs_cap;
}

/*
 * The common part of cuMemHostAlloc and cuMemAllocHost_v2 (flags 0). A
 * current context is needed, as for the real driver; the memory belongs to
 * the process all the same (destroying the context leaves it). Up to
 * HOST_BACKED_MAX bytes it is real zeroed memory; a larger allocation gets
 * a fake, page-aligned address from the host window and no memory, so tests
 * can "allocate" GiBs. Size 0 or unknown flags give CUDA_ERROR_INVALID_VALUE.
 */
static CUresult host_alloc(void **pp, size_t bytesize, unsigned int flags)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (pp == NULL || bytesize == 0 || (flags & ~HOST_ALLOC_FLAGS) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx;
    CUresult rc = check_current(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    bool backed = bytesize <= HOST_BACKED_MAX;
    void *mem = NULL;
    if (backed && (mem = calloc(1, bytesize)) == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t span = backed ? 0
                  : bytesize <= HOST_WINDOW ? round_up(bytesize, HOST_ALIGN)
                                            : SIZE_MAX;

    rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    if (host_slot_locked() &&
        (backed || span <= HOST_BASE + HOST_WINDOW - g_host_next)) {
        uintptr_t addr = (uintptr_t)mem;
        if (!backed) {
            addr = g_host_next;
            g_host_next += span;
        }
        g_host_allocs[g_host_nallocs++] = (struct host_alloc){
            .addr = addr, .bytes = bytesize, .flags = flags,
            .backed = backed };
        g_host_bytes += bytesize;
        *pp = (void *)addr;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    if (rc != CUDA_SUCCESS)
        free(mem);
    return rc;
}

/* Flags: any of PORTABLE, DEVICEMAP and WRITECOMBINED (only stored). */
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    return host_alloc(pp, bytesize, Flags);
}
LOCAL(cuMemHostAlloc)

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return host_alloc(pp, bytesize, 0);
}
LOCAL(cuMemAllocHost_v2)

/*
 * With unified addressing the device address of pinned host memory is its
 * host address. p may point anywhere inside a live allocation made with
 * CU_MEMHOSTALLOC_DEVICEMAP (cuMemAllocHost_v2 memory is not: a stand-in
 * choice); anything else, or Flags other than 0, gives
 * CUDA_ERROR_INVALID_VALUE. A current context is needed.
 */
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p,
                                      unsigned int Flags)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (pdptr == NULL || Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx;
    CUresult rc = check_current(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    long i = host_index_locked((uintptr_t)p, true);
    if (i >= 0 && (g_host_allocs[i].flags & CU_MEMHOSTALLOC_DEVICEMAP) != 0) {
        *pdptr = (CUdeviceptr)(uintptr_t)p;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemHostGetDevicePointer_v2)

/*
 * p must be the start of a live pinned host allocation, else
 * CUDA_ERROR_INVALID_VALUE (NULL too: a guess). No current context is
 * needed: the memory belongs to the process.
 */
CUresult cuMemFreeHost(void *p)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    void *mem = NULL;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    long i = p != NULL ? host_index_locked((uintptr_t)p, false) : -1;
    if (i >= 0 && !g_host_allocs[i].registered) {
        if (g_host_allocs[i].backed)
            mem = p;
        g_host_bytes -= g_host_allocs[i].bytes;
        g_host_allocs[i] = g_host_allocs[--g_host_nallocs];
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    free(mem);
    return rc;
}
LOCAL(cuMemFreeHost)

/*
 * The program's own memory pinned: p and bytesize name at least a byte,
 * Flags any of PORTABLE and DEVICEMAP (its device address is then its
 * host address), and the range overlaps no pinned memory already, else
 * CUDA_ERROR_INVALID_VALUE (an overlap is CUDA_ERROR_HOST_MEMORY_ALREADY_
 * REGISTERED in the driver; one code is enough here). A current context is
 * needed. STANDIN_HOST_REGISTER_FAIL (read at each call) refuses it with
 * CUDA_ERROR_OUT_OF_MEMORY, as a locked-memory limit does. Its contents are
 * real: a copy from a VMM mapping writes the mapping's tag into its first
 * word, and a copy from it reads the tag there.
 */
CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (p == NULL || bytesize == 0 ||
        (Flags & ~(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx;
    CUresult rc = check_current(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (getenv("STANDIN_HOST_REGISTER_FAIL") != NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t a = (uintptr_t)p;
    rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    bool overlap = false;
    for (size_t i = 0; i < g_host_nallocs; i++) {
        const struct host_alloc *h = &g_host_allocs[i];
        if (a < h->addr + h->bytes && h->addr < a + bytesize)
            overlap = true;
    }
    if (!overlap && host_slot_locked()) {
        g_host_allocs[g_host_nallocs++] = (struct host_alloc){
            .addr = a, .bytes = bytesize,
            .flags = (Flags & CU_MEMHOSTREGISTER_DEVICEMAP) != 0
                         ? CU_MEMHOSTALLOC_DEVICEMAP : 0,
            .backed = false, .registered = true };
        atomic_fetch_add_explicit(&g_host_registers, 1, memory_order_relaxed);
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemHostRegister_v2)

/* p must be the start of memory cuMemHostRegister_v2 pinned, else
 * CUDA_ERROR_INVALID_VALUE (CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED in the
 * driver). */
CUresult cuMemHostUnregister(void *p)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    long i = p != NULL ? host_index_locked((uintptr_t)p, false) : -1;
    if (i >= 0 && g_host_allocs[i].registered) {
        g_host_allocs[i] = g_host_allocs[--g_host_nallocs];
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemHostUnregister)

/* The first word of registered memory holding p (copies' model of its
 * contents), or NULL. */
static uint32_t *registered_word_locked(CUdeviceptr p)
{
    long i = host_index_locked((uintptr_t)p, true);
    if (i < 0 || !g_host_allocs[i].registered || g_host_allocs[i].bytes < 4)
        return NULL;
    return (uint32_t *)g_host_allocs[i].addr;
}

/* ---- Managed memory advice ------------------------------------------------ */

/* Where the location argument of advice points. */
enum target_kind { TARGET_DEVICE, TARGET_HOST, TARGET_BAD };
struct advice_target {
    enum target_kind kind;
    CUdevice dev;         /* TARGET_DEVICE: the ordinal, not yet checked */
};

/*
 * The checks that do not depend on the range: a known advice value
 * (CUDA_ERROR_INVALID_VALUE), and for the advice that use the location a
 * valid one: the host, or a device (CUDA_ERROR_INVALID_DEVICE) that has
 * concurrent managed access for SET_PREFERRED_LOCATION and SET_ACCESSED_BY
 * (as documented; only STANDIN_CONCURRENT_MANAGED=0 takes it away); other
 * location types give CUDA_ERROR_INVALID_VALUE.
 */
static CUresult check_advice(CUmem_advise advice, struct advice_target t)
{
    switch (advice) {
    case CU_MEM_ADVISE_SET_READ_MOSTLY:
    case CU_MEM_ADVISE_UNSET_READ_MOSTLY:
    case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
        return CUDA_SUCCESS;
    case CU_MEM_ADVISE_SET_PREFERRED_LOCATION:
    case CU_MEM_ADVISE_SET_ACCESSED_BY:
    case CU_MEM_ADVISE_UNSET_ACCESSED_BY:
        if (t.kind == TARGET_BAD)
            return CUDA_ERROR_INVALID_VALUE;
        if (t.kind == TARGET_HOST)
            return CUDA_SUCCESS;
        if (!valid_device(t.dev) ||
            (advice != CU_MEM_ADVISE_UNSET_ACCESSED_BY &&
             g_cfg.concurrent_managed == 0))
            return CUDA_ERROR_INVALID_DEVICE;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

/* The accessed_by bit of a checked target. */
static unsigned int target_bit(struct advice_target t)
{
    return 1u << (t.kind == TARGET_HOST ? MAX_DEVICES : t.dev);
}

/*
 * Let managed block b of device dev count in host memory (to_host) or
 * against the device again. Moving back must fit the device
 * (CUDA_ERROR_OUT_OF_MEMORY otherwise: the stand-in never oversubscribes a
 * device). Caller holds g_lock.
 */
static CUresult move_managed_locked(int dev, struct block *b, bool to_host)
{
    struct device_state *d = &g_dev[dev];
    if (b->on_host == to_host)
        return CUDA_SUCCESS;
    if (to_host) {
        d->used -= b->bytes;
        d->managed_host += b->bytes;
    } else {
        if (!fits_locked(dev, b->bytes))
            return CUDA_ERROR_OUT_OF_MEMORY;
        d->managed_host -= b->bytes;
        charge_locked(dev, b->bytes);
    }
    b->on_host = to_host;
    return CUDA_SUCCESS;
}

/*
 * Both forms of cuMemAdvise. [devPtr, devPtr + count) must lie inside one
 * live managed allocation (else CUDA_ERROR_INVALID_VALUE); no context is
 * needed. The model is per allocation, not per page: advice on part of an
 * allocation applies to all of it. Its preferred location decides where
 * its bytes count: the host (managed_host, not the device's used and peak)
 * or, for any device and after UNSET_PREFERRED_LOCATION, its own device as
 * before. Accessed-by advice is only recorded; read-mostly changes nothing.
 */
static CUresult advise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                       struct advice_target t)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUresult rc = check_advice(advice, t);
    if (rc != CUDA_SUCCESS)
        return rc;
    int dev;
    size_t i;
    rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_lock);
    if (count != 0 && find_containing_locked(devPtr, &dev, &i)) {
        struct block *b = &g_dev[dev].blocks[i];
        CUdeviceptr off = devPtr - b->addr;
        if (b->managed && off < b->bytes && count <= b->bytes - off) {
            rc = CUDA_SUCCESS;
            switch (advice) {
            case CU_MEM_ADVISE_SET_PREFERRED_LOCATION:
                rc = move_managed_locked(dev, b, t.kind == TARGET_HOST);
                break;
            case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION:
                rc = move_managed_locked(dev, b, false);
                break;
            case CU_MEM_ADVISE_SET_ACCESSED_BY:
                b->accessed_by |= target_bit(t);
                break;
            case CU_MEM_ADVISE_UNSET_ACCESSED_BY:
                b->accessed_by &= ~target_bit(t);
                break;
            default: /* read-mostly */
                break;
            }
        }
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* CUDA 8.0 ABI: a device ordinal, CU_DEVICE_CPU for the host. */
CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                     CUdevice device)
{
    struct advice_target t = {
        device == CU_DEVICE_CPU ? TARGET_HOST : TARGET_DEVICE, device };
    return advise(devPtr, count, advice, t);
}
LOCAL(cuMemAdvise)

/*
 * CUDA 12.2 ABI: a location, passed by value. The three host types all mean
 * the host (the NUMA node is not looked at).
 */
CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                        CUmemLocation location)
{
    struct advice_target t = { TARGET_BAD, location.id };
    switch (location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        t.kind = TARGET_DEVICE;
        break;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        t.kind = TARGET_HOST;
        break;
    default:
        break;
    }
    return advise(devPtr, count, advice, t);
}
LOCAL(cuMemAdvise_v2)

/* ---- Kernels and copies --------------------------------------------------- */

/*
 * Kernels: cuModuleLoadData gives the one fake module; in it the function
 * "touchN" (N 1..8) has N parameters of 8 bytes and "gemm_touchN" the same
 * under a matrix product's name. A launch runs nothing: it checks that
 * every parameter word that falls in a cuMemAddressReserve'd range falls in
 * a mapping too (else it counts a fault and fails with
 * CUDA_ERROR_ILLEGAL_ADDRESS, as a kernel touching an unmapped address
 * would). Contents are modelled for VMM memory only, one 32-bit value per
 * physical allocation (its tag): cuMemsetD32_v2 of a whole mapping sets it,
 * cuMemcpyDtoDAsync_v2 between two mappings copies it, cuMemcpyDtoH_v2 from
 * a mapping writes it to every word. Other device memory reads as zeros.
 */
struct CUmod_st {
    int unused;
};
struct CUfunc_st {
    int params;
    bool product;
    char name[16];
};
static struct CUmod_st g_module;
static struct CUfunc_st g_funcs[2][8];

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(module != NULL && image != NULL, CUDA_ERROR_INVALID_VALUE);
    if (current_device() < 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    *module = &g_module;
    return CUDA_SUCCESS;
}
LOCAL(cuModuleLoadData)

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(hfunc != NULL && name != NULL && hmod == &g_module,
          CUDA_ERROR_INVALID_VALUE);
    bool product = strncmp(name, "gemm_", 5) == 0;
    const char *rest = product ? name + 5 : name;
    if (strncmp(rest, "touch", 5) != 0 || rest[5] < '1' || rest[5] > '8' ||
        rest[6] != '\0')
        return CUDA_ERROR_NOT_FOUND;
    int n = rest[5] - '0';
    struct CUfunc_st *f = &g_funcs[product][n - 1];
    f->params = n;
    f->product = product;
    snprintf(f->name, sizeof f->name, "%s", name);
    *hfunc = f;
    return CUDA_SUCCESS;
}
LOCAL(cuModuleGetFunction)

static struct CUfunc_st *func_of(CUfunction f)
{
    for (int p = 0; p < 2; p++)
        if (array_index(f, g_funcs[p], 8, sizeof g_funcs[p][0]) >= 0 &&
            ((struct CUfunc_st *)f)->params > 0)
            return f;
    return NULL;
}

CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex,
                            size_t *paramOffset, size_t *paramSize)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    struct CUfunc_st *f = func_of(func);
    CHECK(f != NULL, CUDA_ERROR_INVALID_HANDLE);
    CHECK(paramOffset != NULL && paramSize != NULL, CUDA_ERROR_INVALID_VALUE);
    if (paramIndex >= (size_t)f->params)
        return CUDA_ERROR_INVALID_VALUE;
    *paramOffset = paramIndex * 8;
    *paramSize = 8;
    return CUDA_SUCCESS;
}
LOCAL(cuFuncGetParamInfo)

CUresult cuFuncGetName(const char **name, CUfunction hfunc)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    struct CUfunc_st *f = func_of(hfunc);
    CHECK(f != NULL, CUDA_ERROR_INVALID_HANDLE);
    CHECK(name != NULL, CUDA_ERROR_INVALID_VALUE);
    *name = f->name;
    return CUDA_SUCCESS;
}
LOCAL(cuFuncGetName)

/* Whether p is reserved address space with nothing mapped there. */
static bool unmapped_locked(CUdeviceptr p)
{
    bool reserved = false;
    for (size_t i = 0; i < g_va_nranges; i++)
        reserved |= range_within(p, 1, g_va_ranges[i].va, g_va_ranges[i].size);
    return reserved && mapping_of_locked(p) == NULL;
}

/* A launch of fn with these words: a fault where one names reserved space
 * with nothing mapped there, counted either way. Caller holds g_lock. */
static CUresult run_kernel_locked(const struct CUfunc_st *fn,
                                  const CUdeviceptr *words)
{
    CUresult rc = CUDA_SUCCESS;
    for (int i = 0; i < fn->params; i++)
        if (unmapped_locked(words[i]))
            rc = CUDA_ERROR_ILLEGAL_ADDRESS;
    atomic_fetch_add_explicit(rc == CUDA_SUCCESS ? &g_launches : &g_faults, 1,
                              memory_order_relaxed);
    return rc;
}

/*
 * On a created stream that is capturing, the launch becomes a kernel node
 * of the graph being captured (its parameters copied), and nothing runs;
 * on one whose capture was invalidated it fails, as it does on a created
 * stream that is not live. Running out of memory for the node invalidates
 * the capture. (As elsewhere here, a legacy-stream launch does not
 * invalidate a capture of another stream.)
 */
static CUresult launch(CUfunction f, CUstream hStream, void **kernelParams,
                       void **extra, bool ptsz)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    struct CUfunc_st *fn = func_of(f);
    CHECK(fn != NULL, CUDA_ERROR_INVALID_HANDLE);
    CHECK(kernelParams != NULL && extra == NULL, CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr words[8] = { 0 };
    for (int i = 0; i < fn->params && i < 8; i++)
        memcpy(&words[i], kernelParams[i], sizeof words[i]);
    pthread_mutex_lock(&g_lock);
    struct CUstream_st *s = stream_kind(hStream, ptsz) == STREAM_CREATED
                                ? live_stream_locked(hStream)
                                : NULL;
    CUresult rc;
    if (s == NULL && stream_kind(hStream, ptsz) == STREAM_CREATED) {
        rc = CUDA_ERROR_INVALID_HANDLE;
    } else if (s != NULL && s->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
        rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    } else if (s != NULL && s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        CUgraphNode n = graph_add_node_locked(s->graph, CU_GRAPH_NODE_TYPE_KERNEL);
        rc = n != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
        if (n == NULL)
            s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
        if (n != NULL) {
            struct CUgraphNode_st k = { .func = fn, .nparams = fn->params };
            memcpy(k.words, words, sizeof words);
            node_copy_kernel(n, &k);
        }
    } else {
        rc = run_kernel_locked(fn, words);
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
/* The dimensions, shared bytes and stream of the last cuLaunchKernel(_ptsz)
 * call, whatever its result (vramcap_standin_last_launch). */
static _Atomic unsigned g_last_launch[7];
static _Atomic(CUstream) g_last_launch_stream;

static CUfunction note_launch(CUfunction f, unsigned gx, unsigned gy,
                              unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned shared, CUstream s)
{
    const unsigned v[7] = { gx, gy, gz, bx, by, bz, shared };
    for (int i = 0; i < 7; i++)
        atomic_store(&g_last_launch[i], v[i]);
    atomic_store(&g_last_launch_stream, s);
    return f;
}

WITH_PTSZ(cuLaunchKernel,
          (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
           unsigned int bx, unsigned int by, unsigned int bz,
           unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
           void **extra),
          launch, note_launch(f, gx, gy, gz, bx, by, bz, sharedMemBytes,
                              hStream), hStream, kernelParams, extra)

/*
 * Texture references: only the mipmap level clamp, kept once for every
 * reference (a non-null handle), so that a test can pass two floats by
 * value and read them back.
 */
static _Atomic float g_clamp[2];

CUresult cuTexRefSetMipmapLevelClamp(CUtexref hTexRef, float minClamp,
                                     float maxClamp)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(hTexRef != NULL, CUDA_ERROR_INVALID_VALUE);
    atomic_store(&g_clamp[0], minClamp);
    atomic_store(&g_clamp[1], maxClamp);
    return CUDA_SUCCESS;
}

CUresult cuTexRefGetMipmapLevelClamp(float *pminClamp, float *pmaxClamp,
                                     CUtexref hTexRef)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(hTexRef != NULL && pminClamp != NULL && pmaxClamp != NULL,
          CUDA_ERROR_INVALID_VALUE);
    *pminClamp = atomic_load(&g_clamp[0]);
    *pmaxClamp = atomic_load(&g_clamp[1]);
    return CUDA_SUCCESS;
}

/* A copy or memset names an address: unmapped reserved space faults. */
static CUresult touch_locked(CUdeviceptr p)
{
    if (unmapped_locked(p)) {
        atomic_fetch_add_explicit(&g_faults, 1, memory_order_relaxed);
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    return CUDA_SUCCESS;
}

static CUresult copy_dtod(CUdeviceptr dst, CUdeviceptr src, size_t n,
                          CUstream hStream, bool ptsz)
{
    (void)hStream; (void)ptsz; (void)n;
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    pthread_mutex_lock(&g_lock);
    CUresult rc = touch_locked(dst);
    if (rc == CUDA_SUCCESS)
        rc = touch_locked(src);
    const struct vmm_map *d = mapping_of_locked(dst), *s = mapping_of_locked(src);
    uint32_t *hd = registered_word_locked(dst), *hs = registered_word_locked(src);
    uint32_t tag = s != NULL ? vmm_alloc_of_locked(s->handle)->tag
                   : hs != NULL ? *hs : 0;
    if (rc == CUDA_SUCCESS && d != NULL)
        vmm_alloc_of_locked(d->handle)->tag = tag;
    if (rc == CUDA_SUCCESS && hd != NULL)
        *hd = tag;
    pthread_mutex_unlock(&g_lock);
    return rc;
}
WITH_PTSZ(cuMemcpyDtoDAsync_v2,
          (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hStream),
          copy_dtod, dst, src, n, hStream)

/* Each copy of a batch as cuMemcpyDtoDAsync_v2 does it; the first that
 * fails stops the batch (its index in *failIdx, where there is one). */
static CUresult copy_batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                           size_t count, size_t *failIdx, CUstream hStream,
                           bool ptsz)
{
    CHECK(count == 0 || (dsts != NULL && srcs != NULL && sizes != NULL),
          CUDA_ERROR_INVALID_VALUE);
    for (size_t i = 0; i < count; i++) {
        CUresult rc = copy_dtod(dsts[i], srcs[i], sizes[i], hStream, ptsz);
        if (rc != CUDA_SUCCESS) {
            if (failIdx != NULL)
                *failIdx = i;
            return rc;
        }
    }
    return CUDA_SUCCESS;
}

static CUresult copy_batch_12(CUdeviceptr *dsts, CUdeviceptr *srcs,
                              size_t *sizes, size_t count, size_t *failIdx,
                              CUstream hStream, bool ptsz)
{
    return copy_batch(dsts, srcs, sizes, count, failIdx, hStream, ptsz);
}
WITH_PTSZ(cuMemcpyBatchAsync,
          (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
           void *attrs, size_t *attrsIdxs, size_t numAttrs, size_t *failIdx,
           CUstream hStream),
          copy_batch_12, ((void)attrs, (void)attrsIdxs, (void)numAttrs, dsts),
          srcs, sizes, count, failIdx, hStream)

static CUresult copy_batch_13(CUdeviceptr *dsts, CUdeviceptr *srcs,
                              size_t *sizes, size_t count, CUstream hStream,
                              bool ptsz)
{
    return copy_batch(dsts, srcs, sizes, count, NULL, hStream, ptsz);
}
WITH_PTSZ(cuMemcpyBatchAsync_v2,
          (CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
           void *attrs, size_t *attrsIdxs, size_t numAttrs, CUstream hStream),
          copy_batch_13, ((void)attrs, (void)attrsIdxs, (void)numAttrs, dsts),
          srcs, sizes, count, hStream)

/*
 * Copies between an array and device memory. Arrays hold no modelled
 * contents, so nothing is copied; the device side is touched as the other
 * copies touch it (unmapped reserved space faults), and the array must be
 * a live one.
 */
static CUresult copy_array(CUarray a, CUdeviceptr d, bool ptds)
{
    (void)ptds;
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(array_index(a, g_arrays, ARRAY_SLOTS, sizeof g_arrays[0]) >= 0,
          CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&g_lock);
    CUresult rc = a->a.live ? touch_locked(d) : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

/* NAME and its per-thread default stream twin NAME_ptds, as WITH_PTSZ. */
#define WITH_PTDS(name, params, impl, ...)                                    \
    CUresult name params { return impl(__VA_ARGS__, false); }                 \
    LOCAL(name)                                                               \
    CUresult name##_ptds params { return impl(__VA_ARGS__, true); }           \
    LOCAL(name##_ptds)

WITH_PTDS(cuMemcpyAtoD_v2,
          (CUdeviceptr dstDevice, CUarray srcArray, size_t srcOffset,
           size_t ByteCount),
          copy_array, ((void)srcOffset, (void)ByteCount, srcArray), dstDevice)
WITH_PTDS(cuMemcpyDtoA_v2,
          (CUarray dstArray, size_t dstOffset, CUdeviceptr srcDevice,
           size_t ByteCount),
          copy_array, ((void)dstOffset, (void)ByteCount, dstArray), srcDevice)

/*
 * The launches of parameters set with cuParamSet* (not modelled): a launch
 * of a known function that touches nothing, counted as launches are.
 */
static CUresult launch_grid(CUfunction f)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(func_of(f) != NULL, CUDA_ERROR_INVALID_HANDLE);
    atomic_fetch_add_explicit(&g_launches, 1, memory_order_relaxed);
    return CUDA_SUCCESS;
}

CUresult cuLaunch(CUfunction f)
{
    return launch_grid(f);
}
LOCAL(cuLaunch)
CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height)
{
    (void)grid_width; (void)grid_height;
    return launch_grid(f);
}
LOCAL(cuLaunchGrid)
CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height,
                           CUstream hStream)
{
    (void)grid_width; (void)grid_height; (void)hStream;
    return launch_grid(f);
}
LOCAL(cuLaunchGridAsync)

CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    pthread_mutex_lock(&g_lock);
    CUresult rc = touch_locked(dstDevice);
    const struct vmm_map *m = mapping_of_locked(dstDevice);
    if (rc == CUDA_SUCCESS && m != NULL) {
        if (m->va == dstDevice && N * 4 == m->size)
            vmm_alloc_of_locked(m->handle)->tag = ui;
        else
            rc = CUDA_ERROR_NOT_SUPPORTED; /* only whole mappings are modelled */
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuMemsetD32_v2)

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CHECK(dstHost != NULL, CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&g_lock);
    CUresult rc = touch_locked(srcDevice);
    const struct vmm_map *m = mapping_of_locked(srcDevice);
    uint32_t tag = m != NULL ? vmm_alloc_of_locked(m->handle)->tag : 0;
    pthread_mutex_unlock(&g_lock);
    if (rc == CUDA_SUCCESS)
        for (size_t i = 0; i < ByteCount; i++)
            ((unsigned char *)dstHost)[i] = (unsigned char)(tag >> (8 * (i % 4)));
    return rc;
}
LOCAL(cuMemcpyDtoH_v2)

/* ---- Events --------------------------------------------------------------- */

/* The live event h, or NULL. Caller holds g_lock. */
static struct CUevent_st *live_event_locked(CUevent h)
{
    if (array_index(h, g_events, EVENT_SLOTS, sizeof g_events[0]) < 0 ||
        h->ctx == NULL)
        return NULL;
    return h;
}

static bool event_slot_free(size_t i, const void *arg)
{
    (void)arg;
    return g_events[i].ctx == NULL;
}

/*
 * An event of the current context. Flags: any of BLOCKING_SYNC,
 * DISABLE_TIMING and INTERPROCESS, which needs DISABLE_TIMING (as
 * documented); they are only stored. Too many live events give
 * CUDA_ERROR_OUT_OF_MEMORY.
 */
CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    const unsigned int known = CU_EVENT_BLOCKING_SYNC |
                               CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    if (phEvent == NULL || (Flags & ~known) != 0 ||
        ((Flags & CU_EVENT_INTERPROCESS) != 0 &&
         (Flags & CU_EVENT_DISABLE_TIMING) == 0))
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx;
    CUresult rc = check_current(&ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&g_lock);
    long i = take_slot_locked(&g_events_next, EVENT_SLOTS, event_slot_free,
                              NULL);
    if (i >= 0) {
        g_events[i] = (struct CUevent_st){ .ctx = ctx, .flags = Flags };
        *phEvent = &g_events[i];
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuEventCreate)

/*
 * The stream is checked like by the stream-ordered calls (the default
 * streams need a current context, other handles must be live streams; on an
 * invalidated capture CUDA_ERROR_STREAM_CAPTURE_INVALIDATED). Nothing runs
 * on the stream, so the event is complete at once. Each successful record
 * is counted.
 */
static CUresult event_record(CUevent hEvent, CUstream hStream, bool ptsz)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUcontext ctx;
    CUresult rc = stream_current(hStream, ptsz, &ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    pthread_mutex_lock(&g_lock);
    if (live_event_locked(hEvent) == NULL)
        rc = CUDA_ERROR_INVALID_HANDLE;
    else
        rc = stream_target_locked(hStream, ptsz, &ctx, &capture);
    if (rc == CUDA_SUCCESS && capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
        rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    pthread_mutex_unlock(&g_lock);
    if (rc == CUDA_SUCCESS)
        atomic_fetch_add_explicit(&g_event_records, 1, memory_order_relaxed);
    return rc;
}

WITH_PTSZ(cuEventRecord, (CUevent hEvent, CUstream hStream),
          event_record, hEvent, hStream)

/*
 * Nothing is ever pending: a live event is complete whether it was recorded
 * or not. Other handles give CUDA_ERROR_INVALID_HANDLE. No context needed.
 */
static CUresult event_complete(CUevent hEvent)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    pthread_mutex_lock(&g_lock);
    bool live = live_event_locked(hEvent) != NULL;
    pthread_mutex_unlock(&g_lock);
    return live ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult cuEventQuery(CUevent hEvent)
{
    return event_complete(hEvent);
}
LOCAL(cuEventQuery)

/* Also a synchronisation point: the event's device's pools trim. */
CUresult cuEventSynchronize(CUevent hEvent)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    pthread_mutex_lock(&g_lock);
    struct CUevent_st *e = live_event_locked(hEvent);
    if (e != NULL)
        sync_pools_locked(e->ctx->dev);
    pthread_mutex_unlock(&g_lock);
    return e != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
LOCAL(cuEventSynchronize)

CUresult cuEventDestroy_v2(CUevent hEvent)
{
    CHECK(initialized(), CUDA_ERROR_NOT_INITIALIZED);
    CUresult rc = CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_lock);
    struct CUevent_st *e = live_event_locked(hEvent);
    if (e != NULL) {
        *e = (struct CUevent_st){ 0 };
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}
LOCAL(cuEventDestroy_v2)

/* ---- Error strings -------------------------------------------------------- */

/*
 * These are pure table lookups and, as with the real driver, do not require
 * cuInit. Unknown codes give CUDA_ERROR_INVALID_VALUE and *pStr = NULL.
 */
static const struct {
    CUresult code;
    const char *name;
    const char *text;
} g_errors[] = {
    { CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
    { CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
    { CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
    { CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED",
      "initialization error" },
    { CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED",
      "driver shutting down" },
    { CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE",
      "no CUDA-capable device is detected" },
    { CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE",
      "invalid device ordinal" },
    { CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT",
      "invalid device context" },
    { CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE",
      "invalid resource handle" },
    { CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
      "the operation cannot be performed in the present state" },
    { CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
    { CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED",
      "context is destroyed" },
    { CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED",
      "operation not supported" },
    { CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
      "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
      "operation not permitted when stream is capturing" },
    { CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
      "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
      "operation failed due to a previous error during capture" },
    { CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
      "operation would make the legacy stream depend on a capturing blocking "
      "stream" },
    { CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
      "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
      "the graph update was not performed because it included changes which "
      "violated constraints specific to instantiated graph update" },
    { CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

static CUresult error_lookup(CUresult error, const char **pStr, bool name)
{
    if (pStr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++) {
        if (g_errors[i].code == error) {
            *pStr = name ? g_errors[i].name : g_errors[i].text;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    return error_lookup(error, pStr, false);
}
LOCAL(cuGetErrorString)

CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    return error_lookup(error, pStr, true);
}
LOCAL(cuGetErrorName)

/* ---- Export tables (cuGetExportTable) ------------------------------------- */

/*
 * Three private tables laid out as the real driver's are (word 0 the
 * table's size in bytes, then functions; or headerless, functions up to a
 * null word; docs/design/parking-resume.md), kept in read-only memory
 * after relocation, as the driver's are:
 *   STANDIN    "vramcap standin\0": size 24, dark_mix, dark_calls
 *   C693336E-1121-DF11-A8C3-68F355D89593 (context-local storage's GUID):
 *              headerless: dark_mix, dark_calls, NULL
 *   D4082055-BDE6-704B-8D34-BA123C66E1F2 (the integrity check's GUID):
 *              size 24, dark_integrity twice
 * Their functions are driver calls: they wait while the process is locked
 * (the checkpoint model), as every entry point does. Any other GUID gives
 * CUDA_ERROR_INVALID_VALUE, as do NULL arguments.
 */
static atomic_ulong g_dark_calls;

/* *out = a * 1000 + b * 10 + c: every kind of argument register arrives. */
static CUresult dark_mix(int a, double b, long long c, long long *out)
{
    if (!initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    atomic_fetch_add_explicit(&g_dark_calls, 1, memory_order_relaxed);
    *out = a * 1000LL + (long long)(b * 10) + c;
    return CUDA_SUCCESS;
}

/* Returns nothing, as some real slots do: the calls of dark_mix so far. */
static void dark_calls(unsigned long *out)
{
    (void)checkpoint_gate();
    *out = atomic_load_explicit(&g_dark_calls, memory_order_relaxed);
}

static CUresult dark_integrity(void)
{
    return CUDA_SUCCESS;
}

static const void *const g_dark_standin[] = {
    (const void *)(3 * sizeof(void *)), (const void *)dark_mix,
    (const void *)dark_calls
};
static const void *const g_dark_cls[] = { (const void *)dark_mix,
                                          (const void *)dark_calls, NULL };
static const void *const g_dark_integrity[] = {
    (const void *)(3 * sizeof(void *)), (const void *)dark_integrity,
    (const void *)dark_integrity
};

static const struct {
    unsigned char guid[16];
    const void *const *table;
} g_dark[] = {
    { "vramcap standin", g_dark_standin },
    { { 0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68,
        0xf3, 0x55, 0xd8, 0x95, 0x93 },
      g_dark_cls },
    { { 0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba,
        0x12, 0x3c, 0x66, 0xe1, 0xf2 },
      g_dark_integrity },
};

CUresult cuGetExportTable(const void **ppExportTable,
                          const CUuuid *pExportTableId)
{
    CHECK(ppExportTable != NULL && pExportTableId != NULL,
          CUDA_ERROR_INVALID_VALUE);
    for (size_t i = 0; i < sizeof g_dark / sizeof g_dark[0]; i++)
        if (memcmp(g_dark[i].guid, pExportTableId->bytes, 16) == 0) {
            *ppExportTable = (const void *)g_dark[i].table;
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_VALUE;
}
LOCAL(cuGetExportTable)

/* ---- Entry point lookup (cuGetProcAddress) -------------------------------- */

/*
 * Alias functions: internal forwarders with the same signature as an exported
 * entry point but a distinct address, handed out by cuGetProcAddress when
 * STANDIN_PROCADDR_ALIASES=1. Each counts its calls, so its body differs from
 * the exported function's and the two can not be merged.
 */
#define ALIAS(name, params, args)                                           \
    static CUresult alias_##name params                                     \
    {                                                                       \
        atomic_fetch_add_explicit(&g_alias_calls, 1, memory_order_relaxed); \
        return local_##name args;                                           \
    }                                                                       \
    _Static_assert(__builtin_types_compatible_p(__typeof__(&alias_##name),  \
                                                __typeof__(&name)),         \
                   "alias_" #name " must have the signature of " #name);

ALIAS(cuInit, (unsigned int flags), (flags))
ALIAS(cuDriverGetVersion, (int *v), (v))
ALIAS(cuDeviceGet, (CUdevice *d, int o), (d, o))
ALIAS(cuDeviceGetCount, (int *c), (c))
ALIAS(cuDeviceGetName, (char *n, int l, CUdevice d), (n, l, d))
ALIAS(cuDeviceGetUuid, (CUuuid *u, CUdevice d), (u, d))
ALIAS(cuDeviceGetUuid_v2, (CUuuid *u, CUdevice d), (u, d))
ALIAS(cuDeviceTotalMem_v2, (size_t *b, CUdevice d), (b, d))
ALIAS(cuDeviceGetAttribute, (int *p, CUdevice_attribute a, CUdevice d),
      (p, a, d))
ALIAS(cuDevicePrimaryCtxRetain, (CUcontext *c, CUdevice d), (c, d))
ALIAS(cuDevicePrimaryCtxRelease_v2, (CUdevice d), (d))
ALIAS(cuDevicePrimaryCtxGetState, (CUdevice d, unsigned int *f, int *a),
      (d, f, a))
ALIAS(cuDevicePrimaryCtxReset_v2, (CUdevice d), (d))
ALIAS(cuCtxCreate_v4,
      (CUcontext *c, CUctxCreateParams *p, unsigned int f, CUdevice d),
      (c, p, f, d))
ALIAS(cuCtxDestroy_v2, (CUcontext c), (c))
ALIAS(cuCtxPushCurrent_v2, (CUcontext c), (c))
ALIAS(cuCtxPopCurrent_v2, (CUcontext *c), (c))
ALIAS(cuCtxSetCurrent, (CUcontext c), (c))
ALIAS(cuCtxGetCurrent, (CUcontext *c), (c))
ALIAS(cuCtxGetDevice, (CUdevice *d), (d))
ALIAS(cuCtxSynchronize, (void), ())
ALIAS(cuStreamCreate, (CUstream *s, unsigned int f), (s, f))
ALIAS(cuStreamCreateWithPriority, (CUstream *s, unsigned int f, int p), (s, f, p))
ALIAS(cuStreamDestroy_v2, (CUstream s), (s))
ALIAS(cuStreamBeginCapture, (CUstream s), (s))
ALIAS(cuStreamBeginCapture_ptsz, (CUstream s), (s))
ALIAS(cuStreamBeginCapture_v2, (CUstream s, CUstreamCaptureMode m), (s, m))
ALIAS(cuStreamBeginCapture_v2_ptsz, (CUstream s, CUstreamCaptureMode m),
      (s, m))
ALIAS(cuStreamEndCapture, (CUstream s, CUgraph *g), (s, g))
ALIAS(cuStreamEndCapture_ptsz, (CUstream s, CUgraph *g), (s, g))
ALIAS(cuStreamIsCapturing, (CUstream s, CUstreamCaptureStatus *c), (s, c))
ALIAS(cuStreamIsCapturing_ptsz, (CUstream s, CUstreamCaptureStatus *c),
      (s, c))
ALIAS(cuMemAlloc, (CUdeviceptr_v1 *p, unsigned int n), (p, n))
ALIAS(cuMemAlloc_v2, (CUdeviceptr *p, size_t n), (p, n))
ALIAS(cuMemAllocPitch_v2,
      (CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int e),
      (p, pitch, w, h, e))
ALIAS(cuMemAllocManaged, (CUdeviceptr *p, size_t n, unsigned int f), (p, n, f))
ALIAS(cuMemFree_v2, (CUdeviceptr p), (p))
ALIAS(cuMemGetInfo_v2, (size_t *f, size_t *t), (f, t))
ALIAS(cuIpcGetMemHandle, (CUipcMemHandle *h, CUdeviceptr p), (h, p))
ALIAS(cuMemsetD8Async,
      (CUdeviceptr p, unsigned char c, size_t n, CUstream s), (p, c, n, s))
ALIAS(cuMemsetD8Async_ptsz,
      (CUdeviceptr p, unsigned char c, size_t n, CUstream s), (p, c, n, s))
#define LAUNCH_PARAMS (CUfunction f, unsigned int gx, unsigned int gy,       \
                       unsigned int gz, unsigned int bx, unsigned int by,     \
                       unsigned int bz, unsigned int sh, CUstream s,          \
                       void **kp, void **ex)
#define LAUNCH_ARGS (f, gx, gy, gz, bx, by, bz, sh, s, kp, ex)
ALIAS(cuLaunchKernel, LAUNCH_PARAMS, LAUNCH_ARGS)
ALIAS(cuLaunchKernel_ptsz, LAUNCH_PARAMS, LAUNCH_ARGS)
ALIAS(cuMemcpyDtoDAsync_v2,
      (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st), (d, s, n, st))
ALIAS(cuMemcpyDtoDAsync_v2_ptsz,
      (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st), (d, s, n, st))
#define BATCH12_PARAMS (CUdeviceptr *d, CUdeviceptr *s, size_t *z, size_t c, \
                        void *a, size_t *ai, size_t na, size_t *fi,         \
                        CUstream st)
#define BATCH13_PARAMS (CUdeviceptr *d, CUdeviceptr *s, size_t *z, size_t c, \
                        void *a, size_t *ai, size_t na, CUstream st)
ALIAS(cuMemcpyBatchAsync, BATCH12_PARAMS, (d, s, z, c, a, ai, na, fi, st))
ALIAS(cuMemcpyBatchAsync_ptsz, BATCH12_PARAMS, (d, s, z, c, a, ai, na, fi, st))
ALIAS(cuMemcpyBatchAsync_v2, BATCH13_PARAMS, (d, s, z, c, a, ai, na, st))
ALIAS(cuMemcpyBatchAsync_v2_ptsz, BATCH13_PARAMS, (d, s, z, c, a, ai, na, st))
ALIAS(cuMemcpyAtoD_v2, (CUdeviceptr d, CUarray a, size_t o, size_t n),
      (d, a, o, n))
ALIAS(cuMemcpyAtoD_v2_ptds, (CUdeviceptr d, CUarray a, size_t o, size_t n),
      (d, a, o, n))
ALIAS(cuMemcpyDtoA_v2, (CUarray a, size_t o, CUdeviceptr d, size_t n),
      (a, o, d, n))
ALIAS(cuMemcpyDtoA_v2_ptds, (CUarray a, size_t o, CUdeviceptr d, size_t n),
      (a, o, d, n))
ALIAS(cuLaunch, (CUfunction f), (f))
ALIAS(cuLaunchGrid, (CUfunction f, int w, int h), (f, w, h))
ALIAS(cuLaunchGridAsync, (CUfunction f, int w, int h, CUstream s),
      (f, w, h, s))
ALIAS(cuMemsetD32_v2, (CUdeviceptr d, unsigned int v, size_t n), (d, v, n))
ALIAS(cuMemcpyDtoH_v2, (void *h, CUdeviceptr s, size_t n), (h, s, n))
ALIAS(cuFuncGetParamInfo, (CUfunction f, size_t i, size_t *o, size_t *z),
      (f, i, o, z))
ALIAS(cuFuncGetName, (const char **n, CUfunction f), (n, f))
ALIAS(cuModuleLoadData, (CUmodule *m, const void *i), (m, i))
ALIAS(cuModuleGetFunction, (CUfunction *f, CUmodule m, const char *n),
      (f, m, n))
ALIAS(cuMemAllocAsync, (CUdeviceptr *p, size_t n, CUstream s), (p, n, s))
ALIAS(cuMemAllocAsync_ptsz, (CUdeviceptr *p, size_t n, CUstream s), (p, n, s))
ALIAS(cuMemAllocFromPoolAsync,
      (CUdeviceptr *p, size_t n, CUmemoryPool m, CUstream s), (p, n, m, s))
ALIAS(cuMemAllocFromPoolAsync_ptsz,
      (CUdeviceptr *p, size_t n, CUmemoryPool m, CUstream s), (p, n, m, s))
ALIAS(cuMemFreeAsync, (CUdeviceptr p, CUstream s), (p, s))
ALIAS(cuMemFreeAsync_ptsz, (CUdeviceptr p, CUstream s), (p, s))
ALIAS(cuMemPoolCreate, (CUmemoryPool *m, const CUmemPoolProps *p), (m, p))
ALIAS(cuMemPoolDestroy, (CUmemoryPool m), (m))
ALIAS(cuMemPoolTrimTo, (CUmemoryPool m, size_t n), (m, n))
ALIAS(cuMemPoolSetAttribute, (CUmemoryPool m, CUmemPool_attribute a, void *v),
      (m, a, v))
ALIAS(cuMemPoolGetAttribute, (CUmemoryPool m, CUmemPool_attribute a, void *v),
      (m, a, v))
ALIAS(cuDeviceGetDefaultMemPool, (CUmemoryPool *m, CUdevice d), (m, d))
ALIAS(cuDeviceGetMemPool, (CUmemoryPool *m, CUdevice d), (m, d))
ALIAS(cuStreamGetDevice, (CUstream s, CUdevice *d), (s, d))
ALIAS(cuStreamGetDevice_ptsz, (CUstream s, CUdevice *d), (s, d))
ALIAS(cuMemCreate,
      (CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *p,
       unsigned long long f),
      (h, n, p, f))
ALIAS(cuMemRelease, (CUmemGenericAllocationHandle h), (h))
ALIAS(cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle *h, void *a),
      (h, a))
ALIAS(cuMemAddressReserve,
      (CUdeviceptr *p, size_t n, size_t a, CUdeviceptr h, unsigned long long f),
      (p, n, a, h, f))
ALIAS(cuMemAddressFree, (CUdeviceptr p, size_t n), (p, n))
ALIAS(cuMemMap,
      (CUdeviceptr p, size_t n, size_t o, CUmemGenericAllocationHandle h,
       unsigned long long f),
      (p, n, o, h, f))
ALIAS(cuMemUnmap, (CUdeviceptr p, size_t n), (p, n))
ALIAS(cuMemSetAccess,
      (CUdeviceptr p, size_t n, const CUmemAccessDesc *d, size_t c),
      (p, n, d, c))
ALIAS(cuMemGetAccess,
      (unsigned long long *f, const CUmemLocation *l, CUdeviceptr p),
      (f, l, p))
ALIAS(cuCtxEnablePeerAccess, (CUcontext p, unsigned int f), (p, f))
ALIAS(cuPointerGetAttribute,
      (void *d, CUpointer_attribute a, CUdeviceptr p), (d, a, p))
ALIAS(cuMemGetAddressRange_v2, (CUdeviceptr *b, size_t *n, CUdeviceptr p),
      (b, n, p))
ALIAS(cuMemGetAllocationGranularity,
      (size_t *g, const CUmemAllocationProp *p,
       CUmemAllocationGranularity_flags o),
      (g, p, o))
ALIAS(cuMemExportToShareableHandle,
      (void *s, CUmemGenericAllocationHandle h, CUmemAllocationHandleType t,
       unsigned long long f),
      (s, h, t, f))
ALIAS(cuMemImportFromShareableHandle,
      (CUmemGenericAllocationHandle *h, void *o, CUmemAllocationHandleType t),
      (h, o, t))
ALIAS(cuArrayCreate_v2, (CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d), (a, d))
ALIAS(cuArray3DCreate_v2, (CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d),
      (a, d))
ALIAS(cuArrayDestroy, (CUarray a), (a))
ALIAS(cuMipmappedArrayCreate,
      (CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int l),
      (a, d, l))
ALIAS(cuMipmappedArrayDestroy, (CUmipmappedArray a), (a))
ALIAS(cuArrayGetMemoryRequirements,
      (CUDA_ARRAY_MEMORY_REQUIREMENTS *r, CUarray a, CUdevice d), (r, a, d))
ALIAS(cuMipmappedArrayGetMemoryRequirements,
      (CUDA_ARRAY_MEMORY_REQUIREMENTS *r, CUmipmappedArray a, CUdevice d),
      (r, a, d))
ALIAS(cuMemHostAlloc, (void **p, size_t n, unsigned int f), (p, n, f))
ALIAS(cuMemAllocHost_v2, (void **p, size_t n), (p, n))
ALIAS(cuMemHostGetDevicePointer_v2, (CUdeviceptr *d, void *p, unsigned int f),
      (d, p, f))
ALIAS(cuMemFreeHost, (void *p), (p))
ALIAS(cuMemHostRegister_v2, (void *p, size_t n, unsigned int f), (p, n, f))
ALIAS(cuMemHostUnregister, (void *p), (p))
ALIAS(cuMemAdvise, (CUdeviceptr p, size_t n, CUmem_advise a, CUdevice d),
      (p, n, a, d))
ALIAS(cuMemAdvise_v2,
      (CUdeviceptr p, size_t n, CUmem_advise a, CUmemLocation l), (p, n, a, l))
ALIAS(cuEventCreate, (CUevent *e, unsigned int f), (e, f))
ALIAS(cuEventRecord, (CUevent e, CUstream s), (e, s))
ALIAS(cuEventRecord_ptsz, (CUevent e, CUstream s), (e, s))
ALIAS(cuEventQuery, (CUevent e), (e))
ALIAS(cuEventSynchronize, (CUevent e), (e))
ALIAS(cuEventDestroy_v2, (CUevent e), (e))
ALIAS(cuDeviceSetMemPool, (CUdevice d, CUmemoryPool m), (d, m))
ALIAS(cuStreamSynchronize, (CUstream s), (s))
ALIAS(cuStreamSynchronize_ptsz, (CUstream s), (s))
ALIAS(cuStreamQuery, (CUstream s), (s))
ALIAS(cuStreamQuery_ptsz, (CUstream s), (s))
ALIAS(cuGraphCreate, (CUgraph *g, unsigned int f), (g, f))
ALIAS(cuGraphDestroy, (CUgraph g), (g))
ALIAS(cuGraphAddMemAllocNode,
      (CUgraphNode *n, CUgraph g, const CUgraphNode *d, size_t nd,
       CUDA_MEM_ALLOC_NODE_PARAMS *p),
      (n, g, d, nd, p))
ALIAS(cuGraphAddMemFreeNode,
      (CUgraphNode *n, CUgraph g, const CUgraphNode *d, size_t nd,
       CUdeviceptr p),
      (n, g, d, nd, p))
ALIAS(cuGraphMemAllocNodeGetParams,
      (CUgraphNode n, CUDA_MEM_ALLOC_NODE_PARAMS *p), (n, p))
ALIAS(cuGraphMemFreeNodeGetParams, (CUgraphNode n, CUdeviceptr *p), (n, p))
ALIAS(cuGraphAddChildGraphNode,
      (CUgraphNode *n, CUgraph g, const CUgraphNode *d, size_t nd, CUgraph c),
      (n, g, d, nd, c))
ALIAS(cuGraphChildGraphNodeGetGraph, (CUgraphNode n, CUgraph *g), (n, g))
ALIAS(cuGraphGetNodes, (CUgraph g, CUgraphNode *n, size_t *c), (g, n, c))
ALIAS(cuGraphNodeGetType, (CUgraphNode n, CUgraphNodeType *t), (n, t))
ALIAS(cuGraphKernelNodeGetParams,
      (CUgraphNode n, CUDA_KERNEL_NODE_PARAMS *p), (n, p))
ALIAS(cuGraphKernelNodeGetParams_v2,
      (CUgraphNode n, CUDA_KERNEL_NODE_PARAMS *p), (n, p))
ALIAS(cuGraphInstantiate,
      (CUgraphExec *e, CUgraph g, CUgraphNode *n, char *l, size_t b),
      (e, g, n, l, b))
ALIAS(cuGraphInstantiate_v2,
      (CUgraphExec *e, CUgraph g, CUgraphNode *n, char *l, size_t b),
      (e, g, n, l, b))
ALIAS(cuGraphInstantiateWithFlags,
      (CUgraphExec *e, CUgraph g, unsigned long long f), (e, g, f))
ALIAS(cuGraphInstantiateWithParams,
      (CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p), (e, g, p))
ALIAS(cuGraphInstantiateWithParams_ptsz,
      (CUgraphExec *e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p), (e, g, p))
ALIAS(cuGraphExecDestroy, (CUgraphExec e), (e))
ALIAS(cuGraphExecUpdate_v2,
      (CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *i), (e, g, i))
ALIAS(cuGraphExecKernelNodeSetParams,
      (CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p),
      (e, n, p))
ALIAS(cuGraphExecKernelNodeSetParams_v2,
      (CUgraphExec e, CUgraphNode n, const CUDA_KERNEL_NODE_PARAMS *p),
      (e, n, p))
ALIAS(cuGraphLaunch, (CUgraphExec e, CUstream s), (e, s))
ALIAS(cuGraphLaunch_ptsz, (CUgraphExec e, CUstream s), (e, s))
ALIAS(cuGraphUpload, (CUgraphExec e, CUstream s), (e, s))
ALIAS(cuGraphUpload_ptsz, (CUgraphExec e, CUstream s), (e, s))
ALIAS(cuDeviceGetGraphMemAttribute,
      (CUdevice d, CUgraphMem_attribute a, void *v), (d, a, v))
ALIAS(cuDeviceSetGraphMemAttribute,
      (CUdevice d, CUgraphMem_attribute a, void *v), (d, a, v))
ALIAS(cuDeviceGraphMemTrim, (CUdevice d), (d))
ALIAS(cuGetErrorString, (CUresult e, const char **s), (e, s))
ALIAS(cuGetErrorName, (CUresult e, const char **s), (e, s))
ALIAS(cuGetExportTable, (const void **t, const CUuuid *id), (t, id))
/* The two resolvers are defined below; their aliases come after them. */
static CUresult alias_cuGetProcAddress(const char *, void **, int, cuuint64_t);
static CUresult alias_cuGetProcAddress_v2(const char *, void **, int,
                                          cuuint64_t,
                                          CUdriverProcAddressQueryResult *);
extern __typeof__(cuGetProcAddress) local_cuGetProcAddress
    __attribute__((visibility("hidden")));
extern __typeof__(cuGetProcAddress_v2) local_cuGetProcAddress_v2
    __attribute__((visibility("hidden")));

/* void (*)(void) is the generic function pointer type (-Wcast-function-type). */
typedef void (*any_fn)(void);

/* One versioned variant of a driver function. */
struct variant {
    int since;        /* CUDA version that introduced it; 0 marks "none" */
    const char *name; /* exported name, for documentation and debugging */
    any_fn fn;        /* the exported function */
    any_fn alias;     /* its internal forwarder */
};

/* A base name with its variants, oldest first. */
struct proc_entry {
    const char *base;
    struct variant v[3];
    /* Per-thread default stream twins, if any, oldest first. */
    struct variant ptsz[2];
};

#define V(since, name) { since, #name, (any_fn)local_##name, (any_fn)alias_##name }

static const struct proc_entry g_procs[] = {
    { "cuInit", { V(2000, cuInit) }, { { 0 } } },
    { "cuGetExportTable", { V(3000, cuGetExportTable) }, { { 0 } } },
    { "cuDriverGetVersion", { V(2020, cuDriverGetVersion) }, { { 0 } } },
    { "cuDeviceGet", { V(2000, cuDeviceGet) }, { { 0 } } },
    { "cuDeviceGetCount", { V(2000, cuDeviceGetCount) }, { { 0 } } },
    { "cuDeviceGetName", { V(2000, cuDeviceGetName) }, { { 0 } } },
    { "cuDeviceGetUuid",
      { V(9020, cuDeviceGetUuid), V(11040, cuDeviceGetUuid_v2) }, { { 0 } } },
    { "cuDeviceTotalMem", { V(3020, cuDeviceTotalMem_v2) }, { { 0 } } },
    { "cuDeviceGetAttribute", { V(2000, cuDeviceGetAttribute) }, { { 0 } } },
    { "cuDevicePrimaryCtxRetain",
      { V(7000, cuDevicePrimaryCtxRetain) }, { { 0 } } },
    { "cuDevicePrimaryCtxRelease",
      { V(11000, cuDevicePrimaryCtxRelease_v2) }, { { 0 } } },
    { "cuDevicePrimaryCtxGetState",
      { V(7000, cuDevicePrimaryCtxGetState) }, { { 0 } } },
    { "cuDevicePrimaryCtxReset",
      { V(11000, cuDevicePrimaryCtxReset_v2) }, { { 0 } } },
    { "cuCtxCreate", { V(12050, cuCtxCreate_v4) }, { { 0 } } },
    { "cuCtxDestroy", { V(4000, cuCtxDestroy_v2) }, { { 0 } } },
    { "cuCtxPushCurrent", { V(4000, cuCtxPushCurrent_v2) }, { { 0 } } },
    { "cuCtxPopCurrent", { V(4000, cuCtxPopCurrent_v2) }, { { 0 } } },
    { "cuCtxSetCurrent", { V(4000, cuCtxSetCurrent) }, { { 0 } } },
    { "cuCtxGetCurrent", { V(4000, cuCtxGetCurrent) }, { { 0 } } },
    { "cuCtxGetDevice", { V(2000, cuCtxGetDevice) }, { { 0 } } },
    { "cuCtxSynchronize", { V(2000, cuCtxSynchronize) }, { { 0 } } },
    { "cuStreamCreate", { V(2000, cuStreamCreate) }, { { 0 } } },
    { "cuStreamCreateWithPriority", { V(5050, cuStreamCreateWithPriority) }, { { 0 } } },
    { "cuStreamDestroy", { V(4000, cuStreamDestroy_v2) }, { { 0 } } },
    { "cuStreamBeginCapture",
      { V(10000, cuStreamBeginCapture), V(10010, cuStreamBeginCapture_v2) },
      { V(10000, cuStreamBeginCapture_ptsz),
        V(10010, cuStreamBeginCapture_v2_ptsz) } },
    { "cuStreamEndCapture", { V(10000, cuStreamEndCapture) },
      { V(10000, cuStreamEndCapture_ptsz) } },
    { "cuStreamIsCapturing", { V(10000, cuStreamIsCapturing) },
      { V(10000, cuStreamIsCapturing_ptsz) } },
    { "cuMemAlloc",
      { V(2000, cuMemAlloc), V(3020, cuMemAlloc_v2) }, { { 0 } } },
    { "cuMemAllocPitch", { V(3020, cuMemAllocPitch_v2) }, { { 0 } } },
    { "cuMemAllocManaged", { V(6000, cuMemAllocManaged) }, { { 0 } } },
    { "cuMemFree", { V(3020, cuMemFree_v2) }, { { 0 } } },
    { "cuMemGetInfo", { V(3020, cuMemGetInfo_v2) }, { { 0 } } },
    { "cuMemsetD8Async", { V(3020, cuMemsetD8Async) },
      { V(7000, cuMemsetD8Async_ptsz) } },
    { "cuLaunchKernel", { V(4000, cuLaunchKernel) },
      { V(7000, cuLaunchKernel_ptsz) } },
    { "cuMemcpyDtoDAsync", { V(3020, cuMemcpyDtoDAsync_v2) },
      { V(7000, cuMemcpyDtoDAsync_v2_ptsz) } },
    { "cuMemcpyBatchAsync",
      { V(12080, cuMemcpyBatchAsync), V(13000, cuMemcpyBatchAsync_v2) },
      { V(12080, cuMemcpyBatchAsync_ptsz), V(13000, cuMemcpyBatchAsync_v2_ptsz) } },
    { "cuMemcpyAtoD", { V(3020, cuMemcpyAtoD_v2) },
      { V(7000, cuMemcpyAtoD_v2_ptds) } },
    { "cuMemcpyDtoA", { V(3020, cuMemcpyDtoA_v2) },
      { V(7000, cuMemcpyDtoA_v2_ptds) } },
    { "cuLaunch", { V(2000, cuLaunch) }, { { 0 } } },
    { "cuLaunchGrid", { V(2000, cuLaunchGrid) }, { { 0 } } },
    { "cuLaunchGridAsync", { V(2000, cuLaunchGridAsync) }, { { 0 } } },
    { "cuMemsetD32", { V(3020, cuMemsetD32_v2) }, { { 0 } } },
    { "cuMemcpyDtoH", { V(3020, cuMemcpyDtoH_v2) }, { { 0 } } },
    { "cuFuncGetParamInfo", { V(12040, cuFuncGetParamInfo) }, { { 0 } } },
    { "cuFuncGetName", { V(12030, cuFuncGetName) }, { { 0 } } },
    { "cuModuleLoadData", { V(2000, cuModuleLoadData) }, { { 0 } } },
    { "cuModuleGetFunction", { V(2000, cuModuleGetFunction) }, { { 0 } } },
    { "cuIpcGetMemHandle", { V(4010, cuIpcGetMemHandle) }, { { 0 } } },
    { "cuMemAllocAsync", { V(11020, cuMemAllocAsync) },
      { V(11020, cuMemAllocAsync_ptsz) } },
    { "cuMemAllocFromPoolAsync", { V(11020, cuMemAllocFromPoolAsync) },
      { V(11020, cuMemAllocFromPoolAsync_ptsz) } },
    { "cuMemFreeAsync", { V(11020, cuMemFreeAsync) },
      { V(11020, cuMemFreeAsync_ptsz) } },
    { "cuMemPoolCreate", { V(11020, cuMemPoolCreate) }, { { 0 } } },
    { "cuMemPoolDestroy", { V(11020, cuMemPoolDestroy) }, { { 0 } } },
    { "cuMemPoolTrimTo", { V(11020, cuMemPoolTrimTo) }, { { 0 } } },
    { "cuMemPoolSetAttribute", { V(11020, cuMemPoolSetAttribute) }, { { 0 } } },
    { "cuMemPoolGetAttribute", { V(11020, cuMemPoolGetAttribute) }, { { 0 } } },
    { "cuDeviceGetDefaultMemPool",
      { V(11020, cuDeviceGetDefaultMemPool) }, { { 0 } } },
    { "cuDeviceGetMemPool", { V(11020, cuDeviceGetMemPool) }, { { 0 } } },
    { "cuDeviceSetMemPool", { V(11020, cuDeviceSetMemPool) }, { { 0 } } },
    { "cuStreamSynchronize", { V(2000, cuStreamSynchronize) },
      { V(7000, cuStreamSynchronize_ptsz) } },
    { "cuStreamQuery", { V(2000, cuStreamQuery) },
      { V(7000, cuStreamQuery_ptsz) } },
    { "cuGraphCreate", { V(10000, cuGraphCreate) }, { { 0 } } },
    { "cuGraphDestroy", { V(10000, cuGraphDestroy) }, { { 0 } } },
    { "cuGraphAddMemAllocNode", { V(11040, cuGraphAddMemAllocNode) },
      { { 0 } } },
    { "cuGraphAddMemFreeNode", { V(11040, cuGraphAddMemFreeNode) }, { { 0 } } },
    { "cuGraphMemAllocNodeGetParams",
      { V(11040, cuGraphMemAllocNodeGetParams) }, { { 0 } } },
    { "cuGraphMemFreeNodeGetParams",
      { V(11040, cuGraphMemFreeNodeGetParams) }, { { 0 } } },
    { "cuGraphAddChildGraphNode", { V(10000, cuGraphAddChildGraphNode) },
      { { 0 } } },
    { "cuGraphChildGraphNodeGetGraph",
      { V(10000, cuGraphChildGraphNodeGetGraph) }, { { 0 } } },
    { "cuGraphGetNodes", { V(10000, cuGraphGetNodes) }, { { 0 } } },
    { "cuGraphNodeGetType", { V(10000, cuGraphNodeGetType) }, { { 0 } } },
    { "cuGraphKernelNodeGetParams",
      { V(10000, cuGraphKernelNodeGetParams),
        V(12000, cuGraphKernelNodeGetParams_v2) },
      { { 0 } } },
    /* From 12000 the name means cuGraphInstantiateWithFlags's ABI. */
    { "cuGraphInstantiate",
      { V(10000, cuGraphInstantiate), V(11000, cuGraphInstantiate_v2),
        V(12000, cuGraphInstantiateWithFlags) },
      { { 0 } } },
    { "cuGraphInstantiateWithFlags",
      { V(11040, cuGraphInstantiateWithFlags) }, { { 0 } } },
    { "cuGraphInstantiateWithParams",
      { V(12000, cuGraphInstantiateWithParams) },
      { V(12000, cuGraphInstantiateWithParams_ptsz) } },
    { "cuGraphExecDestroy", { V(10000, cuGraphExecDestroy) }, { { 0 } } },
    { "cuGraphExecUpdate", { V(12000, cuGraphExecUpdate_v2) }, { { 0 } } },
    { "cuGraphExecKernelNodeSetParams",
      { V(10010, cuGraphExecKernelNodeSetParams),
        V(12000, cuGraphExecKernelNodeSetParams_v2) },
      { { 0 } } },
    { "cuGraphLaunch", { V(10000, cuGraphLaunch) },
      { V(10000, cuGraphLaunch_ptsz) } },
    { "cuGraphUpload", { V(11010, cuGraphUpload) },
      { V(11010, cuGraphUpload_ptsz) } },
    { "cuDeviceGetGraphMemAttribute",
      { V(11040, cuDeviceGetGraphMemAttribute) }, { { 0 } } },
    { "cuDeviceSetGraphMemAttribute",
      { V(11040, cuDeviceSetGraphMemAttribute) }, { { 0 } } },
    { "cuDeviceGraphMemTrim", { V(11040, cuDeviceGraphMemTrim) }, { { 0 } } },
    { "cuStreamGetDevice", { V(12080, cuStreamGetDevice) },
      { V(12080, cuStreamGetDevice_ptsz) } },
    { "cuMemCreate", { V(10020, cuMemCreate) }, { { 0 } } },
    { "cuMemRelease", { V(10020, cuMemRelease) }, { { 0 } } },
    { "cuMemRetainAllocationHandle",
      { V(11000, cuMemRetainAllocationHandle) }, { { 0 } } },
    { "cuMemAddressReserve", { V(10020, cuMemAddressReserve) }, { { 0 } } },
    { "cuMemAddressFree", { V(10020, cuMemAddressFree) }, { { 0 } } },
    { "cuMemMap", { V(10020, cuMemMap) }, { { 0 } } },
    { "cuMemUnmap", { V(10020, cuMemUnmap) }, { { 0 } } },
    { "cuMemSetAccess", { V(10020, cuMemSetAccess) }, { { 0 } } },
    { "cuMemGetAccess", { V(10020, cuMemGetAccess) }, { { 0 } } },
    { "cuCtxEnablePeerAccess", { V(4000, cuCtxEnablePeerAccess) }, { { 0 } } },
    { "cuPointerGetAttribute", { V(4000, cuPointerGetAttribute) }, { { 0 } } },
    { "cuMemGetAddressRange",
      { V(3020, cuMemGetAddressRange_v2) }, { { 0 } } },
    { "cuMemGetAllocationGranularity",
      { V(10020, cuMemGetAllocationGranularity) }, { { 0 } } },
    { "cuMemExportToShareableHandle",
      { V(10020, cuMemExportToShareableHandle) }, { { 0 } } },
    { "cuMemImportFromShareableHandle",
      { V(10020, cuMemImportFromShareableHandle) }, { { 0 } } },
    { "cuArrayCreate", { V(3020, cuArrayCreate_v2) }, { { 0 } } },
    { "cuArray3DCreate", { V(3020, cuArray3DCreate_v2) }, { { 0 } } },
    { "cuArrayDestroy", { V(2000, cuArrayDestroy) }, { { 0 } } },
    { "cuMipmappedArrayCreate",
      { V(5000, cuMipmappedArrayCreate) }, { { 0 } } },
    { "cuMipmappedArrayDestroy",
      { V(5000, cuMipmappedArrayDestroy) }, { { 0 } } },
    { "cuArrayGetMemoryRequirements",
      { V(11060, cuArrayGetMemoryRequirements) }, { { 0 } } },
    { "cuMipmappedArrayGetMemoryRequirements",
      { V(11060, cuMipmappedArrayGetMemoryRequirements) }, { { 0 } } },
    { "cuMemHostAlloc", { V(2020, cuMemHostAlloc) }, { { 0 } } },
    { "cuMemAllocHost", { V(3020, cuMemAllocHost_v2) }, { { 0 } } },
    { "cuMemHostGetDevicePointer",
      { V(3020, cuMemHostGetDevicePointer_v2) }, { { 0 } } },
    { "cuMemFreeHost", { V(2000, cuMemFreeHost) }, { { 0 } } },
    { "cuMemHostRegister",
      { V(4000, cuMemHostRegister_v2) }, { { 0 } } },
    { "cuMemHostUnregister", { V(4000, cuMemHostUnregister) }, { { 0 } } },
    { "cuMemAdvise",
      { V(8000, cuMemAdvise), V(12020, cuMemAdvise_v2) }, { { 0 } } },
    { "cuEventCreate", { V(2000, cuEventCreate) }, { { 0 } } },
    { "cuEventRecord", { V(2000, cuEventRecord) },
      { V(7000, cuEventRecord_ptsz) } },
    { "cuEventQuery", { V(2000, cuEventQuery) }, { { 0 } } },
    { "cuEventSynchronize", { V(2000, cuEventSynchronize) }, { { 0 } } },
    { "cuEventDestroy", { V(4000, cuEventDestroy_v2) }, { { 0 } } },
    { "cuGetProcAddress",
      { V(11030, cuGetProcAddress), V(12000, cuGetProcAddress_v2) },
      { { 0 } } },
    { "cuGetErrorString", { V(6000, cuGetErrorString) }, { { 0 } } },
    { "cuGetErrorName", { V(6000, cuGetErrorName) }, { { 0 } } },
};

/*
 * A future driver's "cuMemAlloc" (STANDIN_DRIVER_VERSION 14000 and later):
 * an internal entry point that no older cudaVersion is answered with. It
 * allocates like cuMemAlloc_v2 and counts its calls, so it is a function of
 * its own.
 */
#define FUTURE_VERSION 14000
static atomic_ulong g_future_calls;
static CUresult future_cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
    atomic_fetch_add_explicit(&g_future_calls, 1, memory_order_relaxed);
    return local_cuMemAlloc_v2(dptr, bytesize);
}

/*
 * The lookup shared by both resolvers. *status is written whenever the call
 * returns CUDA_SUCCESS.
 */
static CUresult resolve(const char *symbol, void **pfn, int cudaVersion,
                        cuuint64_t flags, CUdriverProcAddressQueryResult *status)
{
    config();
    atomic_fetch_add_explicit(&g_getprocaddress_calls, 1, memory_order_relaxed);
    CHECK(symbol != NULL && pfn != NULL, CUDA_ERROR_INVALID_VALUE);
    *pfn = NULL;
    if (cudaVersion > g_cfg.driver_version ||
        flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        return CUDA_ERROR_INVALID_VALUE;
    if (cudaVersion >= FUTURE_VERSION && strcmp(symbol, "cuMemAlloc") == 0) {
        *pfn = (void *)future_cuMemAlloc;
        *status = CU_GET_PROC_ADDRESS_SUCCESS;
        return CUDA_SUCCESS;
    }

    const struct proc_entry *e = NULL;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        if (strcmp(g_procs[i].base, symbol) == 0) {
            e = &g_procs[i];
            break;
        }
    }
    if (e == NULL) {
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_SUCCESS;
    }

    /* Newest variant introduced at or before cudaVersion. */
    const struct variant *chosen = NULL;
    for (size_t i = 0; i < 3; i++)
        if (e->v[i].fn != NULL && e->v[i].since <= cudaVersion)
            chosen = &e->v[i];
    if (flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        for (size_t i = 0; i < 2; i++)
            if (e->ptsz[i].fn != NULL && e->ptsz[i].since <= cudaVersion)
                chosen = &e->ptsz[i];

    if (chosen == NULL) {
        *status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        return CUDA_SUCCESS;
    }
    *pfn = (void *)(g_cfg.aliases ? chosen->alias : chosen->fn);
    *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

/* CUDA 11.3 ABI: no status argument. */
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                          cuuint64_t flags)
{
    CUdriverProcAddressQueryResult ignored;
    return resolve(symbol, pfn, cudaVersion, flags, &ignored);
}
LOCAL(cuGetProcAddress)

/* CUDA 12.0 ABI: symbolStatus is optional. */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                             cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    CUdriverProcAddressQueryResult ignored;
    return resolve(symbol, pfn, cudaVersion, flags,
                   symbolStatus != NULL ? symbolStatus : &ignored);
}
LOCAL(cuGetProcAddress_v2)

ALIAS(cuGetProcAddress, (const char *s, void **p, int v, cuuint64_t f),
      (s, p, v, f))
ALIAS(cuGetProcAddress_v2,
      (const char *s, void **p, int v, cuuint64_t f,
       CUdriverProcAddressQueryResult *st),
      (s, p, v, f, st))

/* ---- Inspection exports for the tests ------------------------------------- */

int vramcap_standin_devices(void)
{
    config();
    return g_cfg.devices;
}

/* A size_t field of a device's state, read under the lock (0: no such device). */
static size_t device_field(int dev, size_t offset)
{
    config();
    if (!valid_device(dev))
        return 0;
    pthread_mutex_lock(&g_lock);
    size_t value = *(const size_t *)((const char *)&g_dev[dev] + offset);
    pthread_mutex_unlock(&g_lock);
    return value;
}

size_t vramcap_standin_used(int dev)
{
    return device_field(dev, offsetof(struct device_state, used));
}

size_t vramcap_standin_peak(int dev)
{
    return device_field(dev, offsetof(struct device_state, peak));
}

size_t vramcap_standin_managed_host(int dev)
{
    return device_field(dev, offsetof(struct device_state, managed_host));
}

/*
 * Test hook: from now on, count every charge of device dev that leaves its
 * used above `limit` (0 stops watching); returns the count so far and
 * resets it.
 */
unsigned long vramcap_standin_watch(int dev, size_t limit)
{
    config();
    if (!valid_device(dev))
        return 0;
    pthread_mutex_lock(&g_lock);
    unsigned long n = g_dev[dev].past_watch;
    g_dev[dev].past_watch = 0;
    g_dev[dev].watch = limit;
    pthread_mutex_unlock(&g_lock);
    return n;
}

int vramcap_standin_contexts(int dev)
{
    config();
    if (!valid_device(dev))
        return 0;
    pthread_mutex_lock(&g_lock);
    int n = g_dev[dev].primary_refs > 0;
    for (size_t i = 0; i < CTX_SLOTS; i++)
        n += g_created[i].live && g_created[i].dev == dev;
    pthread_mutex_unlock(&g_lock);
    return n;
}

const char *vramcap_standin_kind(CUdeviceptr ptr)
{
    config();
    const char *kind = "unknown";
    int dev;
    size_t i;
    pthread_mutex_lock(&g_lock);
    if (host_index_locked((uintptr_t)ptr, true) >= 0) {
        kind = "host";
    } else if (find_containing_locked(ptr, &dev, &i)) {
        const struct block *b = &g_dev[dev].blocks[i];
        kind = !b->managed ? "device" : b->on_host ? "managed-host" : "managed";
    }
    pthread_mutex_unlock(&g_lock);
    return kind;
}

void vramcap_standin_last_launch(unsigned dims[7], CUstream *stream)
{
    for (int i = 0; i < 7; i++)
        dims[i] = atomic_load(&g_last_launch[i]);
    *stream = atomic_load(&g_last_launch_stream);
}

unsigned long vramcap_standin_count(const char *what)
{
    config();
    if (what == NULL)
        return 0;
    static const struct {
        const char *what;
        atomic_ulong *count;
    } counters[] = {
        { "getprocaddress", &g_getprocaddress_calls },
        { "alias", &g_alias_calls },
        { "sync", &g_sync_calls },
        { "capture", &g_captures },
        { "ipc", &g_ipc_calls },
        { "async", &g_async_allocs },
        { "vmm", &g_vmm_creates },
        { "vmm_host", &g_vmm_host_creates },
        { "host_register", &g_host_registers },
        { "array", &g_array_creates },
        { "event", &g_event_records },
        { "launch", &g_launches },
        { "fault", &g_faults },
    };
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        if (strcmp(what, counters[i].what) == 0)
            return atomic_load(counters[i].count);
    if (strcmp(what, "host_bytes") == 0) {
        pthread_mutex_lock(&g_lock);
        unsigned long bytes = g_host_bytes;
        pthread_mutex_unlock(&g_lock);
        return bytes;
    }
    if (strcmp(what, "managed_host_bytes") == 0) {
        unsigned long bytes = 0;
        pthread_mutex_lock(&g_lock);
        for (int i = 0; i < g_cfg.devices; i++)
            bytes += g_dev[i].managed_host;
        pthread_mutex_unlock(&g_lock);
        return bytes;
    }

    bool allocs = strcmp(what, "alloc") == 0;
    if (!allocs && strcmp(what, "free") != 0)
        return 0;
    unsigned long n = 0;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < g_cfg.devices; i++)
        n += allocs ? g_dev[i].allocs : g_dev[i].frees;
    pthread_mutex_unlock(&g_lock);
    return n;
}

/* ---- Checkpointing (cuCheckpointProcess*) --------------------------------- */

#include "checkpoint_standin.c"
