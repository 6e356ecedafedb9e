// capcheck: allocate 256 MiB chunks through one CUDA allocation path until the
// allocation is refused (or a hard stop is reached), report what happened in a
// machine-readable RESULT line, free everything, then run a small verified
// kernel to show the process is still healthy.
//
// Build: nvcc -O2 -arch=sm_90 -o capcheck capcheck.cu -lcuda
// Usage: capcheck MODE [MAX_BYTES]
//   MODE      cudaMalloc | cuMemAlloc | cudaMallocPitch | cudaMallocManaged |
//             cudaMallocAsync | cudaMemPool | cuMemCreate | cudaMallocArray |
//             cudaMalloc3DArray | twodev | twodev-thread | info
//   MAX_BYTES hard stop for the allocation loop in bytes (default 6 GiB; for
//             twodev the hard stop of each device). Managed memory is always
//             clamped so that the program never asks for 6 GiB or more of
//             managed memory in total (only cudaMallocManaged uses any).
//
// The modes:
//   cudaMallocAsync   cudaMallocAsync on a created stream, cudaStreamSynchronize
//                     after each chunk; freed with cudaFreeAsync, then the
//                     device's default pool is trimmed to 0.
//   cudaMemPool       the same through cudaMallocFromPoolAsync from a pool made
//                     by cudaMemPoolCreate (device 0, default properties).
//   cuMemCreate       driver VMM: one cuMemAddressReserve for the whole loop,
//                     then per chunk cuMemCreate + cuMemMap + cuMemSetAccess;
//                     stops at the first failing cuMemCreate. Before the
//                     release a kernel writes the first and the last mapped
//                     chunk and they are read back (TOUCH line).
//   cudaMallocArray   2D float arrays 8192 x 8192 (256 MiB of texels each);
//                     a 16-row round trip through the first array (TOUCH).
//   cudaMalloc3DArray 3D float arrays 1024 x 1024 x 64 (256 MiB each); a
//                     2-slice round trip through the first array (TOUCH).
//                     Array modes count 256 MiB per array; the driver's real
//                     size may be larger (first_delta= shows the drop of
//                     cudaMemGetInfo free over the first array).
//   twodev            cudaMalloc on device 0 until refused, then on device 1
//                     (cudaSetDevice between them), then one more chunk on each
//                     again (must be refused too). RESULTDEV line per device.
//   twodev-thread     the same, but a second thread fills device 1 while the
//                     main thread fills device 0.
//
// Output lines on stdout (one per line, space-separated key=value pairs):
//   INFO ...
//   RESULT mode=M bytes=N chunks=K err=CODE errname=NAME stop=refused|limit|... total=T free=F ...
//   RESULTDEV dev=D bytes=N ... uuid=GPU-... (twodev modes, one per device)
//   TOUCH ok | TOUCH bad ... | TOUCH error ... (cuMemCreate and array modes)
//   VERIFY ok | VERIFY bad ... | VERIFY error ...
//   VERIFYDEV dev=D ok | ... (twodev modes, one per device)
// Exit status: 0 when the program ran to the end and every VERIFY/TOUCH is ok,
// 1 on any CUDA error outside the expected allocation refusal, 2 on bad usage.

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common.cuh"

static const size_t kChunk = 256ull << 20;            // 256 MiB
static const size_t kPitchWidth = 64ull << 20;        // 64 MiB wide rows
static const size_t kPitchHeight = 4;                 // x 4 rows = 256 MiB
static const size_t kDefaultMax = 6ull << 30;         // 6 GiB
static const size_t kVerifyBytes = 64ull << 20;       // 64 MiB per vector
// Managed memory: loop total + the three verify vectors stay below 6 GiB.
static const size_t kManagedLoopMax = (6ull << 30) - 4 * kVerifyBytes;
static const int kMaxChunks = 4096;                   // belt and braces
// Arrays: 256 MiB of float texels each.
static const size_t k2DW = 8192, k2DH = 8192;
static const size_t k3DW = 1024, k3DH = 1024, k3DD = 64;
static_assert(k2DW * k2DH * sizeof(float) == kChunk, "2D array is one chunk");
static_assert(k3DW * k3DH * k3DD * sizeof(float) == kChunk, "3D array is one chunk");

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

