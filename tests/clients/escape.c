/*
 * escape.c - ways a program can reach the driver around an LD_PRELOAD
 * library, for tests/escape.rs and the GPU machine.
 *
 *   escape deepbind LIB N MIB   dlopen(LIB, RTLD_NOW | RTLD_DEEPBIND)
 *   escape plain LIB N MIB      dlopen(LIB, RTLD_NOW)
 *   escape dlmopen LIB N MIB    dlmopen(LM_ID_NEWLM, LIB, RTLD_NOW)
 *       then LIB's escape_fill: N allocations of MIB MiB on device 0.
 *       -> "open -> ok" or "open -> null" (and dlerror's text on stderr),
 *          then "alloc MIB MiB -> RC" per allocation
 *   escape procaddr NAME VERSION N MIB
 *       dlsym cuGetProcAddress_v2 from dlopen("libcuda.so.1"), look up
 *       cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain and cuCtxSetCurrent
 *       at 12000 and NAME (cuMemAlloc or cuMemAllocPitch) at VERSION, and
 *       allocate N times MIB MiB through it
 *       -> "lookup NAME VERSION -> RC status=S", then the alloc lines
 *   escape shim DRIVER SHIM N MIB
 *       dlopen(DRIVER, RTLD_GLOBAL) (so that the shim's own dlopen of
 *       "libcuda.so.1" finds it by its soname, with no search path: a
 *       set-user-ID program's loader ignores LD_LIBRARY_PATH), then
 *       dlopen(SHIM); set up a context through the driver and allocate N
 *       times MIB MiB through the shim's cuMemAlloc_v2
 *       -> "open -> ok", then the alloc lines
 *   escape copy LIB NAME
 *       dlopen(LIB) (a copy of the driver at another path) and dlsym NAME
 *       in it -> "dlsym NAME -> found|null dlerror=set|unset"
 *   escape setlimit MIB CASE...
 *       first cuInit and vramcap_set_limit(0, MIB MiB) (the shim's C ABI,
 *       found with dlsym(RTLD_DEFAULT)) -> "setlimit MIB -> RC", then CASE
 *
 * Exit status 0 once the commands ran (whatever the driver answered),
 * 2 on a bad command line, 1 when a set-up step failed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef REAL_CUDA /* on the GPU machine: nvcc's headers */
#include <cuda.h>
#else
#include "cuda_subset.h"
#endif

typedef int (*fill_fn)(int, size_t, int *);
typedef CUresult (*resolver_fn)(const char *, void **, int, cuuint64_t,
                                CUdriverProcAddressQueryResult *);

static int usage(void)
{
    fprintf(stderr, "usage: escape deepbind|plain|dlmopen LIB N MIB\n"
                    "       escape procaddr cuMemAlloc|cuMemAllocPitch VERSION N MIB\n"
                    "       escape shim DRIVER SHIM N MIB\n"
                    "       escape copy LIB NAME\n"
                    "       escape setlimit MIB CASE...\n");
    return 2;
}

static int number(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

static int load(const char *how, const char *lib, int n, size_t mib)
{
    void *h;
    if (strcmp(how, "deepbind") == 0)
        h = dlopen(lib, RTLD_NOW | RTLD_DEEPBIND);
    else if (strcmp(how, "plain") == 0)
        h = dlopen(lib, RTLD_NOW);
    else
        h = dlmopen(LM_ID_NEWLM, lib, RTLD_NOW);
    if (h == NULL) {
        const char *e = dlerror();
        printf("open -> null\n");
        fprintf(stderr, "dlerror: %s\n", e != NULL ? e : "(none)");
        return 0;
    }
    printf("open -> ok\n");
    fill_fn fill = (fill_fn)dlsym(h, "escape_fill");
    int rcs[64];
    if (fill == NULL || fill(n, mib << 20, rcs) != CUDA_SUCCESS) {
        printf("fill -> failed\n");
        return 1;
    }
    for (int i = 0; i < n; i++)
        printf("alloc %zu MiB -> %d\n", mib, rcs[i]);
    return 0;
}

static int procaddr(const char *name, int version, int n, size_t mib)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    resolver_fn get = lib != NULL ? (resolver_fn)dlsym(lib, "cuGetProcAddress_v2") : NULL;
    if (get == NULL) {
        printf("resolver -> missing\n");
        return 1;
    }
    CUresult (*init)(unsigned int) = NULL;
    CUresult (*device_get)(CUdevice *, int) = NULL;
    CUresult (*retain)(CUcontext *, CUdevice) = NULL;
    CUresult (*set_current)(CUcontext) = NULL;
    CUdriverProcAddressQueryResult st;
    if (get("cuInit", (void **)&init, 12000, 0, &st) != CUDA_SUCCESS || init == NULL ||
        get("cuDeviceGet", (void **)&device_get, 12000, 0, &st) != CUDA_SUCCESS ||
        device_get == NULL ||
        get("cuDevicePrimaryCtxRetain", (void **)&retain, 12000, 0, &st) != CUDA_SUCCESS ||
        retain == NULL ||
        get("cuCtxSetCurrent", (void **)&set_current, 12000, 0, &st) != CUDA_SUCCESS ||
        set_current == NULL) {
        printf("setup lookups -> failed\n");
        return 1;
    }
    void *f = NULL;
    st = (CUdriverProcAddressQueryResult)-1;
    CUresult rc = get(name, &f, version, 0, &st);
    printf("lookup %s %d -> %d status=%d\n", name, version, rc, (int)st);
    CUdevice dev;
    CUcontext ctx;
    if (init(0) != CUDA_SUCCESS || device_get(&dev, 0) != CUDA_SUCCESS ||
        retain(&ctx, dev) != CUDA_SUCCESS || set_current(ctx) != CUDA_SUCCESS) {
        printf("context -> failed\n");
        return 1;
    }
    if (rc != CUDA_SUCCESS || f == NULL)
        return 0;
    for (int i = 0; i < n; i++) {
        CUdeviceptr p;
        size_t pitch;
        if (strcmp(name, "cuMemAlloc") == 0)
            rc = ((CUresult (*)(CUdeviceptr *, size_t))f)(&p, mib << 20);
        else
            rc = ((CUresult (*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int))f)(
                &p, &pitch, mib << 20, 1, 4);
        printf("alloc %zu MiB -> %d\n", mib, rc);
    }
    return 0;
}

