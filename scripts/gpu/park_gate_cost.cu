// park_gate_cost: what parking's entry gate costs (issue 34): the launch path
// and a cheap driver call that vramcap does not hook, which under
// VRAMCAP_PARK reach the driver through the shim's forwarders.
//
//   launch_rt    an empty kernel launched with <<<>>> (the runtime's path),
//                ITERS a round, synchronised after each round
//   launch_drv   the same kernel with cuLaunchKernel, the pointer the runtime
//                hands out (cudaGetDriverEntryPointByVersion at 12000, which
//                asks the driver's cuGetProcAddress: the forwarder under
//                VRAMCAP_PARK)
//   ctx_current  cuCtxGetCurrent through such a pointer, 10 x ITERS a round
//   stream_query cuStreamQuery of an idle stream through such a pointer
//   alloc_pair   cuMemAlloc_v2 and cuMemFree_v2 of 1 MiB through such
//                pointers (the shim's hooks; a cache hit under the shim),
//                ITERS / 20 pairs a round (issue 43, done-when 6: the
//                cache-hit pair with parking enabled and unused)
//
// Usage: park_gate_cost [ITERS [ROUNDS]] (default 200000 5). Prints
// "RESULT launch_rt_ns=T launch_drv_ns=T ctx_current_ns=T stream_query_ns=T
// alloc_pair_ns=T lib_launch=L lib_ctx=L lib_query=L": the median over the rounds of the ns
// per call, and the file of each pointer (libvramcap.so for a forwarder,
// libcuda.so.1 for the driver's own).
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.cuh"

__global__ void k_empty() {}

// The median ns per call of ROUNDS rounds of ITERS calls of body(i), with
// done() (a synchronisation) inside each round's time.
template <class Body, class Done>
static double per_call(int iters, int rounds, Body body, Done done) {
    std::vector<double> per;
    for (int r = 0; r < rounds; r++) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; i++) body(i);
        done();
        auto t1 = std::chrono::steady_clock::now();
        per.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / iters);
    }
    std::sort(per.begin(), per.end());
    return per[per.size() / 2];
}

static const char *lib_of(void *p) {
    Dl_info info;
    if (p == nullptr || dladdr(p, &info) == 0 || info.dli_fname == nullptr) return "unknown";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname;
}

static void *entry(const char *name) {
    void *p = nullptr;
    cudaDriverEntryPointQueryResult st;
    if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &st) != cudaSuccess ||
        st != cudaDriverEntryPointSuccess)
        return nullptr;
    return p;
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 200000;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    if (iters <= 0 || rounds <= 0) {
        fprintf(stderr, "usage: park_gate_cost [ITERS [ROUNDS]] (both positive; e.g. park_gate_cost 200000 5)\n");
        return 2;
    }
    CHECK(cudaFree(0));
    typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, CUstream, void **, void **);
    typedef CUresult (*ctx_fn)(CUcontext *);
    typedef CUresult (*query_fn)(CUstream);
    typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
    typedef CUresult (*free_fn)(CUdeviceptr);
    launch_fn launch = (launch_fn)entry("cuLaunchKernel");
    ctx_fn ctx_current = (ctx_fn)entry("cuCtxGetCurrent");
    query_fn query = (query_fn)entry("cuStreamQuery");
    alloc_fn mem_alloc = (alloc_fn)entry("cuMemAlloc");
    free_fn mem_free = (free_fn)entry("cuMemFree");
    if (!launch || !ctx_current || !query || !mem_alloc || !mem_free) {
        printf("ERROR cudaGetDriverEntryPointByVersion: a function is missing\n");
        return 1;
    }
    CUresult bad = CUDA_SUCCESS;
    auto nothing = [] {};
    // The pair first: once the program asks for a non-blocking stream (as
    // below), the shim's cache synchronises before a reuse instead of
    // recording an event, and the pair would not be the cache hit that
    // gpu_bench.py times.
    int pairs = iters / 20 > 0 ? iters / 20 : 1;
    double pair = per_call(pairs, rounds, [&](int) {
        CUdeviceptr d = 0;
        CUresult r = mem_alloc(&d, 1 << 20);
        if (r == CUDA_SUCCESS) r = mem_free(d);
        if (r != CUDA_SUCCESS) bad = r;
    }, nothing);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaFunction_t fn;
    CHECK(cudaGetFuncBySymbol(&fn, (const void *)k_empty));
    CUfunction f = (CUfunction)fn;
    CUstream cs = (CUstream)s;
    // Warm up every path once.
    for (int i = 0; i < 1000; i++) k_empty<<<1, 32, 0, s>>>();
    CHECK(cudaStreamSynchronize(s));
    auto sync = [&] {
        cudaError_t e = cudaStreamSynchronize(s);
        if (e != cudaSuccess) bad = CUDA_ERROR_UNKNOWN;
    };
    double rt = per_call(iters, rounds, [&](int) { k_empty<<<1, 32, 0, s>>>(); }, sync);
    double drv = per_call(iters, rounds, [&](int) {
        CUresult r = launch(f, 1, 1, 1, 32, 1, 1, 0, cs, nullptr, nullptr);
        if (r != CUDA_SUCCESS) bad = r;
    }, sync);
    CUcontext c;
    double ctx = per_call(10 * iters, rounds, [&](int) {
        CUresult r = ctx_current(&c);
        if (r != CUDA_SUCCESS) bad = r;
    }, nothing);
    double q = per_call(iters, rounds, [&](int) {
        CUresult r = query(cs);
        if (r != CUDA_SUCCESS) bad = r;
    }, nothing);
    CHECK(cudaGetLastError());
    if (bad != CUDA_SUCCESS) {
        printf("ERROR a timed call failed: %s\n", drv_name(bad));
        return 1;
    }
    printf("RESULT launch_rt_ns=%.1f launch_drv_ns=%.1f ctx_current_ns=%.2f stream_query_ns=%.1f "
           "alloc_pair_ns=%.1f lib_launch=%s lib_ctx=%s lib_query=%s\n",
           rt, drv, ctx, q, pair, lib_of((void *)launch), lib_of((void *)ctx_current), lib_of((void *)query));
    CHECK(cudaStreamDestroy(s));
    return 0;
}
