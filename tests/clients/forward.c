/*
 * forward.c - the forwarders' test client (tests/forward.rs): looks driver
 * functions up through dlsym on the driver's handle and through
 * cuGetProcAddress_v2, says what each answer is, and calls them.
 *
 *   forward          the lookups and the calls below, then exit
 *   forward wait     the same, then "ready"; then, per line on stdin
 *                    (a call below), "calling WHAT" and
 *                    the call's line; end of input ends it
 *
 * Lookups, one line each, for NAME in the list below:
 *   "resolve NAME dlsym=K again=same|other procaddr=K again=same|other
 *    equal=yes|no"
 * K is what the first lookup answered: "real" (the driver's export of
 * that name), "internal" (another address in the driver), "hook" (the
 * shim's export of that name), "forwarder" (another address in
 * the shim), "null" or "other"; again: whether a second lookup answered
 * the same address; equal: whether dlsym's and cuGetProcAddress's answers
 * are one address.
 *
 * Calls (through cuGetProcAddress's answer unless said), one line each:
 *   init    cuInit(0), device 0's primary context current, the stand-in's
 *           module loaded, 1 MiB allocated (cuMemAlloc) -> "init -> RC"
 *   ctxdev  cuCtxGetDevice -> "ctxdev -> RC dev=D"
 *   capturing  cuStreamIsCapturing of the legacy stream -> "capturing -> RC
 *           status=S" (wait mode only)
 *   name    cuDeviceGetName (dlsym's answer) -> "name -> RC NAME"
 *   launch  cuLaunchKernel of touch1, grid 3x5x7, block 11x13x17, 19 shared
 *           bytes, on the per-thread stream (0x2) -> "launch -> RC
 *           dims=G,G,G,B,B,B shared=S stream=0xS" (what the stand-in got)
 *   clamp   cuTexRefSetMipmapLevelClamp(0x10, 0.5, -1.25) and the Get
 *           (dlsym's answers) -> "clamp -> RC RC min=M max=M"
 *   dark    through the export tables (below): the stand-in's mix(7, 2.5,
 *           3) and context-local storage's mix(1, 0.5, 2), then calls()
 *           -> "dark -> RC RC out=O,O calls=N"
 *   atexit-dark  registers an exit handler that prints "dark at exit",
 *           then makes the dark call -> "atexit-dark -> registered"
 *
 * Export tables (cuGetExportTable through cuGetProcAddress's answer), after
 * the lookups, one line each for the stand-in's three (STANDIN, CLS,
 * INTEGRITY; tests/standin/cuda_standin.c):
 *   "table NAME -> RC at=K slots=K,K,.." (at: the table's own address;
 *   a slot is "size" for a size word, else K as above)
 */
#define _GNU_SOURCE /* dladdr */
#include "cuda_subset.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *g_driver;
static PFN_cuGetProcAddress_v2 g_gpa;

static const char *kind(const char *name, void *p)
{
    if (p == NULL)
        return "null";
    Dl_info info;
    if (dladdr(p, &info) == 0 || info.dli_fname == NULL)
        return "other";
    if (strstr(info.dli_fname, "libcuda.so") != NULL)
        return info.dli_saddr == p && info.dli_sname != NULL &&
                       strcmp(info.dli_sname, name) == 0
                   ? "real"
                   : "internal";
    if (strstr(info.dli_fname, "libvramcap.so") == NULL)
        return "other";
    if (info.dli_saddr == p && info.dli_sname != NULL &&
        strcmp(info.dli_sname, name) == 0)
        return "hook";
    return "forwarder";
}

static void *by_dlsym(const char *name)
{
    return dlsym(g_driver, name);
}

/* The base name's pointer at CUDA 12.0, legacy default stream (flags 0). */
static void *by_procaddr(const char *base)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (g_gpa(base, &p, 12000, 0, &st) != CUDA_SUCCESS)
        return NULL;
    return p;
}

/* Exported name for dlsym, base name for cuGetProcAddress. */
static const char *const g_names[][2] = {
    { "cuCtxGetDevice", "cuCtxGetDevice" },
    { "cuDeviceGetName", "cuDeviceGetName" },
    { "cuCtxGetCurrent", "cuCtxGetCurrent" },
    { "cuLaunchKernel", "cuLaunchKernel" },
    { "cuMemAlloc_v2", "cuMemAlloc" },
    { "cuTexRefSetMipmapLevelClamp", "cuTexRefSetMipmapLevelClamp" },
};

typedef CUresult (*export_table_fn)(const void **, const CUuuid *);
typedef CUresult (*dark_mix_fn)(int, double, long long, long long *);
typedef void (*dark_calls_fn)(unsigned long *);

