// held.cu: what a process holds on the GPU, for tests/test_held.py (issue 12).
//
//   held MODE CAP_BYTES
//
// CAP_BYTES is the cap the process runs under (VRAMCAP_LIMIT); the sizes of
// each scenario are worked out from it. Every capped mode first checks that
// cudaMemGetInfo's total is at most CAP_BYTES and stops with an ERROR line if
// not (the shim is not capping: nothing large is allocated uncapped), and no
// fill goes past CAP_BYTES + 1 GiB (its hard stop).
//
// At each point where the process holds what it is to be measured at, it
// synchronises the device, prints
//   HOLDING pid=P what=TAG free=F total=T     (cudaMemGetInfo right then)
// and blocks until a line arrives on stdin: the script reads NVML's figure
// for the process (nvidia-smi from outside) meanwhile. At the end it prints
//   RESULT mode=MODE key=value ...
// and exits 0 when the calls that must succeed did (ERROR line and exit 1
// otherwise); whether the scenario went as it should is the script's call.
//
// Modes (C = CAP_BYTES):
//   start          context created (cudaFree(0)), cudaMemGetInfo; one hold
//   fill-malloc    cudaMalloc 1 GiB chunks, halving on each refusal down to
//                  2 MiB, until the 2 MiB one is refused; cudaMemset each; hold
//   fill-async     the same with cudaMallocAsync on a stream, the default
//                  pool's release threshold at UINT64_MAX, each chunk set and
//                  synchronised; hold
//   pool           threshold UINT64_MAX; cudaMallocAsync 70% of the free at
//                  start (F0), cudaFreeAsync, synchronise; hold; cudaMalloc
//                  90% of F0 (expected refused); cudaMemPoolTrimTo(pool, 0);
//                  the same cudaMalloc again (expected to succeed); hold
//   halves         total T; cudaMalloc(T/2) twice (expected: yes, then no); hold
//   graph-capture  cudaMalloc 3/8 C; stream capture (global mode) of
//                  cudaMallocAsync 3/4 C, a kernel writing all of it,
//                  cudaFreeAsync; instantiate, launch, synchronise (expected
//                  to be refused at instantiate or launch); hold; free the
//                  3/8 C, cudaDeviceGraphMemTrim, launch again (expected to
//                  succeed); hold (the graph's memory stays reserved)
//   graph-explicit the same graph built with cudaGraphAddMemAllocNode, a
//                  kernel node and cudaGraphAddMemFreeNode
//   footprint      (run without the shim) the bare context after cudaFree(0);
//                  hold; then how much the default pool's reserved memory
//                  grows for a 1-byte cudaMallocAsync and the device's graph
//                  memory for a graph with a 1-byte allocation node

#include "common.cuh"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <vector>

static const size_t MIB = size_t(1) << 20;
static const size_t GIB = size_t(1) << 30;

// The last cudaMemGetInfo.
static size_t g_free = 0, g_total = 0;

static void mem_info() {
    if (cudaMemGetInfo(&g_free, &g_total) != cudaSuccess) {
        g_free = g_total = 0;
        cudaGetLastError();
    }
}

// Synchronise, print the HOLDING line and wait for the script's line.
// Returns 0, or 1 when stdin ended first (printed as a HANDSHAKE line).
static int hold(const char *what) {
    cudaError_t e = cudaDeviceSynchronize();
    mem_info();
    printf("HOLDING pid=%d what=%s free=%zu total=%zu sync=%s\n", (int)getpid(), what, g_free,
           g_total, rt_name(e));
    fflush(stdout);
    char buf[256];
    if (fgets(buf, sizeof buf, stdin) == NULL) {
        printf("HANDSHAKE what=%s stdin=eof\n", what);
        fflush(stdout);
        return 1;
    }
    return 0;
}

__global__ void touch(unsigned int *p, size_t n) {
    size_t step = size_t(gridDim.x) * blockDim.x;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
        p[i] = (unsigned int)i;
}

// Context, the process's view, and the guard against an uncapped run.
static int begin(size_t cap, bool guard) {
    CHECK(cudaSetDevice(0));
    CHECK(cudaFree(0));
    mem_info();
    printf("START free=%zu total=%zu\n", g_free, g_total);
    if (guard && (g_total == 0 || g_total > cap)) {
        printf("ERROR cudaMemGetInfo total %zu is above the cap %zu (or unknown): not capped, "
               "nothing allocated\n",
               g_total, cap);
        return 1;
    }
    return 0;
}

