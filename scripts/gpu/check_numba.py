#!/usr/bin/env python3
"""numba-cuda check for vramcap (run under LD_PRELOAD=libvramcap.so VRAMCAP_LIMIT=...).

Allocates 256 MiB uint8 device arrays (numba.cuda.device_array, references
kept) until an exception (numba raises CudaAPIError with the driver's
CUDA_ERROR_OUT_OF_MEMORY = 2; whichever driver binding numba-cuda uses, the
exception type, code and text are recorded) or the hard stop, reports the
context's memory info, frees everything (and flushes numba's deferred frees),
then checks a copy round trip and a @cuda.jit vector add.

Prints `RESULT {json}` and a flat `RESULTKV key=value ...` line on stdout.
Exit status: 0 when it ran to the end (whatever it measured), 1 on an
unexpected error, 3 when numba.cuda could not be imported or no GPU is there.

Usage: check_numba.py [--max-bytes N]
"""
import argparse
import sys
import time
import traceback

import result
from result import CHUNK
OOM_CODE = 2  # CUDA_ERROR_OUT_OF_MEMORY


def error_code(e):
    """The driver error code carried by a numba CudaAPIError, as an int, or None."""
    code = getattr(e, "code", None)
    if code is None:
        return None
    for conv in (int, lambda c: int(getattr(c, "value"))):
        try:
            return conv(code)
        except Exception:  # noqa: BLE001
            pass
    return None


def mem_info(cuda):
    """(free, total) of the current context, or (None, None)."""
    try:
        mi = cuda.current_context().get_memory_info()
        return int(mi[0]), int(mi[1])
    except Exception:  # noqa: BLE001
        return None, None


def flush_deferred(cuda, res):
    """Make numba free what is pending (it defers frees of dropped arrays)."""
    try:
        cuda.current_context().deallocations.clear()
    except Exception as e:  # noqa: BLE001
        res["flush_error"] = repr(e)[:300]


def check(res, args):
    try:
        import numpy as np
        from numba import cuda
    except Exception as e:  # noqa: BLE001
        raise result.Missing("import numba.cuda failed: %r" % (e,))
    try:
        import numba
        res["numba_version"] = numba.__version__
    except Exception:  # noqa: BLE001
        pass
    try:
        import numba_cuda  # the numba-cuda package, when it is that one
        res["numba_cuda_version"] = getattr(numba_cuda, "__version__", None)
    except Exception:  # noqa: BLE001
        pass
    try:
        from numba.cuda.cudadrv import driver as nbdriver
        res["driver_binding"] = "nvidia" if getattr(nbdriver, "USE_NV_BINDING", False) else (
            "ctypes" if hasattr(nbdriver, "USE_NV_BINDING") else "unknown")
    except Exception:  # noqa: BLE001
        res["driver_binding"] = "unknown"
    if not cuda.is_available():
        raise result.Missing("numba.cuda.is_available() is False")
    cuda.select_device(0)
    try:
        res["device_name"] = str(cuda.get_current_device().name)
    except Exception:  # noqa: BLE001
        pass
    free, total = mem_info(cuda)
    res["total"] = total
    res["free_before"] = free

    arrays = []
    t0 = time.time()
    while (len(arrays) + 1) * CHUNK <= args.max_bytes:
        try:
            arrays.append(cuda.device_array(CHUNK, dtype=np.uint8))
        except Exception as e:  # noqa: BLE001
            msg = " ".join(str(e).split())
            code = error_code(e)
            res["exception_raised"] = True
            res["exception_type"] = type(e).__module__ + "." + type(e).__name__
            res["exception_message"] = msg[:600]
            res["exception_code"] = code
            res["oom_error"] = (code == OOM_CODE) or ("OUT_OF_MEMORY" in msg.upper()) or (
                "out of memory" in msg.lower())
            break
    res["alloc_seconds"] = round(time.time() - t0, 3)
    res["chunks"] = len(arrays)
    res["bytes"] = len(arrays) * CHUNK
    f2, t2 = mem_info(cuda)
    res["free_at_oom"] = f2
    res["total_at_oom"] = t2

    del arrays
    flush_deferred(cuda, res)
    cuda.synchronize()
    f3, _ = mem_info(cuda)
    res["free_after_free"] = f3

    n = 1 << 20
    host = (np.arange(n, dtype=np.int64) * 5 - 3)
    back = cuda.to_device(host).copy_to_host()
    res["roundtrip_ok"] = bool(np.array_equal(back, host))

    try:
        @cuda.jit
        def vadd(a, b, c):
            i = cuda.grid(1)
            if i < c.size:
                c[i] = a[i] + b[i]

        a = (np.arange(n) % 1024).astype(np.float32)
        b = ((np.arange(n) * 7) % 1024).astype(np.float32) * np.float32(0.5)
        da = cuda.to_device(a)
        db = cuda.to_device(b)
        dc = cuda.device_array(n, dtype=np.float32)
        threads = 256
        blocks = (n + threads - 1) // threads
        vadd[blocks, threads](da, db, dc)
        cuda.synchronize()
        got = dc.copy_to_host()
        res["kernel_ok"] = bool(np.array_equal(got, a + b))
        if not res["kernel_ok"]:
            res["kernel_mismatches"] = int(np.count_nonzero(got != a + b))
    except Exception as e:  # noqa: BLE001
        res["kernel_error"] = ("%s: %s" % (type(e).__name__, " ".join(str(e).split())))[:600]
        traceback.print_exc()
        # numba-cuda 0.30 cannot import its JIT with NumPy 2.x
        # (np.row_stack is gone): that is the machine's Python
        # environment, not the shim. Compute on the device without the
        # JIT then: a device-to-device copy of a device array.
        if "row_stack" in res["kernel_error"]:
            res["jit_unavailable"] = True
            src = cuda.to_device(host)
            dst = cuda.device_array_like(src)
            dst.copy_to_device(src)
            cuda.synchronize()
            res["d2d_ok"] = bool(np.array_equal(dst.copy_to_host(), host))
    res["compute_ok"] = res["roundtrip_ok"] and (res["kernel_ok"] or (res.get("jit_unavailable", False) and res.get("d2d_ok", False)))


def main():
    ap = argparse.ArgumentParser()
    args = result.parse_args(ap)

    res = {"check": "numba", "chunk": CHUNK, "max_bytes": args.max_bytes,
           "exception_raised": False, "oom_error": False, "roundtrip_ok": False,
           "kernel_ok": False, "compute_ok": False, "completed": False}
    return result.run(res, lambda res: check(res, args))


if __name__ == "__main__":
    sys.exit(main())
