// capcheck: allocate 256 MiB chunks through one CUDA allocation path until the
// allocation is refused (or a hard stop is reached), report what happened in a
// machine-readable RESULT line, free everything, then run a small verified
// kernel to show the process is still healthy.
//
// Build: nvcc -O2 -arch=sm_90 -o capcheck capcheck.cu -lcuda
// Usage: capcheck MODE [MAX_BYTES]
//   MODE      cudaMalloc | cuMemAlloc | cudaMallocPitch | cudaMallocManaged | info
//   MAX_BYTES hard stop for the allocation loop in bytes (default 6 GiB).
//             Managed memory is always clamped so that the program never asks
//             for 6 GiB or more of managed memory in total.
//
// Output lines on stdout (one per line, space-separated key=value pairs):
//   INFO ...
//   RESULT mode=M bytes=N chunks=K err=CODE errname=NAME stop=refused|limit total=T free=F ...
//   VERIFY ok | VERIFY bad ... | VERIFY error ...
// Exit status: 0 when the program ran to the end and VERIFY ok, 1 on any CUDA
// error outside the expected allocation refusal, 2 on bad usage.

#include <cuda.h>
#include <cuda_runtime.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static const size_t kChunk = 256ull << 20;            // 256 MiB
static const size_t kPitchWidth = 64ull << 20;        // 64 MiB wide rows
static const size_t kPitchHeight = 4;                 // x 4 rows = 256 MiB
static const size_t kDefaultMax = 6ull << 30;         // 6 GiB
static const size_t kVerifyBytes = 64ull << 20;       // 64 MiB per vector
// Managed memory: loop total + the three verify vectors stay below 6 GiB.
static const size_t kManagedLoopMax = (6ull << 30) - 4 * kVerifyBytes;
static const int kMaxChunks = 4096;                   // belt and braces

static const char *rt_name(cudaError_t e) {
    const char *n = cudaGetErrorName(e);
    return n ? n : "unknown";
}

static const char *drv_name(CUresult r) {
    const char *n = NULL;
    if (cuGetErrorName(r, &n) != CUDA_SUCCESS || n == NULL) return "unknown";
    return n;
}

// Report a failed runtime call on stdout and stderr; evaluates to true on error.
static bool rt_fail(cudaError_t e, const char *what, int line) {
    if (e == cudaSuccess) return false;
    printf("ERROR call=%s line=%d err=%d errname=%s\n", what, line, (int)e, rt_name(e));
    fprintf(stderr, "capcheck: %s failed at line %d: %d %s (%s)\n", what, line, (int)e,
            rt_name(e), cudaGetErrorString(e));
    fflush(stdout);
    return true;
}

static bool drv_fail(CUresult r, const char *what, int line) {
    if (r == CUDA_SUCCESS) return false;
    printf("ERROR call=%s line=%d err=%d errname=%s\n", what, line, (int)r, drv_name(r));
    fprintf(stderr, "capcheck: %s failed at line %d: %d %s\n", what, line, (int)r, drv_name(r));
    fflush(stdout);
    return true;
}

#define RT_FAIL(call) rt_fail((call), #call, __LINE__)
#define DRV_FAIL(call) drv_fail((call), #call, __LINE__)

__global__ void vadd(const float *a, const float *b, float *c, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        c[i] = a[i] + b[i];
    }
}

static float val_a(size_t i) { return (float)(i % 1024); }
static float val_b(size_t i) { return (float)((i * 7) % 1024) * 0.5f; }