static cudaMemPool_t default_pool_retaining() {
    cudaMemPool_t pool = NULL;
    if (cudaDeviceGetDefaultMemPool(&pool, 0) != cudaSuccess) return NULL;
    uint64_t thr = UINT64_MAX;
    if (cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &thr) != cudaSuccess)
        return NULL;
    return pool;
}

// A non-blocking stream in *s and the default pool, set to keep everything,
// in *pool; 1 after one ERROR line when either cannot be had.
static int stream_and_pool(cudaStream_t *s, cudaMemPool_t *pool) {
    CHECK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    *pool = default_pool_retaining();
    if (!*pool) {
        printf("ERROR default pool / release threshold: %s\n", rt_name(cudaGetLastError()));
        return 1;
    }
    return 0;
}

static uint64_t pool_attr(cudaMemPool_t pool, cudaMemPoolAttr a) {
    uint64_t v = 0;
    if (cudaMemPoolGetAttribute(pool, a, &v) != cudaSuccess) {
        cudaGetLastError();
        return UINT64_MAX;
    }
    return v;
}

static uint64_t graph_attr(cudaGraphMemAttributeType a) {
    uint64_t v = 0;
    if (cudaDeviceGetGraphMemAttribute(0, a, &v) != cudaSuccess) {
        cudaGetLastError();
        return UINT64_MAX;
    }
    return v;
}

// ---------------------------------------------------------------- start

static int mode_start(size_t cap) {
    if (begin(cap, true)) return 1;
    size_t f = g_free, t = g_total;
    int hs = hold("context");
    printf("RESULT mode=start free=%zu total=%zu handshake=%d\n", f, t, hs);
    return 0;
}

// ---------------------------------------------------------------- fills

// Fill with 1 GiB chunks halving down to 2 MiB; `async` uses cudaMallocAsync
// on a stream with the default pool retaining everything.
static int mode_fill(size_t cap, bool async) {
    if (begin(cap, true)) return 1;
    const size_t hard = cap + GIB;
    cudaStream_t s = 0;
    cudaMemPool_t pool = NULL;
    if (async && stream_and_pool(&s, &pool)) return 1;
    std::vector<void *> ptrs;
    size_t bytes = 0, chunk = GIB;
    int refusals = 0;
    cudaError_t last = cudaSuccess, syncerr = cudaSuccess;
    const char *stop = "refused";
    while (chunk >= 2 * MIB) {
        if (bytes + chunk > hard) {
            stop = "limit";
            chunk /= 2;
            continue;
        }
        void *p = NULL;
        cudaError_t e = async ? cudaMallocAsync(&p, chunk, s) : cudaMalloc(&p, chunk);
        if (e != cudaSuccess) {
            last = e;
            refusals++;
            cudaGetLastError();
            chunk /= 2;
            continue;
        }
        if (async) {
            cudaMemsetAsync(p, 0x5a, chunk, s);
            syncerr = cudaStreamSynchronize(s);
            if (syncerr != cudaSuccess) {
                // The memory was promised but not delivered: stop here.
                ptrs.push_back(p);
                bytes += chunk;
                stop = "sync";
                break;
            }
        } else {
            CHECK(cudaMemset(p, 0x5a, chunk));
        }
        ptrs.push_back(p);
        bytes += chunk;
    }
    if (refusals == 0 && strcmp(stop, "sync") != 0) stop = "limit";
    mem_info();
    size_t f = g_free, t = g_total;
    uint64_t reserved = async ? pool_attr(pool, cudaMemPoolAttrReservedMemCurrent) : 0;
    uint64_t used = async ? pool_attr(pool, cudaMemPoolAttrUsedMemCurrent) : 0;
    int hs = hold(async ? "filled-async" : "filled");
    printf("RESULT mode=%s bytes=%zu chunks=%zu refusals=%d err=%d errname=%s stop=%s sync=%s "
           "free=%zu total=%zu pool_reserved=%llu pool_used=%llu handshake=%d\n",
           async ? "fill-async" : "fill-malloc", bytes, ptrs.size(), refusals, (int)last,
           rt_name(last), stop, rt_name(syncerr), f, t, (unsigned long long)reserved,
           (unsigned long long)used, hs);
    fflush(stdout);
    for (void *p : ptrs) {
        if (async)
            cudaFreeAsync(p, s);
        else
            cudaFree(p);
    }
    if (async) {
        cudaStreamSynchronize(s);
        cudaMemPoolTrimTo(pool, 0);
        cudaStreamDestroy(s);
    }
    return 0;
}

