#!/usr/bin/env python3
"""Caps changed while a framework's process runs, for tests/test_live.py (issue 14).

  check_live.py MODE --cli PATH [--root DIR]

Run under `VRAMCAP_LIMIT=8GiB` (the script checks that the process sees a
total of 8 GiB first, else it stops before allocating anything large).

Modes:
  torch-outside  holds 1 GiB; `vramcap limit --pid <own pid> 2GiB` (the CLI
                 run as a separate process, without the shim); then
                 torch.cuda.mem_get_info()'s total, a 1.5 GiB tensor
                 (OutOfMemoryError expected), a 64 MiB one (fits); back to
                 8 GiB, the 1.5 GiB tensor fits; down to 2 GiB while holding
                 2.5 GiB (the CLI's line says "over the new cap"), then freed
                 and `vramcap limit --wait 10 2GiB` (exit 0)
  torch-inside   the same through the Python package (ROOT/python):
                 vramcap.set_limit/get_limit/memory_stats/limit(), and a
                 raise above the start-up cap (PermissionError expected)
  cupy           CuPy: memGetInfo's total after the CLI lowers the cap, a
                 1.5 GiB array refused (OutOfMemoryError), fits after raising
  jax            JAX with XLA_PYTHON_CLIENT_ALLOCATOR=platform (set by the
                 caller; its allocator then asks the driver per buffer): a
                 1.5 GiB array refused after lowering, fits after raising

Prints the RESULT/RESULTKV lines of result.py; exit 0 ran to its end,
3 framework or GPU missing, 1 error.
"""
import argparse
import os
import subprocess
import sys

import result

GiB = 1 << 30
MiB = 1 << 20
START = 8 * GiB
LOW = 2 * GiB
BIG = 3 * GiB // 2


