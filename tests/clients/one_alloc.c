/*
 * one_alloc.c - one cache-miss cuMemAlloc_v2, in a function of its own, for
 * tests/alloc_path.rs to trace (valgrind's callgrind collects only inside
 * one_alloc_measured).
 *
 * The driver is reached the way XLA reaches it (dlopen + dlsym); device 0's
 * primary context is made current, two allocations of other sizes warm the
 * shim up (its engine, page and the device's cap, all made on first use),
 * nothing is freed, so the cache is empty and the measured allocation
 * misses it. Prints "one_alloc -> RC RC RC" (the three allocations' codes)
 * and exits 0, or names the step that failed and exits 1.
 *
 * "one-alloc hit N" instead makes N cache-hit pairs (a 1 MiB allocation
 * and its free), each in one_alloc_hit_pair, after 10 pairs that warm the
 * shim and its cache up: what scripts/bench-hit-path.sh counts. Prints
 * "one_alloc hit -> RC" (the pairs' codes or-ed together).
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*init_fn)(unsigned int);
typedef int (*device_get_fn)(int *, int);
typedef int (*retain_fn)(void **, int);
typedef int (*set_current_fn)(void *);
typedef int (*alloc_fn)(unsigned long long *, size_t);
typedef int (*free_fn)(unsigned long long);

static alloc_fn mem_alloc;
static free_fn mem_free;

static int pair(void)
{
    unsigned long long p = 0;
    int rc = mem_alloc(&p, 1 << 20);
    return rc | mem_free(p);
}

/* One measured cache-hit pair. */
__attribute__((noinline)) int one_alloc_hit_pair(void)
{
    return pair();
}

/* The measured call: not inlined, so that the trace can start and stop at
 * its edges. */
__attribute__((noinline)) int one_alloc_measured(unsigned long long *p, size_t bytes)
{
    return mem_alloc(p, bytes);
}

static void *need(void *lib, const char *name)
{
    void *f = dlsym(lib, name);
    if (!f)
        fprintf(stderr, "one_alloc: the driver has no %s\n", name);
    return f;
}

int main(int argc, char **argv)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "one_alloc: cannot open libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    init_fn init = (init_fn)need(lib, "cuInit");
    device_get_fn device_get = (device_get_fn)need(lib, "cuDeviceGet");
    retain_fn retain = (retain_fn)need(lib, "cuDevicePrimaryCtxRetain");
    set_current_fn set_current = (set_current_fn)need(lib, "cuCtxSetCurrent");
    mem_alloc = (alloc_fn)need(lib, "cuMemAlloc_v2");
    mem_free = (free_fn)need(lib, "cuMemFree_v2");
    if (!init || !device_get || !retain || !set_current || !mem_alloc || !mem_free)
        return 1;
    int dev = 0;
    void *ctx = NULL;
    if (init(0) != 0 || device_get(&dev, 0) != 0 || retain(&ctx, dev) != 0 ||
        set_current(ctx) != 0) {
        fprintf(stderr, "one_alloc: no context on device 0\n");
        return 1;
    }
    if (argc == 3 && strcmp(argv[1], "hit") == 0) {
        int n = atoi(argv[2]), rc = 0;
        for (int i = 0; i < 10; i++)
            rc |= pair();
        for (int i = 0; i < n; i++)
            rc |= one_alloc_hit_pair();
        printf("one_alloc hit -> %d\n", rc);
        return 0;
    }
    unsigned long long a = 0, b = 0, c = 0;
    int first = mem_alloc(&a, 1 << 20);
    int second = mem_alloc(&b, 3 << 20);
    int measured = one_alloc_measured(&c, 5 << 20);
    printf("one_alloc -> %d %d %d\n", first, second, measured);
    return 0;
}
