// hit_calls.cu — what each driver call a cache hit makes costs on the real
// driver (issue 41: the shim's cache-hit pair is 0.8 µs on the H200, the
// goal 0.7; scripts/bench-hit-path.sh counts the shim's own instructions,
// and lists these calls per pair: cuCtxGetCurrent, cuCtxGetDevice,
// cuCtxGetId, cuStreamIsCapturing and cuEventRecord on the legacy stream).
// Without the shim. Each call is timed over N calls (default 200000),
// five rounds, and the median round printed:
//   HITCALL call=NAME ns=X
// The event is recorded on an idle GPU (nothing queued), as in the pair.
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <algorithm>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { printf("HITCALL fail=%d at=%d\n", (int)r_, __LINE__); exit(1); } } while (0)

static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

template <typename F> static void time_it(const char *name, long n, F f) {
    double r[5];
    for (int k = 0; k < 5; k++) {
        double t0 = now();
        for (long i = 0; i < n; i++)
            f();
        r[k] = (now() - t0) / n * 1e9;
    }
    std::sort(r, r + 5);
    printf("HITCALL call=%s ns=%.1f\n", name, r[2]);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUevent ev;
    CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    CUdeviceptr p;
    CK(cuMemAlloc(&p, 1 << 20));
    time_it("cuCtxGetCurrent", n, [&] { CUcontext c; cuCtxGetCurrent(&c); });
    time_it("cuCtxGetDevice", n, [&] { CUdevice d; cuCtxGetDevice(&d); });
    time_it("cuCtxGetId", n, [&] { unsigned long long id; cuCtxGetId(ctx, &id); });
    time_it("cuStreamIsCapturing", n, [&] { CUstreamCaptureStatus s; cuStreamIsCapturing(CU_STREAM_LEGACY, &s); });
    time_it("cuEventRecord", n, [&] { cuEventRecord(ev, CU_STREAM_LEGACY); });
    CK(cuCtxSynchronize());
    time_it("cuEventQuery", n, [&] { cuEventQuery(ev); });
    time_it("cuMemsetD8Async", n / 10, [&] { cuMemsetD8Async(p, 0, 256, CU_STREAM_LEGACY); });
    CK(cuCtxSynchronize());
    printf("HITCALL done=1\n");
    return 0;
}
