// unmapped_query.cu — what the driver answers about an address whose VMM
// memory is unmapped, as a block parked by the shim's moves is (issue 43:
// the address stays reserved and nothing is mapped behind it while
// parked). A program linked with -lcuda calls the driver's exports
// directly, so a call the shim does not export reaches the driver while
// the process is parked; this says which such calls answer differently
// then. Without the shim. One 2 MiB block of device 0 is reserved, made,
// mapped and granted; each call below runs with it mapped, then again
// after cuMemUnmap (the reservation kept), and prints
//   QUERY op=NAME state=mapped|unmapped rc=ERROR value=...
// The calls: cuPointerGetAttribute (context, memory type, device ordinal,
// range start and size, mapped, buffer id), cuPointerGetAttributes (the
// same list at once), cuMemGetAddressRange_v2, cuMemGetAccess,
// cuTexObjectCreate of a linear resource over the block, and
// cuGraphAddMemsetNode and cuGraphAddMemcpyNode naming it (the graphs are
// never launched). Nothing reads or writes the unmapped range.
#include <cuda.h>
#include <stdio.h>
#include <string.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { printf("QUERY fail=%s at=%d\n", name(r_), __LINE__); return 1; } } while (0)

static const char *name(CUresult r) {
    const char *s = 0;
    cuGetErrorName(r, &s);
    return s ? s : "?";
}

static void attr(const char *state, const char *what, CUpointer_attribute a, CUdeviceptr p) {
    unsigned long long v = 0;  // wide enough for every attribute asked
    CUresult r = cuPointerGetAttribute(&v, a, p);
    printf("QUERY op=cuPointerGetAttribute:%s state=%s rc=%s value=0x%llx\n", what, state, name(r), v);
}

static void all(const char *state, CUdeviceptr va, CUdeviceptr other, size_t bytes) {
    attr(state, "context", CU_POINTER_ATTRIBUTE_CONTEXT, va);
    attr(state, "memory_type", CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va);
    attr(state, "device_ordinal", CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va);
    attr(state, "range_start", CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, va + 4096);
    attr(state, "range_size", CU_POINTER_ATTRIBUTE_RANGE_SIZE, va + 4096);
    attr(state, "mapped", CU_POINTER_ATTRIBUTE_MAPPED, va);
    attr(state, "buffer_id", CU_POINTER_ATTRIBUTE_BUFFER_ID, va);

    CUpointer_attribute as[3] = {CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_MAPPED,
                                 CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    int ordinal = -7;
    int mapped = -7;
    size_t size = 7;
    void *data[3] = {&ordinal, &mapped, &size};
    CUresult r = cuPointerGetAttributes(3, as, data, va);
    printf("QUERY op=cuPointerGetAttributes state=%s rc=%s value=ordinal:%d,mapped:%d,size:%zu\n", state, name(r),
           ordinal, mapped, size);

    CUdeviceptr base = 0;
    size_t len = 0;
    r = cuMemGetAddressRange(&base, &len, va + 4096);
    printf("QUERY op=cuMemGetAddressRange_v2 state=%s rc=%s value=base_offset:%lld,size:%zu\n", state, name(r),
           base ? (long long)(base - va) : -1LL, len);

    unsigned long long flags = 77;
    CUmemLocation loc = {};
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = 0;
    r = cuMemGetAccess(&flags, &loc, va);
    printf("QUERY op=cuMemGetAccess state=%s rc=%s value=%llu\n", state, name(r), flags);

    CUDA_RESOURCE_DESC res = {};
    res.resType = CU_RESOURCE_TYPE_LINEAR;
    res.res.linear.devPtr = va;
    res.res.linear.format = CU_AD_FORMAT_FLOAT;
    res.res.linear.numChannels = 1;
    res.res.linear.sizeInBytes = bytes;
    CUDA_TEXTURE_DESC tex = {};
    CUtexObject t = 0;
    r = cuTexObjectCreate(&t, &res, &tex, 0);
    printf("QUERY op=cuTexObjectCreate state=%s rc=%s value=%d\n", state, name(r), t != 0);
    if (r == CUDA_SUCCESS) cuTexObjectDestroy(t);

    CUcontext ctx = 0;
    cuCtxGetCurrent(&ctx);
    CUgraph g = 0;
    if (cuGraphCreate(&g, 0) == CUDA_SUCCESS) {
        CUDA_MEMSET_NODE_PARAMS ms = {};
        ms.dst = va;
        ms.value = 1;
        ms.elementSize = 4;
        ms.width = bytes / 4;
        ms.height = 1;
        CUgraphNode n = 0;
        r = cuGraphAddMemsetNode(&n, g, 0, 0, &ms, ctx);
        printf("QUERY op=cuGraphAddMemsetNode state=%s rc=%s value=%d\n", state, name(r), n != 0);
        CUDA_MEMCPY3D cp = {};
        cp.srcMemoryType = CU_MEMORYTYPE_DEVICE;
        cp.srcDevice = other;
        cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
        cp.dstDevice = va;
        cp.WidthInBytes = bytes;
        cp.Height = 1;
        cp.Depth = 1;
        n = 0;
        r = cuGraphAddMemcpyNode(&n, g, 0, 0, &cp, ctx);
        printf("QUERY op=cuGraphAddMemcpyNode state=%s rc=%s value=%d\n", state, name(r), n != 0);
        cuGraphDestroy(g);
    }
    r = cuCtxSynchronize();
    printf("QUERY op=cuCtxSynchronize state=%s rc=%s value=0\n", state, name(r));
}

int main() {
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUmemAllocationProp p = {};
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    size_t bytes = 0;
    CK(cuMemGetAllocationGranularity(&bytes, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    CK(cuMemCreate(&h, bytes, &p, 0));
    CK(cuMemAddressReserve(&va, bytes, 0, 0, 0));
    CK(cuMemMap(va, bytes, 0, h, 0));
    CUmemAccessDesc acc = {};
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemSetAccess(va, bytes, &acc, 1));
    CUdeviceptr other;
    CK(cuMemAlloc(&other, bytes));
    all("mapped", va, other, bytes);
    CK(cuMemUnmap(va, bytes));
    all("unmapped", va, other, bytes);
    CK(cuMemMap(va, bytes, 0, h, 0));
    CK(cuMemSetAccess(va, bytes, &acc, 1));
    CK(cuMemsetD32(va, 3, bytes / 4));
    CK(cuCtxSynchronize());
    printf("QUERY op=remapped state=mapped rc=CUDA_SUCCESS value=0\n");
    return 0;
}
