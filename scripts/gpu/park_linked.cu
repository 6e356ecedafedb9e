// park_linked.cu MIB — a program linked with -lcuda, as the GPU suite's
// parking row runs it (scripts/gpu/tests/test_park.py): it allocates MIB
// MiB with cuMemAlloc, fills it with a pattern, prints "IDLE pid=P" and
// waits for a line on stdin. A park finds it there. Then, with no other
// call first, it asks the driver about the allocation's address, calls
// the dynamic linker bound to the driver's exports (the shim's, where it
// exports them): cuPointerGetAttribute (device, range start),
// cuMemGetAddressRange and cuMemGetAccess; then it reads the pattern back
// and prints
//   RESULTKV rc_attr=.. dev=.. start_off=.. rc_range=.. base_off=..
//            size=.. rc_access=.. flags=.. same=0|1
// (offsets from the allocation's address; -1 where unanswered). Under the
// shim with parking, the first of these calls resumes the process.
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { printf("FAIL rc=%d at=%d\n", (int)r_, __LINE__); return 1; } } while (0)

int main(int argc, char **argv) {
    size_t bytes = (size_t)(argc > 1 ? atol(argv[1]) : 1024) << 20;
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUdeviceptr p;
    CK(cuMemAlloc(&p, bytes));
    CK(cuMemsetD32(p, 0x5eed, bytes / 4));
    CK(cuCtxSynchronize());
    printf("IDLE pid=%d\n", (int)getpid());
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin)) {
        // No line: go on as if one came.
    }
    CUdeviceptr at = p + 4096;
    int ordinal = -1;
    CUdeviceptr start = 0;
    CUresult rc_attr = cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, at);
    if (rc_attr == CUDA_SUCCESS) rc_attr = cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, at);
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult rc_range = cuMemGetAddressRange(&base, &size, at);
    unsigned long long flags = 0;
    CUmemLocation loc = {};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = 0;
    CUresult rc_access = cuMemGetAccess(&flags, &loc, at);
    unsigned int first = 0, last = 0;
    CK(cuMemcpyDtoH(&first, p, 4));
    CK(cuMemcpyDtoH(&last, p + bytes - 4, 4));
    printf("RESULTKV rc_attr=%d dev=%d start_off=%lld rc_range=%d base_off=%lld size=%zu rc_access=%d flags=%llu "
           "same=%d\n",
           (int)rc_attr, ordinal, start ? (long long)(start - p) : -1LL, (int)rc_range,
           base ? (long long)(base - p) : -1LL, size, (int)rc_access, flags, first == 0x5eed && last == 0x5eed);
    return 0;
}
