#!/usr/bin/env python3
"""What a framework's process holds on the GPU, for tests/test_held.py (issue 12).

  held.py MODE --cap BYTES [--max-bytes N]

Modes:
  torch            64 MiB torch.empty (uint8, each filled) until
                   torch.cuda.OutOfMemoryError, all kept; the caller sets
                   PYTORCH_CUDA_ALLOC_CONF for the allocator variants
  jax              JAX as it comes (preallocation, XLA_PYTHON_CLIENT_* left
                   alone), then 64 MiB jnp.zeros until an exception
                   (RESOURCE_EXHAUSTED expected), all kept
  cupy             64 MiB cupy.empty (filled) until OutOfMemoryError, with
                   CuPy's default pool
  cupy-async       the same after
                   cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
  torch-footprint  (run without the shim) torch.zeros(1, device='cuda') and nothing else

Capped modes first check that the total the process sees is at most --cap
(else they stop with an error: the shim is not capping, nothing large is
allocated uncapped); the fills stop at --max-bytes (default cap + 1 GiB)
whatever happens.

While holding what it got, the script prints
  HOLDING pid=P what=TAG free=F total=T    (the process's own view then:
                                          cudaMemGetInfo through the framework)
and waits for a line on stdin: the caller reads NVML's figure for the
process (nvidia-smi, from outside) meanwhile. Then the RESULT/RESULTKV
lines of result.py: bytes, oom (1 when the fill ended on the framework's
out-of-memory error), free/total (the view at the hold), handshake (1 when
stdin ended before the line came) and the framework's own figures.
Exit status as result.py: 0 ran to its end, 3 framework or GPU missing, 1 error.
"""
import argparse
import ctypes
import os
import sys

import result

CH = 64 << 20  # the fills' step


def hold(res, what, view):
    free, total = view
    res["free"], res["total"] = free, total
    print("HOLDING pid=%d what=%s free=%s total=%s" % (os.getpid(), what, free, total), flush=True)
    res["handshake"] = 0 if sys.stdin.readline() else 1


def guard(res, total, cap):
    res["total_start"] = total
    if not total or total > cap:
        raise RuntimeError("the process sees a total of %r bytes, above the cap %d: not capped, "
                           "nothing allocated" % (total, cap))


def fill(res, alloc, oom_types, max_bytes, is_oom=None):
    """alloc() until an exception or max_bytes; returns the kept objects."""
    keep = []
    res["oom"] = False
    res["stop"] = "limit"
    while (len(keep) + 1) * CH <= max_bytes:
        try:
            keep.append(alloc())
        except oom_types as e:
            res["exception_type"] = type(e).__name__
            res["exception_message"] = " ".join(str(e).split())[:400]
            res["oom"] = is_oom(e) if is_oom else True
            res["stop"] = "refused"
            break
    res["chunks"] = len(keep)
    res["bytes"] = len(keep) * CH
    return keep


# ---------------------------------------------------------------- PyTorch

def torch_mod():
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        raise result.Missing("import torch failed: %r" % (e,))
    if not torch.cuda.is_available():
        raise result.Missing("torch.cuda.is_available() is False")
    return torch


