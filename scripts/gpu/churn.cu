// churn: a cudaMalloc/cudaFree-heavy program, as older libraries and
// per-request servers are: every iteration allocates two 1 MiB buffers,
// runs three small kernels on them and frees them. Prints the wall time and
// a checksum of what the kernels computed, so runs with and without the
// shim's cache can be compared for speed and for identical results.
// Usage: churn [ITERATIONS [nbstream|once]]   Prints "RESULT iters=N ms=T checksum=C".
// With "nbstream" it first creates a non-blocking stream it never uses: the
// shim's cache then waits for a synchronisation before each burst of reuse
// (as it must once such a stream exists), instead of ordering the reuse with
// an event on the legacy stream.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common.cuh"

__global__ void k_fill(unsigned *a, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        a[i] = (unsigned)(i * 2654435761u) ^ seed;
}

__global__ void k_mix(unsigned *b, const unsigned *a, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        b[i] = a[(i * 7 + seed) % n] * 3u + seed;
}

__global__ void k_sum(unsigned long long *acc, const unsigned *b, size_t n, unsigned seed) {
    unsigned long long s = 0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x * 64) s += b[(i + seed) % n];
    atomicAdd(acc, s);
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 5000;
    cudaStream_t unused = NULL;
    if (argc > 2 && argv[2][0] == 'n') CHECK(cudaStreamCreateWithFlags(&unused, cudaStreamNonBlocking));
    const size_t bytes = 1 << 20, n = bytes / sizeof(unsigned);
    unsigned long long *acc = NULL;
    CHECK(cudaMalloc(&acc, sizeof *acc));
    CHECK(cudaMemset(acc, 0, sizeof *acc));
    CHECK(cudaDeviceSynchronize());
    // "once": the two buffers allocated once, outside the loop: the same
    // kernels without any allocation, the floor the cache can approach.
    const bool once = argc > 2 && strcmp(argv[2], "once") == 0;
    unsigned *keep_a = NULL, *keep_b = NULL;
    if (once) {
        CHECK(cudaMalloc(&keep_a, bytes));
        CHECK(cudaMalloc(&keep_b, bytes));
    }
    auto t0 = std::chrono::steady_clock::now();
    for (int it = 0; it < iters; ++it) {
        unsigned *a = keep_a, *b = keep_b;
        if (!once) {
            CHECK(cudaMalloc(&a, bytes));
            CHECK(cudaMalloc(&b, bytes));
        }
        k_fill<<<64, 256>>>(a, n, (unsigned)it);
        k_mix<<<64, 256>>>(b, a, n, (unsigned)it);
        k_sum<<<1, 256>>>(acc, b, n, (unsigned)it);
        if (!once) {
            CHECK(cudaFree(a));
            CHECK(cudaFree(b));
        }
    }
    CHECK(cudaDeviceSynchronize());
    auto t1 = std::chrono::steady_clock::now();
    unsigned long long sum = 0;
    CHECK(cudaMemcpy(&sum, acc, sizeof sum, cudaMemcpyDeviceToHost));
    printf("RESULT iters=%d ms=%.3f checksum=%llu\n", iters, std::chrono::duration<double, std::milli>(t1 - t0).count(), sum);
    return 0;
}