// Vector add over 64 MiB vectors on the current device; device memory, or
// managed memory if managed. Prints one line starting with `tag` ("VERIFY" by
// default): "<tag> ok", "<tag> bad ..." or "<tag> error ...".
// Returns 0 when the result is right.
static int verify(bool managed, const char *tag = "VERIFY") {
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
        printf("%s error stage=alloc\n", tag);
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
            printf("%s ok\n", tag);
            rc = 0;
        } else {
            printf("%s bad mismatches=%zu first=%zu got=%g want=%g\n", tag, bad, first,
                   (double)res[first], (double)(val_a(first) + val_b(first)));
        }
    } while (0);
    if (rc != 0 && !printed) printf("%s error stage=kernel_or_copy\n", tag);
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

// ---------------------------------------------------------------- shared by the newer modes

// What an allocation loop got, and why it stopped ("limit": at its hard stop).
struct Loop {
    size_t bytes = 0;
    int chunks = 0;
    int err = 0;
    const char *errname = "none";
    const char *stop = "limit";
    // The loop ends at a failed call: its error code and name, and why.
    void end(int code, const char *name, const char *why) {
        err = code;
        errname = name;
        stop = why;
    }
};

// cudaMemGetInfo on the current device, then one RESULT line for the loop.
// `extra` (may be empty) is appended verbatim, e.g. "pool_reserved=... errat=alloc".
static void print_result(const char *mode, const Loop &loop, size_t max_bytes, const char *extra) {
    size_t free_b = 0, total_b = 0;
    cudaError_t mi = cudaMemGetInfo(&free_b, &total_b);
    if (mi != cudaSuccess) {
        fprintf(stderr, "capcheck: cudaMemGetInfo failed: %d %s\n", (int)mi, rt_name(mi));
        cudaGetLastError();
    }
    printf("RESULT mode=%s bytes=%zu chunks=%d err=%d errname=%s stop=%s total=%zu free=%zu "
           "memgetinfo_err=%d max_bytes=%zu%s%s\n",
           mode, loop.bytes, loop.chunks, loop.err, loop.errname, loop.stop, total_b, free_b, (int)mi,
           max_bytes, (extra && *extra) ? " " : "", extra ? extra : "");
    fflush(stdout);
}

// The end of a run, after freeing (free_failed: a free failed): "FREE error",
// the verify kernel, "DONE rc=N". Returns the exit status.
static int finish(int rc, bool free_failed, bool managed) {
    if (free_failed) {
        printf("FREE error\n");
        rc = 1;
    }
    if (verify(managed) != 0) rc = 1;
    printf("DONE rc=%d\n", rc);
    return rc;
}

__global__ void fill_u32(unsigned int *p, size_t n, unsigned int salt) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        p[i] = (unsigned int)(i * 2654435761u) ^ salt;
    }
}

static unsigned int pattern_u32(size_t i, unsigned int salt) {
    return (unsigned int)(i * 2654435761u) ^ salt;
}

// A kernel writes a pattern over `bytes` at `ptr` (device memory of the current
// device); the whole range is copied back and compared. Returns 0 when right;
// otherwise prints a TOUCH bad/error line itself.
static int touch_device_range(CUdeviceptr ptr, size_t bytes, unsigned int salt,
                              std::vector<unsigned int> &host) {
    const size_t n = bytes / sizeof(unsigned int);
    unsigned int *d = (unsigned int *)(uintptr_t)ptr;
    fill_u32<<<1024, 256>>>(d, n, salt);
    if (RT_FAIL(cudaGetLastError()) || RT_FAIL(cudaDeviceSynchronize())) {
        printf("TOUCH error stage=kernel\n");
        return 1;
    }
    host.assign(n, 0u);
    if (RT_FAIL(cudaMemcpy(host.data(), d, n * sizeof(unsigned int), cudaMemcpyDeviceToHost))) {
        printf("TOUCH error stage=copy\n");
        return 1;
    }
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; ++i) {
        if (host[i] != pattern_u32(i, salt)) {
            if (bad == 0) first = i;
            ++bad;
        }
    }
    if (bad != 0) {
        printf("TOUCH bad salt=%u mismatches=%zu first=%zu got=%u want=%u\n", salt, bad, first,
               host[first], pattern_u32(first, salt));
        return 1;
    }
    return 0;
}

