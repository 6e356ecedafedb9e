import ctypes
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
p, n, rc = ctypes.c_uint64(), 0, 0
while n < 16:
    rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(256 << 20))
    if rc:
        break
    n += 1
print("allocs", n, "rc", rc)
