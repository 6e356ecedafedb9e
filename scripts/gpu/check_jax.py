#!/usr/bin/env python3
"""JAX check for vramcap (run under LD_PRELOAD=libvramcap.so VRAMCAP_LIMIT=...).

Modes:
  default   JAX's default allocator and preallocation. Runs a small computation,
            checks it, and reports jax.devices()[0].memory_stats() (bytes_limit
            is what XLA preallocated / may use).
  platform  Meant to be run with XLA_PYTHON_CLIENT_ALLOCATOR=platform in the
            environment (the caller sets it). Allocates 256 MiB arrays
            (jnp.zeros + block_until_ready, references kept) until an exception
            or the hard stop, then frees them and checks a small computation.
  growth    The same loop, meant to be run with XLA_PYTHON_CLIENT_PREALLOCATE=false
            (the default BFC allocator, growing on demand) and usually
            XLA_PYTHON_CLIENT_MEM_FRACTION set by the caller; reports
            env_preallocate_is_false and the BFC bytes_limit.

This script never sets XLA_PYTHON_CLIENT_* itself.
Prints `RESULT {json}` and a flat `RESULTKV key=value ...` line on stdout.
Exit status: 0 when it ran to the end, 1 on an unexpected error, 3 when jax
could not be imported or no GPU backend came up.

Usage: check_jax.py default|platform|growth [--max-bytes N]
"""
import argparse
import os
import sys
import time

import result
from result import CHUNK


def compute_check(jax, jnp, np):
    """Small computations with exactly known results; returns (ok, detail)."""
    x = jnp.arange(1 << 20, dtype=jnp.int32)
    s = int(jax.device_get(jnp.sum(x % 7)))
    want = int(np.sum(np.arange(1 << 20, dtype=np.int64) % 7))
    rng = np.random.default_rng(1234)
    a = (rng.random((512, 512), dtype=np.float32) - 0.5).astype(np.float32)
    b = (rng.random((512, 512), dtype=np.float32) - 0.5).astype(np.float32)
    got = np.asarray(jnp.matmul(jnp.asarray(a), jnp.asarray(b), precision="highest"))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    maxdiff = float(np.max(np.abs(got - ref)))
    ok = (s == want) and bool(np.allclose(got, ref, rtol=1e-3, atol=1e-3))
    return ok, {"sum_got": s, "sum_want": want, "matmul_max_abs_diff": maxdiff}


def stats_of(dev):
    try:
        st = dev.memory_stats()
    except Exception as e:  # noqa: BLE001
        return None, repr(e)[:300]
    if st is None:
        return None, "memory_stats() returned None"
    return {str(k): (int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and float(v).is_integer() else v)
            for k, v in dict(st).items()}, None


# memory_stats() figures also recorded on their own
STATS = ("bytes_limit", "bytes_reserved", "bytes_in_use", "peak_bytes_in_use", "pool_bytes")


def record_stats(res, dev, keys):
    """dev.memory_stats() into res["memory_stats"] (or the error), and those
    of its figures named in keys into res itself."""
    st, err = stats_of(dev)
    res["memory_stats"] = st
    if err:
        res["memory_stats_error"] = err
    if st:
        for k in keys:
            if k in st:
                res[k] = st[k]


def check(res, args):
    try:
        import numpy as np
        import jax
        import jax.numpy as jnp
    except Exception as e:  # noqa: BLE001
        raise result.Missing("import jax failed: %r" % (e,))
    res["jax_version"] = jax.__version__
    t0 = time.time()
    backend = jax.default_backend()
    devs = jax.devices()
    res["backend"] = backend
    res["devices"] = [str(d) for d in devs]
    res["startup_seconds"] = round(time.time() - t0, 3)
    if backend not in ("gpu", "cuda") or not devs:
        raise result.Missing("no GPU backend (default_backend=%r)" % (backend,))
    dev = devs[0]
    res["gpu_ok"] = True

    if args.mode == "default":
        ok, detail = compute_check(jax, jnp, np)
        res["compute_ok"] = ok
        res.update(detail)
        record_stats(res, dev, STATS + ("bytes_reservable_limit",))
    else:
        arrays = []
        t1 = time.time()
        while (len(arrays) + 1) * CHUNK <= args.max_bytes:
            try:
                z = jnp.zeros((CHUNK,), dtype=jnp.uint8)
                z.block_until_ready()
                arrays.append(z)
            except Exception as e:  # noqa: BLE001
                msg = str(e)
                res["exception_type"] = type(e).__name__
                res["exception_message"] = " ".join(msg.split())[:600]
                res["exception_resource_exhausted"] = ("RESOURCE_EXHAUSTED" in msg) or (
                    "out of memory" in msg.lower())
                break
        res["alloc_seconds"] = round(time.time() - t1, 3)
        res["exception_raised"] = "exception_type" in res
        res["chunks"] = len(arrays)
        res["bytes"] = len(arrays) * CHUNK
        record_stats(res, dev, STATS)
        for a in arrays:
            try:
                a.delete()
            except Exception:  # noqa: BLE001
                pass
        del arrays
        ok, detail = compute_check(jax, jnp, np)
        res["compute_ok"] = ok
        res.update(detail)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["default", "platform", "growth"])
    args = result.parse_args(ap, "the platform/growth allocation loop")

    res = {"check": "jax", "mode": args.mode, "chunk": CHUNK, "max_bytes": args.max_bytes,
           "compute_ok": False, "completed": False,
           "env_allocator": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR"),
           "env_preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
           "env_mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
           "env_allocator_is_platform": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR") == "platform",
           "env_preallocate_is_false": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "").lower()
           in ("false", "0")}
    return result.run(res, lambda res: check(res, args), nested=("memory_stats", "ms_"))


if __name__ == "__main__":
    sys.exit(main())