// ---------------------------------------------------------------- stream-ordered allocations

// cudaMallocAsync (own_pool false: the device's current/default pool) or
// cudaMallocFromPoolAsync from a pool made here (own_pool true).
static int run_stream_ordered(const char *mode, bool own_pool, size_t max_bytes) {
    cudaStream_t s = NULL;
    if (RT_FAIL(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking))) return 1;
    cudaMemPool_t pool = NULL;
    if (own_pool) {
        cudaMemPoolProps props;
        memset(&props, 0, sizeof(props));
        props.allocType = cudaMemAllocationTypePinned;
        props.handleTypes = cudaMemHandleTypeNone;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = 0;
        if (RT_FAIL(cudaMemPoolCreate(&pool, &props))) {
            cudaStreamDestroy(s);
            return 1;
        }
    } else if (RT_FAIL(cudaDeviceGetDefaultMemPool(&pool, 0))) {
        cudaStreamDestroy(s);
        return 1;
    }

    std::vector<void *> ptrs;
    Loop loop;
    const char *errat = "none";
    while (loop.bytes + kChunk <= max_bytes && loop.chunks < kMaxChunks) {
        void *p = NULL;
        cudaError_t e = own_pool ? cudaMallocFromPoolAsync(&p, kChunk, pool, s)
                                 : cudaMallocAsync(&p, kChunk, s);
        if (e != cudaSuccess) {
            loop.end((int)e, rt_name(e), "refused");
            errat = "alloc";
            cudaGetLastError();  // clear the (non-sticky) error
            break;
        }
        e = cudaStreamSynchronize(s);
        if (e != cudaSuccess) {
            // Not expected: a failure that shows only when the stream runs. The
            // pointer may not be valid, so it is not kept (nor freed).
            loop.end((int)e, rt_name(e), "sync_error");
            errat = "sync";
            fprintf(stderr, "capcheck: cudaStreamSynchronize after an allocation failed: %d %s\n",
                    (int)e, rt_name(e));
            cudaGetLastError();
            break;
        }
        ptrs.push_back(p);
        loop.bytes += kChunk;
        ++loop.chunks;
    }

    unsigned long long reserved = 0, used = 0;
    if (cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) != cudaSuccess ||
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) != cudaSuccess) {
        cudaGetLastError();
    }
    char extra[256];
    snprintf(extra, sizeof(extra), "pool_reserved=%llu pool_used=%llu errat=%s own_pool=%d", reserved,
             used, errat, own_pool ? 1 : 0);
    print_result(mode, loop, max_bytes, extra);

    int rc = 0;
    for (size_t i = 0; i < ptrs.size(); ++i) {
        if (RT_FAIL(cudaFreeAsync(ptrs[i], s))) rc = 1;
    }
    if (RT_FAIL(cudaStreamSynchronize(s))) rc = 1;
    if (RT_FAIL(cudaMemPoolTrimTo(pool, 0))) rc = 1;
    reserved = 0;
    if (cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved) != cudaSuccess) {
        cudaGetLastError();
    }
    printf("POOL reserved_after_trim=%llu\n", reserved);
    if (own_pool && RT_FAIL(cudaMemPoolDestroy(pool))) rc = 1;
    if (RT_FAIL(cudaStreamDestroy(s))) rc = 1;
    return finish(rc, rc != 0, false);
}

// ---------------------------------------------------------------- driver VMM

// A failed step after cuMemCreate (r not CUDA_SUCCESS): reported like
// DRV_FAIL, and the loop ends with why. Returns whether it failed.
static bool vmm_failed(CUresult r, const char *what, int line, Loop *loop, const char *why) {
    if (!drv_fail(r, what, line)) return false;
    loop->end((int)r, drv_name(r), why);
    return true;
}