// Vector add over 64 MiB vectors; device memory, or managed memory if managed.
// Prints one VERIFY line. Returns 0 when the result is right.
static int verify(bool managed) {
    const size_t n = kVerifyBytes / sizeof(float);
    float *a = NULL, *b = NULL, *c = NULL;
    int rc = 1;
    bool printed = false;
    bool ok_alloc;
    if (managed) {
        ok_alloc = !RT_FAIL(cudaMallocManaged((void **)&a, kVerifyBytes, cudaMemAttachGlobal)) &&
                   !RT_FAIL(cudaMallocManaged((void **)&b, kVerifyBytes, cudaMemAttachGlobal)) &&
                   !RT_FAIL(cudaMallocManaged((void **)&c, kVerifyBytes, cudaMemAttachGlobal));
    } else {
        ok_alloc = !RT_FAIL(cudaMalloc((void **)&a, kVerifyBytes)) &&
                   !RT_FAIL(cudaMalloc((void **)&b, kVerifyBytes)) &&
                   !RT_FAIL(cudaMalloc((void **)&c, kVerifyBytes));
    }
    if (!ok_alloc) {
        printf("VERIFY error stage=alloc\n");
        if (a) cudaFree(a);
        if (b) cudaFree(b);
        if (c) cudaFree(c);
        return 1;
    }

    std::vector<float> host(n);
    do {
        if (managed) {
            for (size_t i = 0; i < n; ++i) { a[i] = val_a(i); b[i] = val_b(i); c[i] = -1.0f; }
        } else {
            for (size_t i = 0; i < n; ++i) host[i] = val_a(i);
            if (RT_FAIL(cudaMemcpy(a, host.data(), kVerifyBytes, cudaMemcpyHostToDevice))) break;
            for (size_t i = 0; i < n; ++i) host[i] = val_b(i);
            if (RT_FAIL(cudaMemcpy(b, host.data(), kVerifyBytes, cudaMemcpyHostToDevice))) break;
            if (RT_FAIL(cudaMemset(c, 0, kVerifyBytes))) break;
        }
        vadd<<<1024, 256>>>(a, b, c, n);
        if (RT_FAIL(cudaGetLastError())) break;
        if (RT_FAIL(cudaDeviceSynchronize())) break;
        const float *res = c;
        if (!managed) {
            if (RT_FAIL(cudaMemcpy(host.data(), c, kVerifyBytes, cudaMemcpyDeviceToHost))) break;
            res = host.data();
        }
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; ++i) {
            if (res[i] != val_a(i) + val_b(i)) {
                if (bad == 0) first = i;
                ++bad;
            }
        }
        printed = true;
        if (bad == 0) {
            printf("VERIFY ok\n");
            rc = 0;
        } else {
            printf("VERIFY bad mismatches=%zu first=%zu got=%g want=%g\n", bad, first,
                   (double)res[first], (double)(val_a(first) + val_b(first)));
        }
    } while (0);
    if (rc != 0 && !printed) printf("VERIFY error stage=kernel_or_copy\n");
    RT_FAIL(cudaFree(a));
    RT_FAIL(cudaFree(b));
    RT_FAIL(cudaFree(c));
    fflush(stdout);
    return rc;
}

