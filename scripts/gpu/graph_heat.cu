// graph_heat: a block that only a CUDA graph's kernel uses, under tiered
// spill (VRAMCAP_SPILL=tiered, VRAMCAP_LIMIT about the context plus 512 MiB).
// Blocks A and B (192 MiB each) fill the cap and are warmed by a few direct
// launches; C (192 MiB) comes after them and starts in host memory. A kernel
// adding 1 to every element of C is captured into a graph, and the graph is
// launched in windows of 20 launches for at most SECONDS (default 8) or 200
// windows. If the shim counts the graph's kernel as uses of C, C is promoted
// (a warm device block making room) and the windows get fast; if not, C
// stays on the host. At the end every element of C must equal the number of
// launches: the moves under the running graph kept its data. With "update"
// the executable graph is first made from a graph whose kernel adds to A,
// then updated (cudaGraphExecUpdate) to the one that adds to C: C is
// promoted only if the update's new kernels count as its uses.
// Usage: graph_heat [SECONDS [update]]
// Prints "RESULT windows=W launches=N first_ms=F last_ms=L verify=ok|bad"
// (F and L: the milliseconds a launch took in the first and last window).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.cuh"

__global__ void k_bump(float *p, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] += 1.0f;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 8.0;
    bool update = argc > 2 && strcmp(argv[2], "update") == 0;
    if (seconds <= 0 || (argc > 2 && !update)) {
        fprintf(stderr, "usage: graph_heat [SECONDS [update]] (SECONDS positive; e.g. graph_heat 8 update)\n");
        return 2;
    }
    const size_t bytes = 192u << 20, n = bytes / sizeof(float);
    float *a, *b, *c;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    CHECK(cudaMalloc(&c, bytes));
    CHECK(cudaMemset(a, 0, bytes));
    CHECK(cudaMemset(b, 0, bytes));
    CHECK(cudaMemset(c, 0, bytes));
    for (int i = 0; i < 5; i++) {
        k_bump<<<1024, 256>>>(a, n);
        k_bump<<<1024, 256>>>(b, n);
    }
    CHECK(cudaDeviceSynchronize());
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t g, first = nullptr;
    cudaGraphExec_t e;
    if (update) {
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        k_bump<<<1024, 256, 0, s>>>(a, n);
        CHECK(cudaStreamEndCapture(s, &first));
        CHECK(cudaGraphInstantiate(&e, first, 0));
    }
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    k_bump<<<1024, 256, 0, s>>>(c, n);
    CHECK(cudaStreamEndCapture(s, &g));
    if (update) {
        cudaGraphExecUpdateResultInfo info;
        CHECK(cudaGraphExecUpdate(e, g, &info));
    } else {
        CHECK(cudaGraphInstantiate(&e, g, 0));
    }
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    const int per_window = 20;
    std::vector<float> ms;
    long launches = 0;
    auto start = std::chrono::steady_clock::now();
    while (ms.size() < 200) {
        CHECK(cudaEventRecord(t0, s));
        for (int i = 0; i < per_window; i++) CHECK(cudaGraphLaunch(e, s));
        CHECK(cudaEventRecord(t1, s));
        CHECK(cudaEventSynchronize(t1));
        launches += per_window;
        float m = 0;
        CHECK(cudaEventElapsedTime(&m, t0, t1));
        ms.push_back(m / per_window);
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) break;
    }
    std::vector<float> host(n);
    CHECK(cudaMemcpy(host.data(), c, bytes, cudaMemcpyDeviceToHost));
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) ok = host[i] == (float)launches;
    printf("RESULT windows=%zu launches=%ld first_ms=%.3f last_ms=%.3f verify=%s\n", ms.size(), launches, ms.front(),
           ms.back(), ok ? "ok" : "bad");
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
    if (first) CHECK(cudaGraphDestroy(first));
    return ok ? 0 : 1;
}