// ---------------------------------------------------------------- pool

static int mode_pool(size_t cap) {
    if (begin(cap, true)) return 1;
    const size_t f0 = g_free, t0 = g_total;
    const size_t a = (size_t)(0.7 * (double)f0);
    const size_t b = (size_t)(0.9 * (double)f0);
    cudaStream_t s;
    cudaMemPool_t pool;
    if (stream_and_pool(&s, &pool)) return 1;
    void *p = NULL;
    cudaError_t ea = cudaMallocAsync(&p, a, s);
    cudaError_t es = cudaSuccess;
    if (ea == cudaSuccess) {
        cudaMemsetAsync(p, 0x5a, a, s);
        cudaFreeAsync(p, s);
        es = cudaStreamSynchronize(s);
    } else {
        cudaGetLastError();
    }
    const uint64_t retained = pool_attr(pool, cudaMemPoolAttrReservedMemCurrent);
    int hs1 = hold("retained");
    const size_t f1 = g_free;

    void *q = NULL;
    cudaError_t e1 = cudaMalloc(&q, b);
    if (e1 == cudaSuccess) {
        cudaFree(q);  // should not have fitted; give it back before the trim
        q = NULL;
    } else {
        cudaGetLastError();
    }
    cudaError_t et = cudaMemPoolTrimTo(pool, 0);
    const uint64_t trimmed = pool_attr(pool, cudaMemPoolAttrReservedMemCurrent);
    mem_info();
    const size_t f2 = g_free;
    cudaError_t e2 = cudaMalloc(&q, b);
    int hs2 = 0;
    if (e2 == cudaSuccess) {
        cudaMemset(q, 0x5a, b);
        hs2 = hold("after-trim");
        cudaFree(q);
    } else {
        cudaGetLastError();
    }
    printf("RESULT mode=pool free0=%zu total0=%zu async_bytes=%zu async_err=%d async_errname=%s "
           "sync=%s retained=%llu free_retained=%zu malloc_bytes=%zu before_trim_err=%d "
           "before_trim_errname=%s trim=%s reserved_after_trim=%llu free_after_trim=%zu "
           "after_trim_err=%d after_trim_errname=%s handshake=%d\n",
           f0, t0, a, (int)ea, rt_name(ea), rt_name(es), (unsigned long long)retained, f1, b,
           (int)e1, rt_name(e1), rt_name(et), (unsigned long long)trimmed, f2, (int)e2,
           rt_name(e2), hs1 + hs2);
    cudaStreamDestroy(s);
    return 0;
}

// ---------------------------------------------------------------- halves

static int mode_halves(size_t cap) {
    if (begin(cap, true)) return 1;
    const size_t t = g_total, half = g_total / 2;
    void *p = NULL, *q = NULL;
    cudaError_t e1 = cudaMalloc(&p, half);
    if (e1 == cudaSuccess) cudaMemset(p, 0x5a, half); else cudaGetLastError();
    mem_info();
    const size_t f1 = g_free;
    cudaError_t e2 = cudaMalloc(&q, half);
    if (e2 == cudaSuccess) cudaMemset(q, 0x5a, half); else cudaGetLastError();
    int hs = hold("halves");
    printf("RESULT mode=halves total=%zu half=%zu first_err=%d first_errname=%s free_after_first=%zu "
           "second_err=%d second_errname=%s free=%zu handshake=%d\n",
           t, half, (int)e1, rt_name(e1), f1, (int)e2, rt_name(e2), g_free, hs);
    if (p) cudaFree(p);
    if (q) cudaFree(q);
    return 0;
}

// ---------------------------------------------------------------- graphs

// Where a graph run first failed, and with what.
struct Attempt {
    const char *at = "none";
    cudaError_t err = cudaSuccess;
    void fail(const char *where, cudaError_t e) {
        if (err == cudaSuccess && e != cudaSuccess) {
            at = where;
            err = e;
        }
    }
};

