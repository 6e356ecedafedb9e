// What the real driver does with memory when its context goes, and with a
// second free, measured by the device's free memory (cuMemGetInfo in a
// context of its own) before and after. Run without the shim; the shim's
// teardown rules are meant to match what this prints.
//
//   teardown
// prints one line per case:
//   RESULT case=NAME before_mib=B held_mib=H after_mib=A released=0|1 [rc=...]
// and "RESULT case=double_free rc1=R1 rc2=R2". Exit 0 when every call that
// must succeed did.

#include <cuda.h>

#include <cstdio>
#include <cstdlib>

#define CK(call)                                                             \
    do {                                                                     \
        CUresult rc_ = (call);                                               \
        if (rc_ != CUDA_SUCCESS) {                                           \
            std::printf("ERROR %s -> %d line=%d\n", #call, (int)rc_, __LINE__); \
            std::exit(1);                                                    \
        }                                                                    \
    } while (0)

static const size_t MIB = 1 << 20;
static const size_t BYTES = 512 * MIB;

// The device's free memory, asked in a context of its own.
static size_t free_mib(CUdevice dev, CUcontext probe)
{
    size_t f = 0, t = 0;
    CK(cuCtxPushCurrent(probe));
    CK(cuMemGetInfo(&f, &t));
    CUcontext popped;
    CK(cuCtxPopCurrent(&popped));
    (void)dev;
    return f / MIB;
}

static void report(const char *name, size_t before, size_t held, size_t after)
{
    // Released when the free memory came back to within 64 MiB of before.
    int released = after + 64 >= before;
    std::printf("RESULT case=%s before_mib=%zu held_mib=%zu after_mib=%zu released=%d\n",
                name, before, held, after, released);
}

enum Kind { PLAIN, ASYNC, ARRAY };

static void allocate(Kind k)
{
    if (k == PLAIN) {
        CUdeviceptr p;
        CK(cuMemAlloc(&p, BYTES));
    } else if (k == ASYNC) {
        CUdeviceptr p;
        CK(cuMemAllocAsync(&p, BYTES, 0));
        CK(cuStreamSynchronize(0));
    } else {
        CUDA_ARRAY_DESCRIPTOR d = {};
        d.Width = 8192;
        d.Height = BYTES / (8192 * 16);
        d.Format = CU_AD_FORMAT_FLOAT;
        d.NumChannels = 4;
        CUarray a;
        CK(cuArrayCreate(&a, &d));
    }
}

int main()
{
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext probe;
    CUctxCreateParams params = {};
    CK(cuCtxCreate(&probe, &params, 0, dev));
    CUcontext popped;
    CK(cuCtxPopCurrent(&popped));

    const char *names[3] = {"plain", "async", "array"};
    // A context of its own, destroyed with the allocation live.
    for (int k = PLAIN; k <= ARRAY; k++) {
        size_t before = free_mib(dev, probe);
        CUcontext c;
        CK(cuCtxCreate(&c, &params, 0, dev));
        allocate((Kind)k);
        size_t held = free_mib(dev, probe);
        CK(cuCtxDestroy(c));
        char name[64];
        std::snprintf(name, sizeof name, "ctx_destroy_%s", names[k]);
        report(name, before, before - held, free_mib(dev, probe));
    }
    // The primary context, reset with the allocation live.
    for (int k = PLAIN; k <= ARRAY; k++) {
        size_t before = free_mib(dev, probe);
        CUcontext pc;
        CK(cuDevicePrimaryCtxRetain(&pc, dev));
        CK(cuCtxPushCurrent(pc));
        allocate((Kind)k);
        CK(cuCtxPopCurrent(&popped));
        size_t held = free_mib(dev, probe);
        CK(cuDevicePrimaryCtxReset(dev));
        char name[64];
        std::snprintf(name, sizeof name, "primary_reset_%s", names[k]);
        report(name, before, before - held, free_mib(dev, probe));
        CK(cuDevicePrimaryCtxRelease(dev));
    }
    // A second free of the same pointer.
    CK(cuCtxPushCurrent(probe));
    CUdeviceptr p;
    CK(cuMemAlloc(&p, MIB));
    CUresult rc1 = cuMemFree(p);
    CUresult rc2 = cuMemFree(p);
    CK(cuMemAlloc(&p, MIB));
    CUresult rc3 = cuMemFreeAsync(p, 0);
    CK(cuStreamSynchronize(0));
    CUresult rc4 = cuMemFreeAsync(p, 0);
    CUresult rc5 = cuStreamSynchronize(0);
    std::printf("RESULT case=double_free rc1=%d rc2=%d async_rc1=%d async_rc2=%d sync=%d\n",
                (int)rc1, (int)rc2, (int)rc3, (int)rc4, (int)rc5);
    return 0;
}
