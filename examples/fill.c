/*
 * fill: allocate device memory in chunks until the driver (or vramcap's cap)
 * refuses, print what the program saw, give it all back.
 *
 * It reaches the driver the way the CUDA runtime does: dlopen libcuda.so.1,
 * look up cuGetProcAddress_v2, ask it for itself, and resolve every other
 * function through it. Build: cc -O2 -o fill examples/fill.c -ldl
 * Usage: fill [CHUNK_MIB] (default 256). Exit: 0 after a refusal, 3 without a
 * usable driver, 1 on any other error.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef CUresult (*GetProc)(const char *, void **, int, unsigned long long, int *);

static GetProc get_proc;

static void *resolve(const char *name, int version) {
    void *p = NULL;
    if (get_proc(name, &p, version, 0, NULL) != 0 || p == NULL) {
        fprintf(stderr, "fill: the driver has no %s\n", name);
        exit(3);
    }
    return p;
}

int main(int argc, char **argv) {
    size_t chunk_mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    if (chunk_mib == 0) {
        fprintf(stderr, "usage: fill [CHUNK_MIB]\n");
        return 64;
    }
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (h == NULL) {
        fprintf(stderr, "fill: no CUDA driver: %s\n", dlerror());
        return 3;
    }
    GetProc first = (GetProc)dlsym(h, "cuGetProcAddress_v2");
    if (first == NULL) {
        fprintf(stderr, "fill: the driver has no cuGetProcAddress_v2\n");
        return 3;
    }
    /* Like cudart: from here on, only the resolver the resolver hands back. */
    get_proc = first;
    get_proc = (GetProc)resolve("cuGetProcAddress", 12000);

    CUresult (*cuInit)(unsigned) = resolve("cuInit", 2000);
    CUresult (*cuDeviceGet)(int *, int) = resolve("cuDeviceGet", 2000);
    CUresult (*cuDeviceGetName)(char *, int, int) = resolve("cuDeviceGetName", 2000);
    CUresult (*retain)(CUcontext *, int) = resolve("cuDevicePrimaryCtxRetain", 7000);
    CUresult (*set_current)(CUcontext) = resolve("cuCtxSetCurrent", 4000);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t) = resolve("cuMemAlloc", 3020);
    CUresult (*mem_free)(CUdeviceptr) = resolve("cuMemFree", 3020);
    CUresult (*mem_info)(size_t *, size_t *) = resolve("cuMemGetInfo", 3020);
    CUresult (*error_name)(CUresult, const char **) = resolve("cuGetErrorName", 6000);

    int dev = 0;
    CUcontext ctx = NULL;
    char name[256] = "?";
    if (cuInit(0) != 0 || cuDeviceGet(&dev, 0) != 0 || retain(&ctx, dev) != 0 || set_current(ctx) != 0) {
        fprintf(stderr, "fill: no usable GPU (cuInit or context creation failed)\n");
        return 3;
    }
    cuDeviceGetName(name, sizeof name, dev);
    size_t free_b = 0, total_b = 0;
    mem_info(&free_b, &total_b);
    printf("device 0: %s\n", name);
    printf("cuMemGetInfo before: total %.2f GiB, free %.2f GiB\n", total_b / 1073741824.0, free_b / 1073741824.0);

    size_t chunk = chunk_mib << 20, count = 0, cap = 1 << 16;
    CUdeviceptr *held = malloc(cap * sizeof *held);
    CUresult rc = 0;
    while (held != NULL && count < cap) {
        rc = mem_alloc(&held[count], chunk);
        if (rc != 0)
            break;
        count++;
    }
    const char *rc_name = "?";
    error_name(rc, &rc_name);
    printf("allocated %zu x %zu MiB = %.2f GiB, then cuMemAlloc returned %d (%s)\n", count, chunk_mib,
           (double)(count * chunk) / 1073741824.0, rc, rc_name);
    mem_info(&free_b, &total_b);
    printf("cuMemGetInfo when full: total %.2f GiB, free %.2f GiB\n", total_b / 1073741824.0, free_b / 1073741824.0);
    for (size_t i = 0; i < count; i++) {
        if (mem_free(held[i]) != 0) {
            fprintf(stderr, "fill: cuMemFree failed\n");
            return 1;
        }
    }
    free(held);
    return rc == 2 ? 0 : 1;
}
