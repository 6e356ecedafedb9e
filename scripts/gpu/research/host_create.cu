// host_create.cu — what making host memory for a first park costs, and
// whether more threads make it faster (issue 43: the shim's first park ran
// 0.305 s/GiB on the H200, session 16, nearly all of it making the host
// memory; later parks, which reuse it, 0.05). Without the shim. For GIB
// GiB (default 8) in chunks of CHUNK MiB (default 256), each way timed from
// the first call to the last memory ready, with 1, 2, 4 and 8 threads
// sharing the chunks:
//   vmm    cuMemCreate on the host (what tiered spill and the shim's park
//          use: it can be mapped behind the block's address);
//   alloc  cuMemHostAlloc (pinned, not mappable behind another address);
//   thp    mmap + madvise(MADV_HUGEPAGE) + every page touched by the
//          threads, then cuMemHostRegister of each chunk.
// Then vmm again with 1 thread, to see whether the driver keeps released
// host memory for the next creation. Prints
//   HOSTCREATE how=... threads=T gib=G s_per_gib=X
// and frees each way's memory before the next. Host memory only: at most
// GIB GiB at once.
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <vector>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_ = 0; cuGetErrorName(r_, &s_); printf("HOSTCREATE fail=%s at=%d\n", s_ ? s_ : "?", __LINE__); exit(1); } } while (0)

static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static CUcontext g_ctx;
static size_t g_chunk;
static int g_chunks;

struct Work {
    const char *how;
    int first, step;  // chunks first, first + step, ...
    std::vector<CUmemGenericAllocationHandle> *vmm;
    std::vector<void *> *ptrs;
    char *area;       // thp: the whole mapping
};

static void *run(void *arg) {
    Work *w = (Work *)arg;
    CK(cuCtxSetCurrent(g_ctx));
    for (int i = w->first; i < g_chunks; i += w->step) {
        if (strcmp(w->how, "vmm") == 0) {
            CUmemAllocationProp p = {};
            p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            p.location.type = CU_MEM_LOCATION_TYPE_HOST;
            p.location.id = 0;
            CK(cuMemCreate(&(*w->vmm)[i], g_chunk, &p, 0));
        } else if (strcmp(w->how, "alloc") == 0) {
            CK(cuMemHostAlloc(&(*w->ptrs)[i], g_chunk, 0));
        } else {
            char *c = w->area + (size_t)i * g_chunk;
            for (size_t o = 0; o < g_chunk; o += 4096)
                c[o] = 1;
            CK(cuMemHostRegister(c, g_chunk, 0));
        }
    }
    return NULL;
}

static double one_way(const char *how, int threads) {
    std::vector<CUmemGenericAllocationHandle> vmm(g_chunks);
    std::vector<void *> ptrs(g_chunks);
    size_t total = g_chunk * (size_t)g_chunks;
    char *area = NULL;
    double t0 = now();
    if (strcmp(how, "thp") == 0) {
        area = (char *)mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (area == MAP_FAILED) {
            printf("HOSTCREATE fail=mmap\n");
            exit(1);
        }
        madvise(area, total, MADV_HUGEPAGE);
    }
    std::vector<pthread_t> th(threads);
    std::vector<Work> ws(threads);
    for (int k = 0; k < threads; k++) {
        ws[k] = Work{how, k, threads, &vmm, &ptrs, area};
        pthread_create(&th[k], NULL, run, &ws[k]);
    }
    for (int k = 0; k < threads; k++)
        pthread_join(th[k], NULL);
    double s = now() - t0;
    for (int i = 0; i < g_chunks; i++) {
        if (strcmp(how, "vmm") == 0)
            CK(cuMemRelease(vmm[i]));
        else if (strcmp(how, "alloc") == 0)
            CK(cuMemFreeHost(ptrs[i]));
        else
            CK(cuMemHostUnregister(area + (size_t)i * g_chunk));
    }
    if (area)
        munmap(area, total);
    return s;
}

int main(int argc, char **argv) {
    int gib = argc > 1 ? atoi(argv[1]) : 8;
    int chunk_mib = argc > 2 ? atoi(argv[2]) : 256;
    if (gib < 1 || gib > 32 || chunk_mib < 2 || (size_t)gib * 1024 % chunk_mib != 0) {
        fprintf(stderr, "usage: host_create [GIB 1..32 [CHUNK_MIB, dividing GIB]]\n");
        return 2;
    }
    g_chunk = (size_t)chunk_mib << 20;
    g_chunks = (int)((size_t)gib * 1024 / chunk_mib);
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&g_ctx, dev));
    CK(cuCtxSetCurrent(g_ctx));
    const char *ways[] = {"vmm", "alloc", "thp"};
    const int counts[] = {1, 2, 4, 8};
    for (const char *how : ways)
        for (int t : counts)
            printf("HOSTCREATE how=%s threads=%d gib=%d chunk_mib=%d s_per_gib=%.4f\n", how, t, gib,
                   chunk_mib, one_way(how, t) / gib);
    printf("HOSTCREATE how=vmm-again threads=1 gib=%d chunk_mib=%d s_per_gib=%.4f\n", gib, chunk_mib,
           one_way("vmm", 1) / gib);
    fflush(stdout);
    return 0;
}