def cli(res, key, args):
    """Runs `vramcap limit ARGS` without the shim; records rc and its line."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "VRAMCAP_LIMIT")}
    p = subprocess.run([res["_cli"], "limit"] + args, env=env, capture_output=True,
                       text=True, timeout=60)
    out = " ".join((p.stdout + p.stderr).split())
    res[key + "_rc"] = p.returncode
    res.setdefault("lines", {})[key] = out
    res[key + "_over"] = int("over the new cap" in out)
    return p.returncode


def attempt(res, key, alloc, oom, refusal):
    """Runs alloc(); records key=1 when the outcome is the one expected
    (refusal: alloc raised oom; else: it fit), 0 otherwise, and the error
    text. Returns what alloc gave, or None."""
    try:
        keep = alloc()
    except oom as e:
        res[key] = int(refusal)
        res.setdefault("errors", {})[key] = result.one_line(e)[:200]
        return None
    res[key] = int(not refusal)
    return keep


def refused(res, key, alloc, oom):
    """alloc() expected to raise oom."""
    return attempt(res, key, alloc, oom, True)


def fits(res, key, alloc, oom):
    """alloc() expected to fit."""
    return attempt(res, key, alloc, oom, False)


def start_total(res, total):
    res["total_start"] = total
    if total != START:
        raise RuntimeError("the process sees a total of %r bytes, not the 8 GiB cap: "
                           "not capped as expected, nothing large allocated" % (total,))


def torch_mode(res, inside):
    try:
        import torch
    except ImportError as e:
        raise result.Missing("torch: %s" % e)
    if not torch.cuda.is_available():
        raise result.Missing("torch.cuda is not available")
    torch.cuda.init()
    start_total(res, torch.cuda.mem_get_info()[1])
    oom = torch.cuda.OutOfMemoryError
    pid = str(os.getpid())

    def tensor(n):
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        t.fill_(1)
        torch.cuda.synchronize()
        return t

    if inside:
        sys.path.insert(0, os.path.join(res["_root"], "python"))
        import vramcap
        res["active"] = int(vramcap.is_active())
        res["limit_start"] = vramcap.get_limit(0)

        def lower():
            vramcap.set_limit(0, "2GiB")
            return 0

        def raise_back():
            vramcap.set_limit(0, START)
            return 0
    else:
        def lower():
            return cli(res, "lower", ["--pid", pid, "2GiB"])

        def raise_back():
            return cli(res, "raise", ["--pid", pid, "8GiB"])

    a = tensor(GiB)
    res["lower_ok"] = int(lower() == 0)
    res["total_low"] = torch.cuda.mem_get_info()[1]
    if inside:
        res["limit_low"] = vramcap.get_limit(0)
        st = vramcap.memory_stats(0)
        res["stats_limit"], res["stats_held"] = st["limit"], st["held"]
        res["stats_context"] = st["context"]
    refused(res, "refused_low", lambda: tensor(BIG), oom)
    small = fits(res, "small_fits", lambda: tensor(64 * MiB), oom)
    del small
    res["raise_ok"] = int(raise_back() == 0)
    res["total_back"] = torch.cuda.mem_get_info()[1]
    b = fits(res, "big_fits_back", lambda: tensor(BIG), oom)
    if inside:
        try:
            vramcap.set_limit(0, 9 * GiB)
            res["above_start"] = "allowed"
        except PermissionError as e:
            res["above_start"] = "PermissionError"
            res.setdefault("errors", {})["above_start"] = result.one_line(e)[:200]
        res["above_refused"] = int(res["above_start"] == "PermissionError")
        with vramcap.limit(0, "2GiB"):
            res["in_block"] = torch.cuda.mem_get_info()[1]
        res["after_block"] = torch.cuda.mem_get_info()[1]
    else:
        cli(res, "over", ["--pid", pid, "2GiB"])
        del b
        b = None
        torch.cuda.empty_cache()
        res["wait_rc"] = cli(res, "wait", ["--pid", pid, "--wait", "10", "2GiB"])
        cli(res, "back", ["--pid", pid, "8GiB"])
    del a, b
    res["peak_reserved"] = torch.cuda.max_memory_reserved()


def cupy_mode(res):
    try:
        import cupy
    except ImportError as e:
        raise result.Missing("cupy: %s" % e)
    pid = str(os.getpid())
    cupy.cuda.Device(0).use()
    oom = cupy.cuda.memory.OutOfMemoryError
    pool = cupy.get_default_memory_pool()

    def array(n):
        x = cupy.empty(n, dtype=cupy.uint8)
        x.fill(1)
        cupy.cuda.Device(0).synchronize()
        return x

    a = array(64 * MiB)
    start_total(res, cupy.cuda.runtime.memGetInfo()[1])
    res["lower_ok"] = int(cli(res, "lower", ["--pid", pid, "2GiB"]) == 0)
    res["total_low"] = cupy.cuda.runtime.memGetInfo()[1]
    x = array(GiB)
    refused(res, "refused_low", lambda: array(BIG), oom)
    pool.free_all_blocks()
    res["raise_ok"] = int(cli(res, "raise", ["--pid", pid, "8GiB"]) == 0)
    res["total_back"] = cupy.cuda.runtime.memGetInfo()[1]
    b = fits(res, "big_fits_back", lambda: array(BIG), oom)
    del a, b, x


def jax_mode(res):
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        raise result.Missing("jax: %s" % e)
    devs = [d for d in jax.devices() if d.platform == "gpu"]
    if not devs:
        raise result.Missing("jax has no GPU device")
    res["allocator"] = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "")
    pid = str(os.getpid())
    oom = Exception  # XlaRuntimeError (RESOURCE_EXHAUSTED) or a JaxRuntimeError

    def array(n):
        x = jnp.ones((n,), dtype=jnp.uint8)
        x.block_until_ready()
        return x

    a = array(GiB)
    res["lower_ok"] = int(cli(res, "lower", ["--pid", pid, "2GiB"]) == 0)
    refused(res, "refused_low", lambda: array(BIG), oom)
    res["refused_exhausted"] = int("RESOURCE_EXHAUSTED" in res.get("errors", {}).get("refused_low", "")
                                   or "out of memory" in res.get("errors", {}).get("refused_low", "").lower())
    res["raise_ok"] = int(cli(res, "raise", ["--pid", pid, "8GiB"]) == 0)
    b = fits(res, "big_fits_back", lambda: array(BIG), oom)
    del a, b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["torch-outside", "torch-inside", "cupy", "jax"])
    ap.add_argument("--cli", required=True)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    args = ap.parse_args()
    res = {"mode": args.mode, "_cli": args.cli, "_root": args.root}

    def body(r):
        if args.mode == "torch-outside":
            torch_mode(r, False)
        elif args.mode == "torch-inside":
            torch_mode(r, True)
        elif args.mode == "cupy":
            cupy_mode(r)
        else:
            jax_mode(r)

    return result.run(res, body)


if __name__ == "__main__":
    sys.exit(main())