static int run_vmm(const char *mode, size_t max_bytes) {
    if (DRV_FAIL(cuInit(0))) return 1;
    CUdevice dev = 0;
    if (DRV_FAIL(cuDeviceGet(&dev, 0))) return 1;

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)dev;
    size_t gran = 0;
    if (DRV_FAIL(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM))) {
        return 1;
    }
    printf("INFO granularity=%zu\n", gran);
    if (gran == 0 || kChunk % gran != 0) {
        printf("ERROR granularity=%zu does not divide the chunk\n", gran);
        return 1;
    }

    size_t nmax = max_bytes / kChunk;
    if (nmax > (size_t)kMaxChunks) nmax = (size_t)kMaxChunks;
    const size_t va_size = nmax * kChunk;
    CUdeviceptr base = 0;
    if (va_size > 0 && DRV_FAIL(cuMemAddressReserve(&base, va_size, 0, 0, 0))) return 1;

    CUmemAccessDesc access;
    memset(&access, 0, sizeof(access));
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

    std::vector<CUmemGenericAllocationHandle> handles;
    size_t mapped = 0;      // chunks mapped at base + i * kChunk
    size_t accessible = 0;  // of those, chunks with access set
    Loop loop;
    int rc = 0;
    for (size_t i = 0; i < nmax; ++i) {
        CUmemGenericAllocationHandle h = 0;
        CUresult r = cuMemCreate(&h, kChunk, &prop, 0);
        if (r != CUDA_SUCCESS) {
            loop.end((int)r, drv_name(r), "refused");
            break;
        }
        handles.push_back(h);
        if (vmm_failed(cuMemMap(base + i * kChunk, kChunk, 0, h, 0), "cuMemMap", __LINE__,
                       &loop, "map_error")) {
            rc = 1;
            break;
        }
        ++mapped;
        if (vmm_failed(cuMemSetAccess(base + i * kChunk, kChunk, &access, 1), "cuMemSetAccess",
                       __LINE__, &loop, "access_error")) {
            rc = 1;
            break;
        }
        ++accessible;
        loop.bytes += kChunk;
        ++loop.chunks;
    }

    char extra[128];
    snprintf(extra, sizeof(extra), "granularity=%zu handles=%zu mapped=%zu", gran, handles.size(),
             mapped);
    print_result(mode, loop, max_bytes, extra);

    // Write and read back the first and the last accessible chunk before release.
    if (accessible > 0) {
        std::vector<unsigned int> host;
        int bad = touch_device_range(base, kChunk, 0x5a5a0001u, host);
        if (bad == 0 && accessible > 1) {
            bad = touch_device_range(base + (accessible - 1) * kChunk, kChunk, 0xa5a50002u, host);
        }
        if (bad == 0) {
            printf("TOUCH ok chunks_checked=%d\n", accessible > 1 ? 2 : 1);
        } else {
            rc = 1;
        }
    } else {
        printf("TOUCH error stage=nothing_mapped\n");
        rc = 1;
    }

    int frc = 0;
    for (size_t i = 0; i < mapped; ++i) {
        if (DRV_FAIL(cuMemUnmap(base + i * kChunk, kChunk))) frc = 1;
    }
    for (size_t i = 0; i < handles.size(); ++i) {
        if (DRV_FAIL(cuMemRelease(handles[i]))) frc = 1;
    }
    if (va_size > 0 && DRV_FAIL(cuMemAddressFree(base, va_size))) frc = 1;
    return finish(rc, frc != 0, false);
}

// ---------------------------------------------------------------- CUDA arrays

static float texel(size_t i) { return (float)(i % 4093) + 0.25f; }

static int check_texels(const std::vector<float> &got, const char *what) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] != texel(i)) {
            if (bad == 0) first = i;
            ++bad;
        }
    }
    if (bad != 0) {
        printf("TOUCH bad what=%s mismatches=%zu first=%zu got=%g want=%g\n", what, bad, first,
               (double)got[first], (double)texel(first));
        return 1;
    }
    printf("TOUCH ok what=%s texels=%zu\n", what, got.size());
    return 0;
}