// Launch and synchronise exec on s.
static void launch(cudaGraphExec_t exec, cudaStream_t s, Attempt &a) {
    cudaError_t e = cudaGraphLaunch(exec, s);
    if (e != cudaSuccess) {
        a.fail("launch", e);
        cudaGetLastError();
        return;
    }
    e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) {
        a.fail("sync", e);
        cudaGetLastError();
    }
}

static int mode_graph(size_t cap, bool explicit_graph) {
    if (begin(cap, true)) return 1;
    const size_t first = cap / 8 * 3;  // 1.5 GiB at a 4 GiB cap
    const size_t gbytes = cap / 4 * 3;  // 3 GiB at a 4 GiB cap
    const size_t words = gbytes / sizeof(unsigned int);
    void *big = NULL;
    CHECK(cudaMalloc(&big, first));
    CHECK(cudaMemset(big, 0x5a, first));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

    Attempt build, run1, run2;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    if (!explicit_graph) {
        cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
        build.fail("begin_capture", e);
        if (e == cudaSuccess) {
            void *g = NULL;
            e = cudaMallocAsync(&g, gbytes, s);
            build.fail("capture_alloc", e);
            if (e == cudaSuccess) {
                touch<<<1024, 256, 0, s>>>((unsigned int *)g, words);
                build.fail("capture_kernel", cudaGetLastError());
                build.fail("capture_free", cudaFreeAsync(g, s));
            }
            e = cudaStreamEndCapture(s, &graph);
            build.fail("end_capture", e);
        }
    } else {
        cudaError_t e = cudaGraphCreate(&graph, 0);
        build.fail("graph_create", e);
        if (e == cudaSuccess) {
            cudaMemAllocNodeParams ap;
            memset(&ap, 0, sizeof ap);
            ap.poolProps.allocType = cudaMemAllocationTypePinned;
            ap.poolProps.location.type = cudaMemLocationTypeDevice;
            ap.poolProps.location.id = 0;
            ap.bytesize = gbytes;
            cudaGraphNode_t an = NULL, kn = NULL, fn = NULL;
            e = cudaGraphAddMemAllocNode(&an, graph, NULL, 0, &ap);
            build.fail("alloc_node", e);
            if (e == cudaSuccess) {
                unsigned int *gp = (unsigned int *)ap.dptr;
                size_t n = words;
                void *args[2] = {&gp, &n};
                cudaKernelNodeParams kp = {};
                kp.func = (void *)touch;
                kp.gridDim = dim3(1024);
                kp.blockDim = dim3(256);
                kp.kernelParams = args;
                e = cudaGraphAddKernelNode(&kn, graph, &an, 1, &kp);
                build.fail("kernel_node", e);
                if (e == cudaSuccess) {
                    build.fail("free_node", cudaGraphAddMemFreeNode(&fn, graph, &kn, 1, ap.dptr));
                }
            }
        }
    }
    if (build.err == cudaSuccess) {
        cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
        if (e != cudaSuccess) {
            // Refused at instantiation: that is run 1's outcome.
            run1.fail("instantiate", e);
            cudaGetLastError();
            exec = NULL;
        } else {
            launch(exec, s, run1);
        }
    } else {
        cudaGetLastError();
    }
    const uint64_t res1 = graph_attr(cudaGraphMemAttrReservedMemCurrent);
    int hs = 0;
    hs += hold("graph-refused");
    const size_t f1 = g_free;

    // Room made: free the first allocation, trim the graph memory, try again.
    CHECK(cudaFree(big));
    cudaError_t etrim = cudaDeviceGraphMemTrim(0);
    if (build.err == cudaSuccess) {
        if (exec == NULL) {
            cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
            if (e != cudaSuccess) {
                run2.fail("instantiate", e);
                cudaGetLastError();
                exec = NULL;
            }
        }
        if (exec != NULL) launch(exec, s, run2);
    } else {
        run2.fail("build", build.err);
    }
    const uint64_t res2 = graph_attr(cudaGraphMemAttrReservedMemCurrent);
    hs += hold("graph-ran");
    const size_t f2 = g_free;
    printf("RESULT mode=%s first_bytes=%zu graph_bytes=%zu build_at=%s build_err=%d "
           "build_errname=%s run1_at=%s run1_err=%d run1_errname=%s graph_reserved1=%llu "
           "free1=%zu trim=%s run2_at=%s run2_err=%d run2_errname=%s graph_reserved2=%llu "
           "free2=%zu handshake=%d\n",
           explicit_graph ? "graph-explicit" : "graph-capture", first, gbytes, build.at,
           (int)build.err, rt_name(build.err), run1.at, (int)run1.err, rt_name(run1.err),
           (unsigned long long)res1, f1, rt_name(etrim), run2.at, (int)run2.err,
           rt_name(run2.err), (unsigned long long)res2, f2, hs);
    fflush(stdout);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaDeviceSynchronize();
    cudaDeviceGraphMemTrim(0);
    cudaStreamDestroy(s);
    return 0;
}

