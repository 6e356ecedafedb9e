#!/usr/bin/env python3
"""PyTorch check for vramcap (run under LD_PRELOAD=libvramcap.so VRAMCAP_LIMIT=...).

Allocates 256 MiB uint8 tensors until torch.OutOfMemoryError (or a hard stop),
records memory_allocated / memory_reserved at that point, frees everything, then
runs a 2048x2048 float32 matmul on the GPU and compares it with the CPU result.

The caller may set PYTORCH_CUDA_ALLOC_CONF (e.g. expandable_segments:True or
backend:cudaMallocAsync); the script reports the allocator backend torch uses
(alloc_backend_async=1 for cudaMallocAsync) and, with the native backend, how
many of the segments at the out-of-memory point are expandable
(expandable_seen=1 when any is).

Prints one line `RESULT {json}` and one flat line `RESULTKV key=value ...` on
stdout (the suite parses the flat line). Exit status: 0 when the script
ran to the end (whatever it measured), 1 on an unexpected error, 3 when torch
could not be imported or CUDA is not available.

Usage: check_torch.py [--max-bytes N]
"""
import argparse
import os
import sys
import time

import result
from result import CHUNK


def check(res, args):
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        raise result.Missing("import torch failed: %r" % (e,))
    res["torch_version"] = torch.__version__
    if not torch.cuda.is_available():
        raise result.Missing("torch.cuda.is_available() is False")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError

    dev = torch.device("cuda", 0)
    res["device_name"] = torch.cuda.get_device_name(0)
    free, total = torch.cuda.mem_get_info(0)
    res["total"] = int(total)
    res["free_before"] = int(free)

    chunks = []
    t0 = time.time()
    while (len(chunks) + 1) * CHUNK <= args.max_bytes:
        try:
            chunks.append(torch.empty(CHUNK, dtype=torch.uint8, device=dev))
        except oom_type as e:
            res["oom"] = True
            res["oom_message"] = str(e).strip().splitlines()[0][:400] if str(e).strip() else ""
            break
    res["alloc_seconds"] = round(time.time() - t0, 3)
    try:
        backend = str(torch.cuda.get_allocator_backend())
    except Exception as e:  # noqa: BLE001
        backend = "unknown"
        res["alloc_backend_error"] = repr(e)[:300]
    res["alloc_backend"] = backend
    res["alloc_backend_async"] = backend == "cudaMallocAsync"
    res["expandable_seen"] = None
    if backend == "native":
        try:
            segs = torch.cuda.memory_snapshot()
            res["segments"] = len(segs)
            res["expandable_segments"] = sum(1 for sg in segs if sg.get("is_expandable"))
            if segs and "is_expandable" in segs[0]:
                res["expandable_seen"] = res["expandable_segments"] > 0
        except Exception as e:  # noqa: BLE001
            res["snapshot_error"] = repr(e)[:300]
    res["chunks"] = len(chunks)
    res["bytes"] = len(chunks) * CHUNK
    res["allocated"] = int(torch.cuda.memory_allocated(0))
    res["reserved"] = int(torch.cuda.memory_reserved(0))
    try:
        f2, t2 = torch.cuda.mem_get_info(0)
        res["free_at_oom"] = int(f2)
        res["total_at_oom"] = int(t2)
    except Exception as e:  # noqa: BLE001
        res["mem_get_info_error"] = repr(e)[:300]

    del chunks
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    res["reserved_after_free"] = int(torch.cuda.memory_reserved(0))

    gen = torch.Generator().manual_seed(1234)
    a = torch.rand(2048, 2048, generator=gen, dtype=torch.float32) - 0.5
    b = torch.rand(2048, 2048, generator=gen, dtype=torch.float32) - 0.5
    ref = a @ b
    got = (a.to(dev) @ b.to(dev)).cpu()
    torch.cuda.synchronize()
    res["matmul_max_abs_diff"] = float((got - ref).abs().max().item())
    res["matmul_ok"] = bool(torch.allclose(got, ref, rtol=1e-3, atol=1e-3))


def main():
    ap = argparse.ArgumentParser()
    args = result.parse_args(ap)

    res = {"check": "torch", "chunk": CHUNK, "max_bytes": args.max_bytes,
           "oom": False, "matmul_ok": False, "completed": False,
           "env_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
           "env_alloc_conf2": os.environ.get("PYTORCH_ALLOC_CONF")}
    return result.run(res, lambda res: check(res, args),
                      error=lambda e: "%s: %s" % (type(e).__name__, e))


if __name__ == "__main__":
    sys.exit(main())