// 16 rows in, 16 rows out of a 2D array.
static int touch_array2d(cudaArray_t a) {
    const size_t rows = 16, wbytes = k2DW * sizeof(float);
    std::vector<float> src(k2DW * rows), dst(k2DW * rows, -1.0f);
    for (size_t i = 0; i < src.size(); ++i) src[i] = texel(i);
    if (RT_FAIL(cudaMemcpy2DToArray(a, 0, 0, src.data(), wbytes, wbytes, rows,
                                    cudaMemcpyHostToDevice))) {
        printf("TOUCH error stage=copy_in\n");
        return 1;
    }
    if (RT_FAIL(cudaMemcpy2DFromArray(dst.data(), wbytes, a, 0, 0, wbytes, rows,
                                      cudaMemcpyDeviceToHost))) {
        printf("TOUCH error stage=copy_out\n");
        return 1;
    }
    return check_texels(dst, "array2d");
}

// 2 slices in, 2 slices out of a 3D array.
static int touch_array3d(cudaArray_t a) {
    const size_t slices = 2;
    std::vector<float> src(k3DW * k3DH * slices), dst(k3DW * k3DH * slices, -1.0f);
    for (size_t i = 0; i < src.size(); ++i) src[i] = texel(i);
    cudaMemcpy3DParms in;
    memset(&in, 0, sizeof(in));
    in.srcPtr = make_cudaPitchedPtr(src.data(), k3DW * sizeof(float), k3DW, k3DH);
    in.dstArray = a;
    in.extent = make_cudaExtent(k3DW, k3DH, slices);  // elements, as an array takes part
    in.kind = cudaMemcpyHostToDevice;
    if (RT_FAIL(cudaMemcpy3D(&in))) {
        printf("TOUCH error stage=copy_in\n");
        return 1;
    }
    cudaMemcpy3DParms out;
    memset(&out, 0, sizeof(out));
    out.srcArray = a;
    out.dstPtr = make_cudaPitchedPtr(dst.data(), k3DW * sizeof(float), k3DW, k3DH);
    out.extent = make_cudaExtent(k3DW, k3DH, slices);
    out.kind = cudaMemcpyDeviceToHost;
    if (RT_FAIL(cudaMemcpy3D(&out))) {
        printf("TOUCH error stage=copy_out\n");
        return 1;
    }
    return check_texels(dst, "array3d");
}

static int run_array(const char *mode, bool three_d, size_t max_bytes) {
    cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
    std::vector<cudaArray_t> arrays;
    size_t free0 = 0, total0 = 0;
    bool have_free0 = cudaMemGetInfo(&free0, &total0) == cudaSuccess;
    if (!have_free0) cudaGetLastError();
    long long first_delta = -1;
    Loop loop;
    while (loop.bytes + kChunk <= max_bytes && loop.chunks < kMaxChunks) {
        cudaArray_t a = NULL;
        cudaError_t e;
        if (three_d) {
            e = cudaMalloc3DArray(&a, &desc, make_cudaExtent(k3DW, k3DH, k3DD), 0);
        } else {
            e = cudaMallocArray(&a, &desc, k2DW, k2DH, 0);
        }
        if (e != cudaSuccess) {
            loop.end((int)e, rt_name(e), "refused");
            cudaGetLastError();
            break;
        }
        arrays.push_back(a);
        if (loop.chunks == 0 && have_free0) {
            size_t f1 = 0, t1 = 0;
            if (cudaMemGetInfo(&f1, &t1) == cudaSuccess) {
                if (free0 >= f1) first_delta = (long long)(free0 - f1);
            } else {
                cudaGetLastError();
            }
        }
        loop.bytes += kChunk;  // nominal: 256 MiB of texels per array
        ++loop.chunks;
    }

    char extra[128];
    snprintf(extra, sizeof(extra), "first_delta=%lld", first_delta);
    print_result(mode, loop, max_bytes, extra);

    int rc = 0;
    if (!arrays.empty()) {
        if ((three_d ? touch_array3d(arrays[0]) : touch_array2d(arrays[0])) != 0) rc = 1;
    } else {
        printf("TOUCH error stage=no_array\n");
        rc = 1;
    }
    int frc = 0;
    for (size_t i = 0; i < arrays.size(); ++i) {
        if (RT_FAIL(cudaFreeArray(arrays[i]))) frc = 1;
    }
    return finish(rc, frc != 0, false);
}