static const struct {
    const char *name;
    CUuuid id;
} g_tables[] = {
    { "standin", { "vramcap standin" } },
    { "cls",
      { { (char)0xc6, (char)0x93, 0x33, 0x6e, 0x11, 0x21, (char)0xdf, 0x11,
          (char)0xa8, (char)0xc3, 0x68, (char)0xf3, 0x55, (char)0xd8,
          (char)0x95, (char)0x93 } } },
    { "integrity",
      { { (char)0xd4, 0x08, 0x20, 0x55, (char)0xbd, (char)0xe6, 0x70, 0x4b,
          (char)0x8d, 0x34, (char)0xba, 0x12, 0x3c, 0x66, (char)0xe1,
          (char)0xf2 } } },
};
static const void *const *g_table[3];

static void tables(void)
{
    export_table_fn get = (export_table_fn)by_procaddr("cuGetExportTable");
    for (size_t i = 0; i < 3; i++) {
        const void *t = NULL;
        CUresult rc = get != NULL ? get(&t, &g_tables[i].id) : CUDA_ERROR_NOT_FOUND;
        g_table[i] = t;
        printf("table %s -> %d at=%s slots=", g_tables[i].name, rc, kind("", (void *)t));
        if (t != NULL) {
            const void *const *w = t;
            uintptr_t first = (uintptr_t)w[0];
            size_t n = first < 0x10000 ? first / sizeof(void *) : 0;
            for (size_t k = 0; n != 0 ? k < n : w[k] != NULL; k++)
                printf("%s%s", k == 0 ? "" : ",",
                       k == 0 && n != 0 ? "size" : kind("", (void *)w[k]));
        }
        printf("\n");
    }
    fflush(stdout);
}

static void resolve_all(void)
{
    for (size_t i = 0; i < sizeof g_names / sizeof g_names[0]; i++) {
        const char *exported = g_names[i][0], *base = g_names[i][1];
        void *d1 = by_dlsym(exported), *d2 = by_dlsym(exported);
        void *p1 = by_procaddr(base), *p2 = by_procaddr(base);
        printf("resolve %s dlsym=%s again=%s procaddr=%s again=%s "
               "equal=%s\n",
               exported, kind(exported, d1), d1 == d2 ? "same" : "other",
               kind(exported, p1), p1 == p2 ? "same" : "other",
               d1 == p1 ? "yes" : "no");
    }
    fflush(stdout);
}

typedef CUresult (*ctx_get_device_fn)(CUdevice *);
typedef CUresult (*is_capturing_fn)(CUstream, CUstreamCaptureStatus *);
typedef CUresult (*device_get_name_fn)(char *, int, CUdevice);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned,
                              unsigned, unsigned, unsigned, unsigned, CUstream,
                              void **, void **);
typedef CUresult (*set_clamp_fn)(CUtexref, float, float);
typedef CUresult (*get_clamp_fn)(float *, float *, CUtexref);

static CUfunction g_touch1;

/* The functions called, looked up once before any call (a lookup made
 * while the gate is closed would wait in the resolver's hook instead). */
static ctx_get_device_fn g_ctx_get_device;
static is_capturing_fn g_is_capturing;
static device_get_name_fn g_device_get_name;
static launch_fn g_launch;
static set_clamp_fn g_set_clamp;
static get_clamp_fn g_get_clamp;

static void init(void)
{
    CUresult (*cu_init)(unsigned) = (CUresult(*)(unsigned))by_procaddr("cuInit");
    CUresult (*retain)(CUcontext *, CUdevice) =
        (CUresult(*)(CUcontext *, CUdevice))by_procaddr("cuDevicePrimaryCtxRetain");
    CUresult (*set_current)(CUcontext) =
        (CUresult(*)(CUcontext))by_procaddr("cuCtxSetCurrent");
    CUresult (*load)(CUmodule *, const void *) =
        (CUresult(*)(CUmodule *, const void *))by_procaddr("cuModuleLoadData");
    CUresult (*get_function)(CUfunction *, CUmodule, const char *) =
        (CUresult(*)(CUfunction *, CUmodule, const char *))by_procaddr(
            "cuModuleGetFunction");
    CUcontext ctx = NULL;
    CUmodule mod = NULL;
    CUresult rc = cu_init(0);
    if (rc == CUDA_SUCCESS)
        rc = retain(&ctx, 0);
    if (rc == CUDA_SUCCESS)
        rc = set_current(ctx);
    if (rc == CUDA_SUCCESS)
        rc = load(&mod, "image");
    if (rc == CUDA_SUCCESS)
        rc = get_function(&g_touch1, mod, "touch1");
    /* One allocation, kept: the shim's background thread (which parks)
     * starts with a process's first. */
    CUresult (*alloc)(CUdeviceptr *, size_t) =
        (CUresult(*)(CUdeviceptr *, size_t))by_procaddr("cuMemAlloc");
    CUdeviceptr kept = 0;
    if (rc == CUDA_SUCCESS)
        rc = alloc(&kept, 1 << 20);
    g_ctx_get_device = (ctx_get_device_fn)by_procaddr("cuCtxGetDevice");
    g_is_capturing = (is_capturing_fn)by_procaddr("cuStreamIsCapturing");
    g_device_get_name = (device_get_name_fn)by_dlsym("cuDeviceGetName");
    g_launch = (launch_fn)by_procaddr("cuLaunchKernel");
    g_set_clamp = (set_clamp_fn)by_dlsym("cuTexRefSetMipmapLevelClamp");
    g_get_clamp = (get_clamp_fn)by_dlsym("cuTexRefGetMipmapLevelClamp");
    printf("init -> %d\n", rc);
    fflush(stdout);
}

