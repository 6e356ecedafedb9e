#!/usr/bin/env python3
"""CuPy check for vramcap (run under LD_PRELOAD=libvramcap.so VRAMCAP_LIMIT=...).

With CuPy's default memory pool (--mode default) or the stream-ordered
allocator (--mode async: cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc),
which allocates with cudaMallocAsync / cudaMallocFromPoolAsync), allocates
256 MiB cupy.empty arrays until cupy.cuda.memory.OutOfMemoryError (or a hard
stop), reports cupy.cuda.runtime.memGetInfo() and the pool's figures, frees
everything and verifies a small computation (through the same allocator).

Prints `RESULT {json}` and a flat `RESULTKV key=value ...` line on stdout.
Exit status: 0 when it ran to the end, 1 on an unexpected error, 3 when cupy
could not be imported.

Usage: check_cupy.py [--mode default|async] [--max-bytes N]
"""
import argparse
import sys
import time

import result
from result import CHUNK


def check(res, args):
    try:
        import numpy as np
        import cupy
    except Exception as e:  # noqa: BLE001
        raise result.Missing("import cupy failed: %r" % (e,))
    res["cupy_version"] = cupy.__version__
    free, total = cupy.cuda.runtime.memGetInfo()
    res["total"] = int(total)
    res["free_before"] = int(free)
    if args.mode == "async":
        pool = cupy.cuda.MemoryAsyncPool()
        cupy.cuda.set_allocator(pool.malloc)
        res["async_pool"] = True
    else:
        pool = cupy.get_default_memory_pool()
    res["pool_type"] = type(pool).__name__

    arrays = []
    t0 = time.time()
    while (len(arrays) + 1) * CHUNK <= args.max_bytes:
        try:
            arrays.append(cupy.empty((CHUNK,), dtype=cupy.uint8))
        except cupy.cuda.memory.OutOfMemoryError as e:
            res["oom"] = True
            res["oom_message"] = " ".join(str(e).split())[:400]
            break
        except Exception as e:  # noqa: BLE001
            # Some other error (e.g. a raw CUDARuntimeError): recorded, loop ends.
            res["other_error"] = ("%s: %s" % (type(e).__name__, " ".join(str(e).split())))[:400]
            res["other_error_status"] = getattr(e, "status", None)
            break
    res["alloc_seconds"] = round(time.time() - t0, 3)
    res["chunks"] = len(arrays)
    res["bytes"] = len(arrays) * CHUNK
    try:
        res["pool_used_bytes"] = int(pool.used_bytes())
        res["pool_total_bytes"] = int(pool.total_bytes())
    except Exception as e:  # noqa: BLE001
        res["pool_stats_error"] = repr(e)[:300]
    try:
        f2, t2 = cupy.cuda.runtime.memGetInfo()
        res["free_at_oom"] = int(f2)
        res["total_at_oom"] = int(t2)
    except Exception as e:  # noqa: BLE001
        res["memgetinfo_error"] = repr(e)[:300]

    del arrays
    try:
        cupy.cuda.Device(0).synchronize()
        pool.free_all_blocks()
        res["pool_total_after_free"] = int(pool.total_bytes())
    except Exception as e:  # noqa: BLE001
        res["pool_free_error"] = repr(e)[:300]

    n = 1 << 20
    # Copy round trip first (needs no kernel compilation), then kernels.
    host = np.arange(n, dtype=np.int64) * 5 - 3
    back = cupy.asnumpy(cupy.asarray(host))
    res["roundtrip_ok"] = bool(np.array_equal(back, host))
    x = cupy.arange(n, dtype=cupy.int64)
    got = int((x % 7).sum())
    want = int(np.sum(np.arange(n, dtype=np.int64) % 7))
    y = cupy.asnumpy(x * 3 + 1)
    ok_vec = bool(np.array_equal(y, np.arange(n, dtype=np.int64) * 3 + 1))
    cupy.cuda.Device(0).synchronize()
    res["sum_got"] = got
    res["sum_want"] = want
    res["kernel_ok"] = (got == want) and ok_vec
    res["compute_ok"] = res["roundtrip_ok"] and res["kernel_ok"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["default", "async"], default="default",
                    help="default: CuPy's MemoryPool; async: MemoryAsyncPool")
    args = result.parse_args(ap)

    res = {"check": "cupy", "mode": args.mode, "chunk": CHUNK, "max_bytes": args.max_bytes,
           "oom": False, "compute_ok": False, "completed": False,
           "async_pool": False}
    return result.run(res, lambda res: check(res, args))


if __name__ == "__main__":
    sys.exit(main())
