// probe_remap.cu — what each step of a tiered move costs on the real driver,
// without the shim: the parts a move does outside the stopped world
// (cuMemCreate, mapping at a scratch address) and inside it (the copy, the
// unmap of the block, the map and access of the new memory), for device and
// host memory and two block sizes, each the median of 5. Also whether a
// mapping can follow stream order: it cannot for linear memory
// (cuMemMapArrayAsync takes sparse arrays only), so every remap needs the
// world stopped. Prints PROBE lines. At most 1 GiB device and 1 GiB host
// memory at once (two handles of the larger size).
#include <cuda.h>
#include <algorithm>
#include <stdio.h>
#include <time.h>
#include <vector>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_ = 0; cuGetErrorName(r_, &s_); printf("PROBE fail=%s at=%d\n", s_ ? s_ : "?", __LINE__); return 1; } } while (0)

static double now() { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

static CUmemAllocationProp prop(bool host) {
    CUmemAllocationProp p = {};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = host ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    return p;
}

struct Times { std::vector<double> create, map_scratch, copy, unmap, map, release; };

// One move of a `bytes` block from `from_host` memory to the other kind,
// as the shim does it; the block's address ends mapped to the new memory.
static int one_move(size_t bytes, bool from_host, CUstream s, Times &t) {
    CUmemAccessDesc acc = {};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUmemAllocationProp po = prop(from_host), pn = prop(!from_host);
    CUmemGenericAllocationHandle old = 0, nu = 0;
    CUdeviceptr block = 0, scratch = 0;
    CK(cuMemCreate(&old, bytes, &po, 0));
    CK(cuMemAddressReserve(&block, bytes, 0, 0, 0));
    CK(cuMemMap(block, bytes, 0, old, 0));
    CK(cuMemSetAccess(block, bytes, &acc, 1));
    CK(cuMemsetD8Async(block, 7, bytes, s));
    CK(cuStreamSynchronize(s));
    // Outside the stopped world: stage.
    double a = now();
    CK(cuMemCreate(&nu, bytes, &pn, 0));
    double b = now();
    CK(cuMemAddressReserve(&scratch, bytes, 0, 0, 0));
    CK(cuMemMap(scratch, bytes, 0, nu, 0));
    CK(cuMemSetAccess(scratch, bytes, &acc, 1));
    double c = now();
    // Inside it: copy, unmap, map.
    CK(cuMemcpyDtoDAsync(scratch, block, bytes, s));
    CK(cuStreamSynchronize(s));
    double d = now();
    CK(cuMemUnmap(block, bytes));
    double e = now();
    CK(cuMemMap(block, bytes, 0, nu, 0));
    CK(cuMemSetAccess(block, bytes, &acc, 1));
    double f = now();
    // After: the scratch mapping and the old memory go.
    CK(cuMemUnmap(scratch, bytes));
    CK(cuMemAddressFree(scratch, bytes));
    CK(cuMemRelease(old));
    double g = now();
    unsigned char probe[2] = {0, 0};
    CK(cuMemcpyDtoH(probe, block + bytes - 2, 2));
    if (probe[0] != 7 || probe[1] != 7) { printf("PROBE fail=data %u %u\n", probe[0], probe[1]); return 1; }
    CK(cuMemUnmap(block, bytes));
    CK(cuMemAddressFree(block, bytes));
    CK(cuMemRelease(nu));
    t.create.push_back(b - a); t.map_scratch.push_back(c - b); t.copy.push_back(d - c);
    t.unmap.push_back(e - d); t.map.push_back(f - e); t.release.push_back(g - f);
    return 0;
}

int main() {
    CK(cuInit(0));
    CUdevice dev; CK(cuDeviceGet(&dev, 0));
    CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
    CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    const size_t sizes[] = {64ull << 20, 1ull << 30};
    for (size_t bytes : sizes) {
        for (int from_host = 0; from_host < 2; from_host++) {
            Times t;
            if (one_move(bytes, from_host, s, t)) return 1;  // warm-up
            t = Times();
            for (int i = 0; i < 5; i++) if (one_move(bytes, from_host, s, t)) return 1;
            double gib = (double)bytes / (1ull << 30);
            const char *dir = from_host ? "promote" : "demote";
            printf("PROBE %s_%zuMiB stage_create_ms=%.3f stage_map_ms=%.3f stop_copy_ms=%.3f stop_unmap_ms=%.3f stop_map_ms=%.3f after_ms=%.3f stop_ms_per_gib=%.2f remap_ms_per_gib=%.2f copy_gbps=%.1f\n",
                   dir, bytes >> 20, median(t.create) * 1e3, median(t.map_scratch) * 1e3, median(t.copy) * 1e3,
                   median(t.unmap) * 1e3, median(t.map) * 1e3, median(t.release) * 1e3,
                   (median(t.copy) + median(t.unmap) + median(t.map)) * 1e3 / gib,
                   (median(t.unmap) + median(t.map)) * 1e3 / gib, bytes / median(t.copy) / 1e9);
        }
    }
    printf("PROBE done=1\n");
    return 0;
}
