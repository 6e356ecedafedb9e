// spill_bw: how fast a kernel reads a 1 GiB buffer, by where the buffer is.
//   spill_bw device   cudaMalloc'd device memory and cudaHostAlloc'd pinned,
//                     mapped host memory (zero-copy), both without the shim
//   spill_bw spilled  one cudaMalloc of 1 GiB, to be run under the shim with a
//                     cap below 1 GiB and VRAMCAP_SPILL set: the buffer is spilled
// Prints "BW what=NAME gbps=X" lines (median of 5 timed reads), and for
// `spilled` also the device memory the process holds ("DEVFREE before/after").
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common.cuh"

__global__ void read_all(const unsigned long long *p, size_t n, unsigned long long *out) {
    unsigned long long s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) s += p[i];
    if (s == 42) *out = s;  // keeps the loads
}

static int measure(const char *what, const unsigned long long *p, size_t bytes, unsigned long long *out) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int rep = 0; rep < 6; ++rep) {
        CHECK(cudaEventRecord(a));
        read_all<<<132 * 8, 512>>>(p, bytes / 8, out);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float t = 0;
        CHECK(cudaEventElapsedTime(&t, a, b));
        if (rep > 0) ms.push_back(t);  // the first read warms up (and may fault pages in)
    }
    std::sort(ms.begin(), ms.end());
    double t = ms[ms.size() / 2];
    printf("BW what=%s gbps=%.1f ms=%.3f\n", what, (double)bytes / (t * 1e6), t);
    return 0;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "device";
    const size_t bytes = 1ull << 30;
    unsigned long long *out = NULL;
    CHECK(cudaMalloc(&out, 8));
    if (strcmp(mode, "device") == 0) {
        unsigned long long *d = NULL, *h = NULL, *hd = NULL;
        CHECK(cudaMalloc(&d, bytes));
        CHECK(cudaMemset(d, 1, bytes));
        if (measure("device", d, bytes, out)) return 1;
        CHECK(cudaFree(d));
        CHECK(cudaHostAlloc((void **)&h, bytes, cudaHostAllocMapped));
        memset(h, 1, bytes);
        CHECK(cudaHostGetDevicePointer((void **)&hd, h, 0));
        if (measure("pinned-zero-copy", hd, bytes, out)) return 1;
        CHECK(cudaFreeHost(h));
    } else {
        size_t f0 = 0, t0 = 0, f1 = 0, t1 = 0;
        CHECK(cudaMemGetInfo(&f0, &t0));
        unsigned long long *s = NULL;
        CHECK(cudaMalloc(&s, bytes));
        CHECK(cudaMemset(s, 1, bytes));
        CHECK(cudaDeviceSynchronize());
        cudaPointerAttributes attr;
        CHECK(cudaPointerGetAttributes(&attr, s));
        if (measure("spilled", s, bytes, out)) return 1;
        CHECK(cudaMemGetInfo(&f1, &t1));
        printf("SPILLED type=%d cap_total=%zu free_before=%zu free_after=%zu\n", (int)attr.type, t0, f0, f1);
        CHECK(cudaFree(s));
    }
    return 0;
}
