// bench_live: what a cap that changes while the program runs costs an
// allocation, side by side in ONE process (issue 14). Run under
// LD_PRELOAD=libvramcap.so VRAMCAP_LIMIT=CAP.
//
// Blocks of cuMemAlloc_v2+cuMemFree_v2 pairs (SIZE bytes, each pair timed on
// its own) alternate between two phases, ROUNDS times each, order flipped
// every round:
//   fixed     nothing changes the cap
//   changing  a second thread calls vramcap_set_limit(0, …) every
//             PERIOD_US microseconds, alternating CAP and CAP - 64 MiB
// and reports the median pair of each phase, their ratio, how many changes
// the thread made during the changing blocks, and the median time of one
// vramcap_set_limit call (it returns once no allocation granted under the
// old cap is still in flight).
//
// Usage: bench_live [SIZE] [PAIRS_PER_BLOCK] [ROUNDS] [PERIOD_US]
//        (defaults 1048576 20000 6 20)
// Output: "LIVE size=… pairs=… fixed_median_us=… changing_median_us=…
//          ratio=… changes=… set_limit_median_us=…". Exit 1 on any error,
// also when vramcap_set_limit is not found (not run under the shim).
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "common.cuh"

typedef int (*SetFn)(int, uint64_t);
typedef uint64_t (*GetFn)(int);
typedef std::chrono::steady_clock Clock;

static double us_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

static double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return (n % 2) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int block(size_t size, int pairs, std::vector<double> &out) {
    for (int i = 0; i < pairs; ++i) {
        CUdeviceptr d = 0;
        Clock::time_point t0 = Clock::now();
        CUresult r = cuMemAlloc(&d, size);
        if (r == CUDA_SUCCESS) r = cuMemFree(d);
        double t = us_since(t0);
        if (r != CUDA_SUCCESS) {
            printf("ERROR pair size=%zu err=%d errname=%s\n", size, (int)r, drv_name(r));
            return 1;
        }
        out.push_back(t);
    }
    return 0;
}

int main(int argc, char **argv) {
    size_t size = argc > 1 ? strtoull(argv[1], NULL, 10) : (1u << 20);
    int pairs = argc > 2 ? atoi(argv[2]) : 20000;
    int rounds = argc > 3 ? atoi(argv[3]) : 6;
    int period = argc > 4 ? atoi(argv[4]) : 20;
    SetFn set = (SetFn)dlsym(RTLD_DEFAULT, "vramcap_set_limit");
    GetFn get = (GetFn)dlsym(RTLD_DEFAULT, "vramcap_get_limit");
    if (set == NULL || get == NULL) {
        printf("ERROR vramcap_set_limit not found: run under LD_PRELOAD=libvramcap.so\n");
        return 1;
    }
    CHECK(cudaFree(0));  // a context, so that device 0's cap is worked out
    std::vector<double> warm;
    if (block(size, 200, warm)) return 1;
    uint64_t cap = get(0);
    if (cap == UINT64_MAX || cap < (256u << 20)) {
        printf("ERROR cap of device 0 is %llu: run with VRAMCAP_LIMIT of at least 256 MiB\n",
               (unsigned long long)cap);
        return 1;
    }
    std::vector<double> fixed, changing, sets;
    std::atomic<bool> run(false), quit(false);
    std::atomic<long> changes(0);
    std::thread changer([&] {
        bool low = false;
        while (!quit.load()) {
            if (!run.load()) {
                std::this_thread::yield();
                continue;
            }
            low = !low;
            Clock::time_point t0 = Clock::now();
            int rc = set(0, low ? cap - (64u << 20) : cap);
            double t = us_since(t0);
            if (rc != 0) {
                printf("ERROR vramcap_set_limit rc=%d\n", rc);
                exit(1);
            }
            sets.push_back(t);
            changes.fetch_add(1);
            std::this_thread::sleep_for(std::chrono::microseconds(period));
        }
        set(0, cap);
    });
    int rc = 0;
    for (int r = 0; r < rounds && rc == 0; ++r) {
        for (int k = 0; k < 2 && rc == 0; ++k) {
            bool live = (k == 0) == (r % 2 == 0);
            if (live) {
                long before = changes.load();
                run.store(true);
                while (changes.load() == before) std::this_thread::yield();
                rc = block(size, pairs, changing);
                run.store(false);
            } else {
                rc = block(size, pairs, fixed);
            }
        }
    }
    quit.store(true);
    changer.join();
    if (rc) return 1;
    double f = median(fixed), c = median(changing);
    printf("LIVE size=%zu pairs=%zu fixed_median_us=%.3f changing_median_us=%.3f ratio=%.3f "
           "changes=%ld set_limit_median_us=%.2f cap=%llu\n",
           size, fixed.size(), f, c, f > 0 ? c / f : 0, changes.load(), median(sets),
           (unsigned long long)cap);
    return 0;
}
