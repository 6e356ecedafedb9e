// launch_cost: what tiered spill's launch hook costs a launch-bound program.
// Eight 4 MiB buffers (tiered blocks under VRAMCAP_SPILL=tiered); an empty
// kernel taking four of them and a count is launched ITERS times on one
// stream, in ROUNDS timed rounds (synchronised after each). Prints the
// median wall time per launch over the rounds.
// Usage: launch_cost [ITERS [ROUNDS]]
// Prints "RESULT launches=N rounds=R median_ns_per_launch=T".
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common.cuh"

__global__ void k_empty(float *a, float *b, float *c, float *d, int n) {
    if (n < 0) a[threadIdx.x] = b[threadIdx.x] + c[threadIdx.x] + d[threadIdx.x];
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 200000;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    if (iters <= 0 || rounds <= 0) {
        fprintf(stderr, "usage: launch_cost [ITERS [ROUNDS]] (both positive; e.g. launch_cost 200000 5)\n");
        return 2;
    }
    float *buf[8];
    for (auto &b : buf) CHECK(cudaMalloc(&b, 4 << 20));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (int i = 0; i < 1000; i++) k_empty<<<1, 32, 0, s>>>(buf[i % 8], buf[(i + 1) % 8], buf[(i + 2) % 8], buf[(i + 3) % 8], 1);
    CHECK(cudaStreamSynchronize(s));
    std::vector<double> per;
    for (int r = 0; r < rounds; r++) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; i++)
            k_empty<<<1, 32, 0, s>>>(buf[i % 8], buf[(i + 1) % 8], buf[(i + 2) % 8], buf[(i + 3) % 8], 1);
        CHECK(cudaStreamSynchronize(s));
        auto t1 = std::chrono::steady_clock::now();
        per.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / iters);
    }
    CHECK(cudaGetLastError());
    std::sort(per.begin(), per.end());
    printf("RESULT launches=%d rounds=%d median_ns_per_launch=%.1f\n", iters, rounds, per[per.size() / 2]);
    for (auto &b : buf) CHECK(cudaFree(b));
    return 0;
}
