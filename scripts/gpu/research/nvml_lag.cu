// nvml_lag.cu: how soon NVML's per-process figure follows a process's
// context and allocations (no shim). Prints one line per observation:
//   listed_after_ms=T            first time NVML lists this PID after cudaFree(0)
//   alloc N: nvml_now=A MiB after_1ms=B after_10ms=C after_100ms=D (expected E)
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } info_t;
typedef int (*init_t)(void);
typedef int (*byidx_t)(unsigned, void **);
typedef int (*procs_t)(void *, unsigned *, info_t *);
static procs_t procs;
static void *dev;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static long long mine(void) {
    info_t in[64];
    unsigned n = 64;
    if (procs(dev, &n, in) != 0) return -2;
    for (unsigned i = 0; i < n; i++)
        if (in[i].pid == (unsigned)getpid()) return (long long)(in[i].used >> 20);
    return -1;
}

int main(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) { printf("no nvml\n"); return 1; }
    ((init_t)dlsym(h, "nvmlInit_v2"))();
    ((byidx_t)dlsym(h, "nvmlDeviceGetHandleByIndex_v2"))(0, &dev);
    procs = (procs_t)dlsym(h, "nvmlDeviceGetComputeRunningProcesses_v3");
    double t0 = now_ms();
    cudaFree(0);
    double t1 = now_ms();
    long long m;
    int polls = 0;
    while ((m = mine()) < 0 && now_ms() - t1 < 5000) { polls++; usleep(500); }
    printf("context_ms=%.1f listed_after_ms=%.1f polls=%d first=%lld MiB\n", t1 - t0, now_ms() - t1, polls, m);
    long long base = m;
    void *p[4];
    for (int i = 0; i < 4; i++) {
        cudaMalloc(&p[i], 256ull << 20);
        long long a = mine();
        usleep(1000); long long b = mine();
        usleep(9000); long long c = mine();
        usleep(90000); long long d = mine();
        printf("alloc %d: nvml_now=%lld after_1ms=%lld after_10ms=%lld after_100ms=%lld expected=%lld\n", i, a, b, c, d, base + 256 * (i + 1));
    }
    for (int i = 0; i < 4; i++) {
        cudaFree(p[i]);
        long long a = mine();
        usleep(10000); long long c = mine();
        printf("free %d: nvml_now=%lld after_10ms=%lld\n", i, a, c);
    }
    return 0;
}