// ---------------------------------------------------------------- two devices

struct DevFill {
    int dev = 0;
    size_t max_bytes = 0;
    Loop loop;
    size_t total = 0;
    size_t free_b = 0;
    int mi = 0;
    std::vector<void *> ptrs;
};

// cudaMalloc chunks on f->dev until refused or the hard stop; runs on any
// thread (cudaSetDevice is per thread). Prints nothing.
static void fill_device(DevFill *f) {
    cudaError_t e = cudaSetDevice(f->dev);
    if (e == cudaSuccess) e = cudaFree(0);
    if (e != cudaSuccess) {
        f->loop.end((int)e, rt_name(e), "setdevice_error");
        cudaGetLastError();
        return;
    }
    while (f->loop.bytes + kChunk <= f->max_bytes && f->loop.chunks < kMaxChunks) {
        void *p = NULL;
        e = cudaMalloc(&p, kChunk);
        if (e != cudaSuccess) {
            f->loop.end((int)e, rt_name(e), "refused");
            cudaGetLastError();
            break;
        }
        f->ptrs.push_back(p);
        f->loop.bytes += kChunk;
        ++f->loop.chunks;
    }
    e = cudaMemGetInfo(&f->free_b, &f->total);
    f->mi = (int)e;
    if (e != cudaSuccess) cudaGetLastError();
}

static void device_ids(int dev, char *uuid, size_t ulen, char *pci, size_t plen) {
    snprintf(uuid, ulen, "unknown");
    snprintf(pci, plen, "unknown");
    cudaDeviceProp prop;
    memset(&prop, 0, sizeof(prop));
    if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess) {
        const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
        snprintf(uuid, ulen,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                 u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
                 u[14], u[15]);
    } else {
        cudaGetLastError();
    }
    if (cudaDeviceGetPCIBusId(pci, (int)plen, dev) != cudaSuccess) {
        snprintf(pci, plen, "unknown");
        cudaGetLastError();
    }
}

// One more chunk on `dev` after both devices are full: it must be refused too.
// Returns the error (0 if it was granted; then it is kept in f->ptrs to be freed).
static int again(DevFill *f) {
    if (cudaSetDevice(f->dev) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, kChunk);
    if (e == cudaSuccess) {
        f->ptrs.push_back(p);
        return 0;
    }
    cudaGetLastError();
    return (int)e;
}