def run_torch(res, a):
    torch = torch_mod()
    res["alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    torch.zeros(1, device="cuda")
    guard(res, torch.cuda.mem_get_info()[1], a.cap)
    try:
        res["alloc_backend_async"] = torch.cuda.get_allocator_backend() == "cudaMallocAsync"
    except Exception:  # noqa: BLE001
        res["alloc_backend_async"] = None

    def alloc():
        t = torch.empty(CH, dtype=torch.uint8, device="cuda")
        t.fill_(0x5A)
        return t

    keep = fill(res, alloc, (torch.cuda.OutOfMemoryError,), a.max_bytes)
    torch.cuda.synchronize()
    res["allocated"] = torch.cuda.memory_allocated()
    res["reserved"] = torch.cuda.memory_reserved()
    hold(res, "filled", torch.cuda.mem_get_info())
    del keep


def run_torch_footprint(res, a):
    torch = torch_mod()
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    res["reserved"] = torch.cuda.memory_reserved()
    hold(res, "context", torch.cuda.mem_get_info())
    del x


# ---------------------------------------------------------------- JAX

def cu_view():
    """(free, total) from cuMemGetInfo in the primary context of device 0,
    which is XLA's; (None, None) when that context is not active (retaining
    it would create a context of its own, which NVML would count) or a call
    fails. Through dlsym, so under the shim this is the shim's answer."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        dev = ctypes.c_int()
        flags, active = ctypes.c_uint(), ctypes.c_int()
        if cu.cuDeviceGet(ctypes.byref(dev), 0) != 0:
            return None, None
        if cu.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) != 0 \
                or not active.value:
            return None, None
        ctx = ctypes.c_void_p()
        if cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0:
            return None, None
        try:
            if cu.cuCtxPushCurrent_v2(ctx) != 0:
                return None, None
            f, t = ctypes.c_size_t(), ctypes.c_size_t()
            rc = cu.cuMemGetInfo_v2(ctypes.byref(f), ctypes.byref(t))
            cu.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
            return (f.value, t.value) if rc == 0 else (None, None)
        finally:
            cu.cuDevicePrimaryCtxRelease_v2(dev)
    except Exception:  # noqa: BLE001
        return None, None


def run_jax(res, a):
    try:
        import jax
        import jax.numpy as jnp
    except Exception as e:  # noqa: BLE001
        raise result.Missing("import jax failed: %r" % (e,))
    backend = jax.default_backend()
    res["backend"] = backend
    if backend not in ("gpu", "cuda") or not jax.devices():
        raise result.Missing("no GPU backend (default_backend=%r)" % (backend,))
    dev = jax.devices()[0]
    for k in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
              "XLA_PYTHON_CLIENT_ALLOCATOR"):
        res["env_" + k] = os.environ.get(k)
    jnp.zeros((1,), dtype=jnp.uint8).block_until_ready()
    # The total the process sees (cuMemGetInfo), else XLA's own limit.
    guard(res, cu_view()[1] or (dev.memory_stats() or {}).get("bytes_limit"), a.cap)

    def alloc():
        z = jnp.zeros((CH,), dtype=jnp.uint8)
        z.block_until_ready()
        return z

    def exhausted(e):
        m = str(e)
        return "RESOURCE_EXHAUSTED" in m or "out of memory" in m.lower()

    keep = fill(res, alloc, (Exception,), a.max_bytes, exhausted)
    st = dev.memory_stats() or {}
    for k in ("bytes_limit", "bytes_in_use", "bytes_reserved", "pool_bytes", "peak_bytes_in_use"):
        if isinstance(st.get(k), int):
            res[k] = st[k]
    hold(res, "filled", cu_view())
    del keep


# ---------------------------------------------------------------- CuPy

def run_cupy(res, a, use_async):
    try:
        import cupy
    except Exception as e:  # noqa: BLE001
        raise result.Missing("import cupy failed: %r" % (e,))
    try:
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        raise result.Missing("no CUDA device for cupy: %r" % (e,))
    if use_async:
        cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)
    res["async_pool"] = use_async
    cupy.zeros(1, dtype=cupy.uint8)
    guard(res, cupy.cuda.runtime.memGetInfo()[1], a.cap)

    def alloc():
        x = cupy.empty(CH, dtype=cupy.uint8)
        x.fill(0x5A)
        return x

    keep = fill(res, alloc, (cupy.cuda.memory.OutOfMemoryError,), a.max_bytes)
    cupy.cuda.runtime.deviceSynchronize()
    if not use_async:
        pool = cupy.get_default_memory_pool()
        res["pool_used_bytes"] = pool.used_bytes()
        res["pool_total_bytes"] = pool.total_bytes()
    hold(res, "filled", cupy.cuda.runtime.memGetInfo())
    del keep


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("torch", "jax", "cupy", "cupy-async", "torch-footprint"))
    ap.add_argument("--cap", type=int, default=4 << 30, help="the cap in force (bytes)")
    ap.add_argument("--max-bytes", type=int, default=None, help="hard stop of the fill (bytes)")
    a = ap.parse_args()
    if a.max_bytes is None:
        a.max_bytes = a.cap + (1 << 30)
    res = {"mode": a.mode, "pid": os.getpid(), "step": CH}
    body = {
        "torch": lambda r: run_torch(r, a),
        "jax": lambda r: run_jax(r, a),
        "cupy": lambda r: run_cupy(r, a, False),
        "cupy-async": lambda r: run_cupy(r, a, True),
        "torch-footprint": lambda r: run_torch_footprint(r, a),
    }[a.mode]
    return result.run(res, body)


if __name__ == "__main__":
    sys.exit(main())