// ---------------------------------------------------------------- footprint

static int mode_footprint() {
    if (begin(0, false)) return 1;
    size_t f0 = g_free, t0 = g_total;
    int hs = hold("context");

    // The default pool's granule: reserved memory for a 1-byte allocation.
    cudaStream_t s;
    cudaMemPool_t pool;
    if (stream_and_pool(&s, &pool)) return 1;
    uint64_t r0 = pool_attr(pool, cudaMemPoolAttrReservedMemCurrent);
    void *p = NULL;
    CHECK(cudaMallocAsync(&p, 1, s));
    CHECK(cudaStreamSynchronize(s));
    uint64_t r1 = pool_attr(pool, cudaMemPoolAttrReservedMemCurrent);
    CHECK(cudaFreeAsync(p, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemPoolTrimTo(pool, 0));

    // Graph memory for a graph with a 1-byte allocation node.
    uint64_t g0 = graph_attr(cudaGraphMemAttrReservedMemCurrent);
    cudaGraph_t graph;
    CHECK(cudaGraphCreate(&graph, 0));
    cudaMemAllocNodeParams ap;
    memset(&ap, 0, sizeof ap);
    ap.poolProps.allocType = cudaMemAllocationTypePinned;
    ap.poolProps.location.type = cudaMemLocationTypeDevice;
    ap.poolProps.location.id = 0;
    ap.bytesize = 1;
    cudaGraphNode_t an, fn;
    CHECK(cudaGraphAddMemAllocNode(&an, graph, NULL, 0, &ap));
    CHECK(cudaGraphAddMemFreeNode(&fn, graph, &an, 1, ap.dptr));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaStreamSynchronize(s));
    uint64_t g1 = graph_attr(cudaGraphMemAttrReservedMemCurrent);
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaDeviceGraphMemTrim(0));
    printf("RESULT mode=footprint free=%zu total=%zu pool_reserved0=%llu pool_reserved1=%llu "
           "pool_granule=%llu graph_reserved0=%llu graph_reserved1=%llu graph_granule=%llu "
           "handshake=%d\n",
           f0, t0, (unsigned long long)r0, (unsigned long long)r1,
           (unsigned long long)(r1 - r0), (unsigned long long)g0, (unsigned long long)g1,
           (unsigned long long)(g1 - g0), hs);
    cudaStreamDestroy(s);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: held MODE [CAP_BYTES] (see the top of held.cu)\n");
        return 2;
    }
    const char *mode = argv[1];
    size_t cap = argc > 2 ? strtoull(argv[2], NULL, 10) : 0;
    if (strcmp(mode, "footprint") == 0) return mode_footprint();
    if (cap < GIB || cap > 16 * GIB) {
        fprintf(stderr, "held: CAP_BYTES must be 1..16 GiB\n");
        return 2;
    }
    if (strcmp(mode, "start") == 0) return mode_start(cap);
    if (strcmp(mode, "fill-malloc") == 0) return mode_fill(cap, false);
    if (strcmp(mode, "fill-async") == 0) return mode_fill(cap, true);
    if (strcmp(mode, "pool") == 0) return mode_pool(cap);
    if (strcmp(mode, "halves") == 0) return mode_halves(cap);
    if (strcmp(mode, "graph-capture") == 0) return mode_graph(cap, false);
    if (strcmp(mode, "graph-explicit") == 0) return mode_graph(cap, true);
    fprintf(stderr, "held: unknown mode %s\n", mode);
    return 2;
}