static int run_twodev(const char *mode, bool threaded, size_t max_bytes) {
    int n = 0;
    if (RT_FAIL(cudaGetDeviceCount(&n))) return 1;
    printf("INFO device_count=%d\n", n);
    if (n < 2) {
        printf("RESULT mode=%s device_count=%d error=need_two_devices\n", mode, n);
        return 1;
    }
    DevFill f[2];
    for (int d = 0; d < 2; ++d) {
        f[d].dev = d;
        f[d].max_bytes = max_bytes;
    }
    if (threaded) {
        // The main thread makes device 0 current first, then a second thread
        // fills device 1 while the main thread fills device 0.
        if (RT_FAIL(cudaSetDevice(0))) return 1;
        if (RT_FAIL(cudaFree(0))) return 1;
        std::thread t(fill_device, &f[1]);
        fill_device(&f[0]);
        t.join();
    } else {
        fill_device(&f[0]);
        fill_device(&f[1]);
    }
    int again0 = again(&f[0]);
    int again1 = again(&f[1]);

    for (int d = 0; d < 2; ++d) {
        char uuid[64], pci[64];
        device_ids(d, uuid, sizeof(uuid), pci, sizeof(pci));
        printf("RESULTDEV dev=%d bytes=%zu chunks=%d err=%d errname=%s stop=%s total=%zu free=%zu "
               "memgetinfo_err=%d uuid=%s pci=%s max_bytes=%zu again_err=%d\n",
               d, f[d].loop.bytes, f[d].loop.chunks, f[d].loop.err, f[d].loop.errname,
               f[d].loop.stop, f[d].total, f[d].free_b,
               f[d].mi, uuid, pci, max_bytes, d == 0 ? again0 : again1);
    }
    printf("RESULT mode=%s threaded=%d device_count=%d bytes0=%zu bytes1=%zu again0_err=%d "
           "again1_err=%d\n",
           mode, threaded ? 1 : 0, n, f[0].loop.bytes, f[1].loop.bytes, again0, again1);
    fflush(stdout);

    int rc = 0;
    for (int d = 0; d < 2; ++d) {
        if (RT_FAIL(cudaSetDevice(d))) {
            rc = 1;
            continue;
        }
        int frc = 0;
        for (size_t i = 0; i < f[d].ptrs.size(); ++i) {
            if (RT_FAIL(cudaFree(f[d].ptrs[i]))) frc = 1;
        }
        if (frc != 0) {
            printf("FREE error dev=%d\n", d);
            rc = 1;
        }
        char tag[32];
        snprintf(tag, sizeof(tag), "VERIFYDEV dev=%d", d);
        if (verify(false, tag) != 0) rc = 1;
    }
    printf("DONE rc=%d\n", rc);
    return rc;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr,
                "usage: %s cudaMalloc|cuMemAlloc|cudaMallocPitch|cudaMallocManaged|cudaMallocAsync|"
                "cudaMemPool|cuMemCreate|cudaMallocArray|cudaMalloc3DArray|twodev|twodev-thread|info "
                "[MAX_BYTES]\n",
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
    if (strcmp(mode, "twodev") == 0) return run_twodev(mode, false, max_bytes);
    if (strcmp(mode, "twodev-thread") == 0) return run_twodev(mode, true, max_bytes);
    if (strcmp(mode, "cudaMallocAsync") == 0 || strcmp(mode, "cudaMemPool") == 0 ||
        strcmp(mode, "cuMemCreate") == 0 || strcmp(mode, "cudaMallocArray") == 0 ||
        strcmp(mode, "cudaMalloc3DArray") == 0) {
        if (RT_FAIL(cudaSetDevice(0))) return 1;
        if (RT_FAIL(cudaFree(0))) return 1;  // creates the primary context, made current
        if (strcmp(mode, "cudaMallocAsync") == 0) return run_stream_ordered(mode, false, max_bytes);
        if (strcmp(mode, "cudaMemPool") == 0) return run_stream_ordered(mode, true, max_bytes);
        if (strcmp(mode, "cuMemCreate") == 0) return run_vmm(mode, max_bytes);
        if (strcmp(mode, "cudaMallocArray") == 0) return run_array(mode, false, max_bytes);
        return run_array(mode, true, max_bytes);
    }

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
    Loop loop;
    size_t last_pitch = 0;

    while (loop.bytes + kChunk <= max_bytes && loop.chunks < kMaxChunks) {
        if (m == M_CUMEMALLOC) {
            CUdeviceptr d = 0;
            CUresult r = cuMemAlloc(&d, kChunk);  // cuda.h maps this to cuMemAlloc_v2
            if (r != CUDA_SUCCESS) {
                loop.end((int)r, drv_name(r), "refused");
                break;
            }
            drv_ptrs.push_back(d);
            loop.bytes += kChunk;
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
                loop.end((int)e, rt_name(e), "refused");
                cudaGetLastError();  // clear the (non-sticky) error
                break;
            }
            rt_ptrs.push_back(p);
            loop.bytes += got;
        }
        ++loop.chunks;
    }

    char extra[64];
    snprintf(extra, sizeof(extra), "pitch=%zu", last_pitch);
    print_result(mode, loop, max_bytes, extra);

    int rc = 0;
    for (size_t i = 0; i < rt_ptrs.size(); ++i) {
        if (RT_FAIL(cudaFree(rt_ptrs[i]))) rc = 1;
    }
    for (size_t i = 0; i < drv_ptrs.size(); ++i) {
        if (DRV_FAIL(cuMemFree(drv_ptrs[i]))) rc = 1;  // cuMemFree_v2
    }
    return finish(rc, rc != 0, m == M_MANAGED);
}
