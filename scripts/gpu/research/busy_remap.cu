// busy_remap.cu — whether the driver's VMM calls and a copy on a stream of
// their own wait for unrelated work still running (issue 44: a stop drains
// the GPU before it remaps; if the VMM calls do not wait for work that does
// not touch the range, a stop whose blocks no work in flight names needs
// no drain). Without the shim. A kernel spins for about 300 ms on one
// non-blocking stream and touches nothing else; meanwhile the host times,
// on a range that kernel never touches:
//   unmap, map, access    cuMemUnmap / cuMemMap / cuMemSetAccess
//   create, release       cuMemCreate / cuMemRelease of device memory
//   copy_dd, copy_hd      a 256 MiB cuMemcpyDtoDAsync on another
//                         non-blocking stream, device to device and from
//                         host (VMM host memory) to device, timed to its
//                         completion
//   copy_after            the same copy made to wait (cuStreamWaitEvent) for
//                         an event recorded after the spin: it ends after it
// and prints, for each, "BUSYREMAP op=NAME ms=X spinning=0|1" (spinning:
// whether the kernel was still running when the call returned or the copy
// completed). A call that waits for the kernel shows ms near the spin's.
// At most 1 GiB of device memory and 256 MiB of host memory.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <time.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_ = 0; cuGetErrorName(r_, &s_); printf("BUSYREMAP fail=%s at=%d\n", s_ ? s_ : "?", __LINE__); return 1; } } while (0)

static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

__global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
}

static CUmemAllocationProp prop(bool host) {
    CUmemAllocationProp p = {};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = host ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    return p;
}

// Memory of `bytes` on the host or the device, mapped for device 0 at a
// fresh address.
static int mapped(size_t bytes, bool host, CUdeviceptr *va, CUmemGenericAllocationHandle *h) {
    CUmemAllocationProp p = prop(host);
    CUmemAccessDesc acc = {};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemCreate(h, bytes, &p, 0));
    CK(cuMemAddressReserve(va, bytes, 0, 0, 0));
    CK(cuMemMap(*va, bytes, 0, *h, 0));
    CK(cuMemSetAccess(*va, bytes, &acc, 1));
    return 0;
}

// Starts the spin on `s`: `cycles` long.
static void start_spin(CUstream s, long long cycles) {
    spin<<<1, 1, 0, (cudaStream_t)s>>>(cycles);
}

static int spinning(CUstream s) { return cuStreamQuery(s) == CUDA_ERROR_NOT_READY; }

int main() {
    if (cudaFree(0) != cudaSuccess) {
        printf("BUSYREMAP fail=no-device\n");
        return 1;
    }
    CUstream s1, s2;
    CK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    // Calibrate: 10^8 cycles, then scale to about 300 ms.
    double t0 = now();
    start_spin(s1, 100000000LL);
    CK(cuStreamSynchronize(s1));
    double per = (now() - t0) / 1e8;
    long long cycles = (long long)(0.3 / per);
    t0 = now();
    start_spin(s1, cycles);
    CK(cuStreamSynchronize(s1));
    printf("BUSYREMAP op=spin_alone ms=%.2f spinning=0\n", (now() - t0) * 1e3);

    const size_t bytes = 256u << 20;
    CUmemAccessDesc acc = {};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUdeviceptr a, b, h;
    CUmemGenericAllocationHandle ha, hb, hh;
    if (mapped(bytes, false, &a, &ha) || mapped(bytes, false, &b, &hb) || mapped(bytes, true, &h, &hh))
        return 1;
    CK(cuMemsetD8(a, 1, bytes));
    CK(cuMemsetD8(b, 2, bytes));
    CK(cuMemsetD8(h, 3, bytes));
    CK(cuCtxSynchronize());

    // The VMM calls, each with the kernel spinning afresh.
    CUmemAllocationProp pd = prop(false);
    CUmemGenericAllocationHandle spare;
    CK(cuMemCreate(&spare, bytes, &pd, 0));
    struct { const char *name; int op; } ops[] = {
        {"unmap", 0}, {"map", 1}, {"access", 2}, {"create", 3}, {"release", 4},
    };
    CUmemGenericAllocationHandle made = 0;
    for (int i = 0; i < 5; i++) {
        start_spin(s1, cycles);
        double a0 = now();
        switch (ops[i].op) {
        case 0: CK(cuMemUnmap(a, bytes)); break;
        case 1: CK(cuMemMap(a, bytes, 0, spare, 0)); break;
        case 2: CK(cuMemSetAccess(a, bytes, &acc, 1)); break;
        case 3: CK(cuMemCreate(&made, bytes, &pd, 0)); break;
        case 4: CK(cuMemRelease(ha)); break;
        }
        double ms = (now() - a0) * 1e3;
        printf("BUSYREMAP op=%s ms=%.3f spinning=%d\n", ops[i].name, ms, spinning(s1));
        CK(cuStreamSynchronize(s1));
    }
    CK(cuMemRelease(made));

    // Copies on a stream of their own while the kernel spins: to completion.
    struct { const char *name; CUdeviceptr src; } copies[] = {{"copy_dd", b}, {"copy_hd", h}};
    for (int i = 0; i < 2; i++) {
        start_spin(s1, cycles);
        double c0 = now();
        CK(cuMemcpyDtoDAsync(a, copies[i].src, bytes, s2));
        CK(cuStreamSynchronize(s2));
        double ms = (now() - c0) * 1e3;
        printf("BUSYREMAP op=%s ms=%.3f spinning=%d\n", copies[i].name, ms, spinning(s1));
        CK(cuStreamSynchronize(s1));
    }
    // The same copy ordered after the spin by an event: it must end after it.
    CUevent ev;
    CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    start_spin(s1, cycles);
    double e0 = now();
    CK(cuEventRecord(ev, s1));
    CK(cuStreamWaitEvent(s2, ev, 0));
    CK(cuMemcpyDtoDAsync(a, b, bytes, s2));
    CK(cuStreamSynchronize(s2));
    printf("BUSYREMAP op=copy_after ms=%.3f spinning=%d\n", (now() - e0) * 1e3, spinning(s1));
    CK(cuStreamSynchronize(s1));

    unsigned char probe[2] = {0, 0};
    CK(cuMemcpyDtoH(probe, a + bytes - 2, 2));
    printf("BUSYREMAP data=%s\n", probe[0] == 2 && probe[1] == 2 ? "ok" : "wrong");
    CK(cuEventDestroy(ev));
    CK(cuMemUnmap(a, bytes));
    CK(cuMemUnmap(b, bytes));
    CK(cuMemUnmap(h, bytes));
    CK(cuMemRelease(spare));
    CK(cuMemRelease(hb));
    CK(cuMemRelease(hh));
    CK(cuMemAddressFree(a, bytes));
    CK(cuMemAddressFree(b, bytes));
    CK(cuMemAddressFree(h, bytes));
    return 0;
}
