// bench_alloc: time allocate+free pairs through the driver API
// (cuMemAlloc_v2 + cuMemFree_v2, called directly, linked with -lcuda) and the
// runtime API (cudaMalloc + cudaFree) at 4 KiB, 1 MiB, 64 MiB and 1 GiB.
// Each pair is timed on its own with a steady clock, after a warm-up.
//
// Build: nvcc -O2 -arch=sm_90 -o bench_alloc bench_alloc.cu -lcuda
// Usage: bench_alloc [ITER_SCALE]   (ITER_SCALE: float multiplier on the iteration counts, default 1)
//
// Output (stdout), one line per API and size:
//   BENCH api=cuMemAlloc size=4096 iters=2000 median_us=.. mean_us=.. min_us=.. p90_us=..
//   INFO total=.. free=..   (cudaMemGetInfo, to show whether a cap is in force)
// Exit status 0 on success, 1 on any CUDA error (printed with its name).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common.cuh"

struct Stats {
    double median, mean, min, p90;
};

static Stats stats(std::vector<double> v) {
    Stats s = {0, 0, 0, 0};
    if (v.empty()) return s;
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    s.median = (n % 2) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += v[i];
    s.mean = sum / (double)n;
    s.min = v[0];
    s.p90 = v[std::min(n - 1, (size_t)((double)n * 0.9))];
    return s;
}

typedef std::chrono::steady_clock Clock;

// One allocate+free pair through the driver API; returns microseconds or -1 on error.
static double pair_driver(size_t size) {
    CUdeviceptr d = 0;
    Clock::time_point t0 = Clock::now();
    CUresult r = cuMemAlloc(&d, size);  // cuda.h maps cuMemAlloc to cuMemAlloc_v2
    if (r != CUDA_SUCCESS) {
        printf("ERROR call=cuMemAlloc size=%zu err=%d errname=%s\n", size, (int)r, drv_name(r));
        return -1;
    }
    r = cuMemFree(d);  // cuMemFree_v2
    Clock::time_point t1 = Clock::now();
    if (r != CUDA_SUCCESS) {
        printf("ERROR call=cuMemFree size=%zu err=%d errname=%s\n", size, (int)r, drv_name(r));
        return -1;
    }
    return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

static double pair_runtime(size_t size) {
    void *p = NULL;
    Clock::time_point t0 = Clock::now();
    cudaError_t e = cudaMalloc(&p, size);
    if (e != cudaSuccess) {
        printf("ERROR call=cudaMalloc size=%zu err=%d errname=%s\n", size, (int)e, rt_name(e));
        return -1;
    }
    e = cudaFree(p);
    Clock::time_point t1 = Clock::now();
    if (e != cudaSuccess) {
        printf("ERROR call=cudaFree size=%zu err=%d errname=%s\n", size, (int)e, rt_name(e));
        return -1;
    }
    return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

static int measure(const char *api, bool driver, size_t size, int warm, int iters) {
    for (int i = 0; i < warm; ++i) {
        double t = driver ? pair_driver(size) : pair_runtime(size);
        if (t < 0) return 1;
    }
    std::vector<double> v;
    v.reserve((size_t)iters);
    for (int i = 0; i < iters; ++i) {
        double t = driver ? pair_driver(size) : pair_runtime(size);
        if (t < 0) return 1;
        v.push_back(t);
    }
    Stats s = stats(v);
    printf("BENCH api=%s size=%zu iters=%d median_us=%.3f mean_us=%.3f min_us=%.3f p90_us=%.3f\n", api,
           size, iters, s.median, s.mean, s.min, s.p90);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    double scale = 1.0;
    if (argc >= 2) {
        scale = atof(argv[1]);
        if (!(scale > 0.0) || scale > 100.0) {
            fprintf(stderr, "bench_alloc: bad ITER_SCALE '%s'\n", argv[1]);
            return 2;
        }
    }
    cudaError_t e = cudaSetDevice(0);
    if (e == cudaSuccess) e = cudaFree(0);  // create and bind the primary context
    if (e != cudaSuccess) {
        printf("ERROR call=init err=%d errname=%s\n", (int)e, rt_name(e));
        return 1;
    }
    CUresult r = cuInit(0);
    if (r != CUDA_SUCCESS) {
        printf("ERROR call=cuInit err=%d errname=%s\n", (int)r, drv_name(r));
        return 1;
    }
    size_t free_b = 0, total_b = 0;
    e = cudaMemGetInfo(&free_b, &total_b);
    if (e != cudaSuccess) {
        printf("ERROR call=cudaMemGetInfo err=%d errname=%s\n", (int)e, rt_name(e));
        return 1;
    }
    printf("INFO total=%zu free=%zu\n", total_b, free_b);

    const size_t sizes[4] = {4096ull, 1ull << 20, 64ull << 20, 1ull << 30};
    const int iters[4] = {2000, 2000, 200, 50};
    const int warm[4] = {50, 50, 10, 3};
    for (int i = 0; i < 4; ++i) {
        int n = (int)((double)iters[i] * scale);
        if (n < 5) n = 5;
        if (measure("cuMemAlloc", true, sizes[i], warm[i], n) != 0) return 1;
        if (measure("cudaMalloc", false, sizes[i], warm[i], n) != 0) return 1;
    }
    printf("DONE\n");
    return 0;
}