static int run_info() {
    int rc = 0;
    int rt_ver = 0, drv_ver = 0;
    cudaRuntimeGetVersion(&rt_ver);
    cudaDriverGetVersion(&drv_ver);
    if (RT_FAIL(cudaSetDevice(0))) return 1;
    if (RT_FAIL(cudaFree(0))) return 1;

    size_t free_b = 0, total_b = 0;
    if (RT_FAIL(cudaMemGetInfo(&free_b, &total_b))) rc = 1;
    cudaDeviceProp prop;
    memset(&prop, 0, sizeof(prop));
    if (RT_FAIL(cudaGetDeviceProperties(&prop, 0))) rc = 1;

    // The same figures straight from the driver API (linked with -lcuda).
    size_t cu_free = 0, cu_total = 0, cu_devtotal = 0;
    CUdevice dev = 0;
    if (DRV_FAIL(cuInit(0))) rc = 1;
    if (DRV_FAIL(cuDeviceGet(&dev, 0))) rc = 1;
    if (DRV_FAIL(cuDeviceTotalMem(&cu_devtotal, dev))) rc = 1;
    if (DRV_FAIL(cuMemGetInfo(&cu_free, &cu_total))) rc = 1;

    printf("INFO device_name=\"%s\" cc=%d.%d runtime=%d driver=%d\n", prop.name, prop.major,
           prop.minor, rt_ver, drv_ver);
    printf("RESULT mode=info total=%zu free=%zu props_total=%zu cu_total=%zu cu_free=%zu "
           "cu_devtotal=%zu rc=%d\n",
           total_b, free_b, (size_t)prop.totalGlobalMem, cu_total, cu_free, cu_devtotal, rc);
    fflush(stdout);
    return rc;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: %s cudaMalloc|cuMemAlloc|cudaMallocPitch|cudaMallocManaged|info [MAX_BYTES]\n",
                argv[0]);
        return 2;
    }
    const char *mode = argv[1];
    size_t max_bytes = kDefaultMax;
    if (argc >= 3) {
        errno = 0;
        char *end = NULL;
        unsigned long long v = strtoull(argv[2], &end, 10);
        if (errno != 0 || end == argv[2] || *end != '\0' || v == 0) {
            fprintf(stderr, "capcheck: bad MAX_BYTES '%s' (plain byte count expected)\n", argv[2]);
            return 2;
        }
        max_bytes = (size_t)v;
    }

    if (strcmp(mode, "info") == 0) return run_info();

    enum { M_MALLOC, M_CUMEMALLOC, M_PITCH, M_MANAGED } m;
    if (strcmp(mode, "cudaMalloc") == 0) m = M_MALLOC;
    else if (strcmp(mode, "cuMemAlloc") == 0) m = M_CUMEMALLOC;
    else if (strcmp(mode, "cudaMallocPitch") == 0) m = M_PITCH;
    else if (strcmp(mode, "cudaMallocManaged") == 0) m = M_MANAGED;
    else {
        fprintf(stderr, "capcheck: unknown mode '%s'\n", mode);
        return 2;
    }
    if (m == M_MANAGED && max_bytes > kManagedLoopMax) max_bytes = kManagedLoopMax;

    if (RT_FAIL(cudaSetDevice(0))) return 1;
    if (RT_FAIL(cudaFree(0))) return 1;  // creates the primary context, made current
    if (m == M_CUMEMALLOC && DRV_FAIL(cuInit(0))) return 1;

    std::vector<void *> rt_ptrs;
    std::vector<CUdeviceptr> drv_ptrs;
    size_t bytes = 0;
    int chunks = 0;
    int err = 0;
    const char *errname = "none";
    const char *stop = "limit";
    size_t last_pitch = 0;

    while (bytes + kChunk <= max_bytes && chunks < kMaxChunks) {
        if (m == M_CUMEMALLOC) {
            CUdeviceptr d = 0;
            CUresult r = cuMemAlloc(&d, kChunk);  // cuda.h maps this to cuMemAlloc_v2
            if (r != CUDA_SUCCESS) {
                err = (int)r;
                errname = drv_name(r);
                stop = "refused";
                break;
            }
            drv_ptrs.push_back(d);
            bytes += kChunk;
        } else {
            void *p = NULL;
            cudaError_t e;
            size_t got = kChunk;
            if (m == M_MALLOC) {
                e = cudaMalloc(&p, kChunk);
            } else if (m == M_PITCH) {
                size_t pitch = 0;
                e = cudaMallocPitch(&p, &pitch, kPitchWidth, kPitchHeight);
                if (e == cudaSuccess) {
                    last_pitch = pitch;
                    got = pitch * kPitchHeight;
                }
            } else {
                e = cudaMallocManaged(&p, kChunk, cudaMemAttachGlobal);
            }
            if (e != cudaSuccess) {
                err = (int)e;
                errname = rt_name(e);
                stop = "refused";
                cudaGetLastError();  // clear the (non-sticky) error
                break;
            }
            rt_ptrs.push_back(p);
            bytes += got;
        }
        ++chunks;
    }

    size_t free_b = 0, total_b = 0;
    cudaError_t mi = cudaMemGetInfo(&free_b, &total_b);
    if (mi != cudaSuccess) {
        fprintf(stderr, "capcheck: cudaMemGetInfo failed: %d %s\n", (int)mi, rt_name(mi));
        cudaGetLastError();
    }
    printf("RESULT mode=%s bytes=%zu chunks=%d err=%d errname=%s stop=%s total=%zu free=%zu "
           "memgetinfo_err=%d max_bytes=%zu pitch=%zu\n",
           mode, bytes, chunks, err, errname, stop, total_b, free_b, (int)mi, max_bytes, last_pitch);
    fflush(stdout);

    int rc = 0;
    for (size_t i = 0; i < rt_ptrs.size(); ++i) {
        if (RT_FAIL(cudaFree(rt_ptrs[i]))) rc = 1;
    }
    for (size_t i = 0; i < drv_ptrs.size(); ++i) {
        if (DRV_FAIL(cuMemFree(drv_ptrs[i]))) rc = 1;  // cuMemFree_v2
    }
    if (rc != 0) printf("FREE error\n");

    if (verify(m == M_MANAGED) != 0) rc = 1;
    printf("DONE rc=%d\n", rc);
    return rc;
}