static int through_shim(const char *driver, const char *shim, int n, size_t mib)
{
    void *d = dlopen(driver, RTLD_NOW | RTLD_GLOBAL);
    void *h = d != NULL ? dlopen(shim, RTLD_NOW) : NULL;
    if (h == NULL) {
        const char *e = dlerror();
        printf("open -> null\n");
        fprintf(stderr, "dlerror: %s\n", e != NULL ? e : "(none)");
        return 1;
    }
    printf("open -> ok\n");
    CUresult (*init)(unsigned int) = (CUresult (*)(unsigned int))dlsym(d, "cuInit");
    CUresult (*device_get)(CUdevice *, int) =
        (CUresult (*)(CUdevice *, int))dlsym(d, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult (*)(CUcontext *, CUdevice))dlsym(d, "cuDevicePrimaryCtxRetain");
    CUresult (*set_current)(CUcontext) = (CUresult (*)(CUcontext))dlsym(d, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) =
        (CUresult (*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
    CUdevice dev;
    CUcontext ctx;
    if (init == NULL || device_get == NULL || retain == NULL || set_current == NULL ||
        alloc == NULL || init(0) != CUDA_SUCCESS || device_get(&dev, 0) != CUDA_SUCCESS ||
        retain(&ctx, dev) != CUDA_SUCCESS || set_current(ctx) != CUDA_SUCCESS) {
        printf("context -> failed\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        CUdeviceptr p;
        printf("alloc %zu MiB -> %d\n", mib, alloc(&p, mib << 20));
    }
    return 0;
}

static int copy_lookup(const char *lib, const char *name)
{
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        printf("open -> null\n");
        return 1;
    }
    dlerror(); /* clear */
    void *f = dlsym(h, name);
    const char *e = dlerror();
    printf("dlsym %s -> %s dlerror=%s\n", name, f != NULL ? "found" : "null",
           e != NULL ? "set" : "unset");
    return 0;
}

/* cuInit, then the shim's vramcap_set_limit(0, mib MiB); 0 when both ran. */
static int set_limit(long mib)
{
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    CUresult (*init)(unsigned int) =
        cuda != NULL ? (CUresult (*)(unsigned int))dlsym(cuda, "cuInit") : NULL;
    int (*set)(int, unsigned long long) =
        (int (*)(int, unsigned long long))dlsym(RTLD_DEFAULT, "vramcap_set_limit");
    if (init == NULL || set == NULL || init(0) != CUDA_SUCCESS) {
        printf("setlimit -> no shim\n");
        return 1;
    }
    printf("setlimit %ld -> %d\n", mib, set(0, (unsigned long long)mib << 20));
    return 0;
}

int main(int argc, char **argv)
{
    long n, mib, version;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 3 && strcmp(argv[1], "setlimit") == 0 && number(argv[2], 1, 1 << 20, &mib)) {
        if (set_limit(mib) != 0)
            return 1;
        argc -= 2;
        argv += 2;
    }
    if (argc == 4 && strcmp(argv[1], "copy") == 0)
        return copy_lookup(argv[2], argv[3]);
    if (argc == 5 && (strcmp(argv[1], "deepbind") == 0 || strcmp(argv[1], "plain") == 0 ||
                      strcmp(argv[1], "dlmopen") == 0) &&
        number(argv[3], 1, 64, &n) && number(argv[4], 1, 1 << 20, &mib))
        return load(argv[1], argv[2], (int)n, (size_t)mib);
    if (argc == 6 && strcmp(argv[1], "procaddr") == 0 &&
        (strcmp(argv[2], "cuMemAlloc") == 0 || strcmp(argv[2], "cuMemAllocPitch") == 0) &&
        number(argv[3], 1000, 99999, &version) && number(argv[4], 1, 64, &n) &&
        number(argv[5], 1, 1 << 20, &mib))
        return procaddr(argv[2], (int)version, (int)n, (size_t)mib);
    if (argc == 6 && strcmp(argv[1], "shim") == 0 && number(argv[4], 1, 64, &n) &&
        number(argv[5], 1, 1 << 20, &mib))
        return through_shim(argv[2], argv[3], (int)n, (size_t)mib);
    return usage();
}
