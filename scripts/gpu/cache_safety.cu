// cache_safety: a kernel still writing block A on stream s1 while the
// program frees A, allocates the same size (which the cache may hand back as
// the same block) and writes it on stream s2 (with a host-to-device copy,
// which the copy engine runs alongside the kernel even where kernels of two
// streams do not overlap). Correct behaviour: every element ends as s2
// wrote it. Modes:
//   cuda   cudaFree + cudaMalloc (what a program does; run with and without the cache)
//   naive  the program itself reuses A without waiting: the control that
//          shows this check detects clobbering
// Usage: cache_safety [cuda|naive|late] [nonblocking|blocking]: s1 and s2 are
// created cudaStreamNonBlocking (default; the shim's cache then waits for a
// synchronisation before reuse) or with default flags (blocking streams,
// which the legacy stream orders: the cache orders the reuse with an event
// on it instead of waiting).
// Prints "RESULT mode=M streams=S reused=0|1 clobbered=N total=T". Exit 1 on CUDA errors.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.cuh"

__device__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Waits `spin_ns` of wall time (the global timer, not the SM clock, whose
// rate attribute CUDA 13 no longer reports), then writes.
__global__ void slow_fill(int *p, size_t n, int v, unsigned long long spin_ns) {
    unsigned long long t0 = now_ns();
    while (now_ns() - t0 < spin_ns) {
    }
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}


// "late": the non-blocking stream is created only after a reuse was
// ordered on the legacy stream. A kernel on the legacy stream still writes
// block A; A and a second block are freed; one allocation is served (the
// shim orders it, which makes both blocks safe for blocking streams); then
// the program creates a non-blocking stream, allocates again (the other
// block) and copies into both on the new stream. The copy into A must land
// after the kernel.
static int late(size_t bytes, size_t n, int *twos) {
    int *a = NULL, *y = NULL, *z = NULL, *b = NULL;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&y, bytes));
    CHECK(cudaMemset(a, 0, bytes));
    CHECK(cudaDeviceSynchronize());
    slow_fill<<<264, 256, 0, 0>>>(a, n, 1, 300ull * 1000 * 1000);  // 300 ms, legacy stream
    CHECK(cudaGetLastError());
    CHECK(cudaFree(y));
    CHECK(cudaFree(a));
    CHECK(cudaMalloc(&z, bytes));
    cudaStream_t nb;
    CHECK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));
    CHECK(cudaMalloc(&b, bytes));
    CHECK(cudaMemcpyAsync(z, twos, bytes, cudaMemcpyHostToDevice, nb));
    CHECK(cudaMemcpyAsync(b, twos, bytes, cudaMemcpyHostToDevice, nb));
    CHECK(cudaDeviceSynchronize());
    int *check = z == a ? z : b;
    std::vector<int> host(n);
    CHECK(cudaMemcpy(host.data(), check, bytes, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += host[i] != 2;
    printf("RESULT mode=late streams=late-nonblocking reused=%d clobbered=%zu total=%zu\n",
           (int)(z == a || b == a), bad, n);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "cuda";
    if (strcmp(mode, "late") == 0) {
        const size_t bytes = 64ull << 20;
        int *twos = NULL;
        CHECK(cudaHostAlloc((void **)&twos, bytes, cudaHostAllocDefault));
        for (size_t i = 0; i < bytes / sizeof(int); ++i) twos[i] = 2;
        return late(bytes, bytes / sizeof(int), twos);
    }
    const size_t bytes = 64ull << 20, n = bytes / sizeof(int);
    const char *streams = argc > 2 ? argv[2] : "nonblocking";
    const unsigned flags = strcmp(streams, "blocking") == 0 ? cudaStreamDefault : cudaStreamNonBlocking;
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, flags));
    CHECK(cudaStreamCreateWithFlags(&s2, flags));
    int *a = NULL, *b = NULL, *twos = NULL;
    CHECK(cudaHostAlloc((void **)&twos, bytes, cudaHostAllocDefault));
    for (size_t i = 0; i < n; ++i) twos[i] = 2;
    int concurrent = 0;
    CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentKernels, 0));
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMemset(a, 0, bytes));
    CHECK(cudaDeviceSynchronize());
    slow_fill<<<264, 256, 0, s1>>>(a, n, 1, 300ull * 1000 * 1000);  // 300 ms
    CHECK(cudaGetLastError());
    if (strcmp(mode, "naive") == 0) {
        b = a;
    } else {
        CHECK(cudaFree(a));
        CHECK(cudaMalloc(&b, bytes));
    }
    CHECK(cudaMemcpyAsync(b, twos, bytes, cudaMemcpyHostToDevice, s2));
    CHECK(cudaDeviceSynchronize());
    std::vector<int> host(n);
    CHECK(cudaMemcpy(host.data(), b, bytes, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += host[i] != 2;
    printf("RESULT mode=%s streams=%s reused=%d clobbered=%zu total=%zu concurrent_kernels=%d\n", mode, streams, (int)(a == b), bad, n, concurrent);
    return 0;
}