static void call(const char *what);

static void dark_at_exit(void)
{
    printf("dark at exit\n");
    fflush(stdout);
    call("dark");
}

static void call(const char *what)
{
    if (strcmp(what, "ctxdev") == 0) {
        CUdevice dev = -1;
        CUresult rc = g_ctx_get_device(&dev);
        printf("ctxdev -> %d dev=%d\n", rc, dev);
    } else if (strcmp(what, "capturing") == 0) {
        CUstreamCaptureStatus status = -1;
        CUresult rc = g_is_capturing((CUstream)0x1, &status);
        printf("capturing -> %d status=%d\n", rc, (int)status);
    } else if (strcmp(what, "name") == 0) {
        char name[64] = "";
        CUresult rc = g_device_get_name(name, (int)sizeof name, 0);
        printf("name -> %d %s\n", rc, name);
    } else if (strcmp(what, "launch") == 0) {
        unsigned long long word = 0;
        void *params[] = { &word };
        CUresult rc = g_launch(g_touch1, 3, 5, 7, 11, 13, 17, 19, (CUstream)0x2, params, NULL);
        unsigned dims[7];
        CUstream stream;
        vramcap_standin_last_launch(dims, &stream);
        printf("launch -> %d dims=%u,%u,%u,%u,%u,%u shared=%u stream=%p\n", rc,
               dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6],
               (void *)stream);
    } else if (strcmp(what, "clamp") == 0) {
        CUtexref tex = (CUtexref)0x10;
        float lo = 0, hi = 0;
        CUresult set = g_set_clamp(tex, 0.5f, -1.25f);
        CUresult get = g_get_clamp(&lo, &hi, tex);
        printf("clamp -> %d %d min=%g max=%g\n", set, get, lo, hi);
    } else if (strcmp(what, "dark") == 0 && (g_table[0] == NULL || g_table[1] == NULL)) {
        printf("dark -> unavailable\n");
    } else if (strcmp(what, "dark") == 0) {
        long long a = 0, b = 0;
        unsigned long n = 0;
        CUresult r1 = ((dark_mix_fn)g_table[0][1])(7, 2.5, 3, &a);
        CUresult r2 = ((dark_mix_fn)g_table[1][0])(1, 0.5, 2, &b);
        ((dark_calls_fn)g_table[0][2])(&n);
        printf("dark -> %d %d out=%lld,%lld calls=%lu\n", r1, r2, a, b, n);
    } else if (strcmp(what, "atexit-dark") == 0) {
        atexit(dark_at_exit);
        printf("atexit-dark -> registered\n");
    } else {
        printf("unknown call %s\n", what);
    }
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int wait = argc > 1 && strcmp(argv[1], "wait") == 0;
    if (argc > 2 || (argc == 2 && !wait)) {
        fprintf(stderr, "usage: forward [wait]\n");
        return 2;
    }
    g_driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (g_driver == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    g_gpa = (PFN_cuGetProcAddress_v2)dlsym(g_driver, "cuGetProcAddress_v2");
    if (g_gpa == NULL) {
        fprintf(stderr, "no cuGetProcAddress_v2\n");
        return 1;
    }
    resolve_all();
    tables();
    init();
    if (!wait) {
        const char *calls[] = { "ctxdev", "name", "launch", "clamp", "dark" };
        for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++)
            call(calls[i]);
        return 0;
    }
    printf("ready\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        printf("calling %s\n", line);
        fflush(stdout);
        call(line);
    }
    return 0;
}
