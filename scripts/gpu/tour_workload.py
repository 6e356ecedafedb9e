"""Workloads for the README's tour (run by scripts/gpu_tour.py under vramcap).

  tour_workload.py train GIB_LOW GIB_HIGH   PyTorch: a training-like loop whose
                                            working set swings between the two
                                            sizes (empty_cache between swings,
                                            so the driver sees it)
  tour_workload.py hold GIB                 PyTorch: hold GIB GiB
  tour_workload.py greedy GIB               PyTorch: 512 MiB chunks until
                                            OutOfMemoryError or GIB GiB
  tour_workload.py jax                      JAX: default preallocation, one matmul
  tour_workload.py cupy GIB                 CuPy: GIB GiB in 256 MiB chunks

Each prints "READY ..." once settled, then runs (train) or holds until a
line arrives on stdin or stdin closes.
"""

import math
import sys
import threading
import time


def wait_stdin(stop):
    sys.stdin.readline()
    stop.set()


def main() -> int:
    mode = sys.argv[1]
    stop = threading.Event()
    threading.Thread(target=wait_stdin, args=(stop,), daemon=True).start()
    if mode in ("train", "hold", "greedy"):
        import torch

        if mode == "hold":
            keep = torch.empty(int(float(sys.argv[2]) * 2**30), dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            print(f"READY held={keep.numel()}", flush=True)
        elif mode == "greedy":
            keep, oom = [], 0
            try:
                while len(keep) * 512 < float(sys.argv[2]) * 1024:
                    keep.append(torch.empty(512 << 20, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                oom = 1
            torch.cuda.synchronize()
            print(f"READY got={len(keep) * 512}MiB oom={oom}", flush=True)
        else:
            low, high = float(sys.argv[2]), float(sys.argv[3])
            w = torch.randn(4096, 4096, device="cuda")
            t0 = time.time()
            first = True
            while not stop.is_set():
                phase = (math.sin((time.time() - t0) * 0.8) + 1) / 2
                gib = low + (high - low) * phase
                n = int(gib * 2**30 / (4096 * 4 * 4))
                x = torch.randn(n, 4, 4096, device="cuda")
                y = (x[:256] @ w).sum()
                torch.cuda.synchronize()
                del x
                torch.cuda.empty_cache()
                if first:
                    print(f"READY loss={float(y):.3f}", flush=True)
                    first = False
                time.sleep(0.05)
            return 0
    elif mode == "jax":
        import jax.numpy as jnp

        a = jnp.ones((4096, 4096))
        print(f"READY sum={float((a @ a).sum()):.0f}", flush=True)
    elif mode == "cupy":
        import cupy

        keep = [cupy.empty(256 << 20, dtype=cupy.uint8) for _ in range(int(float(sys.argv[2]) * 4))]
        cupy.cuda.Device().synchronize()
        print(f"READY chunks={len(keep)}", flush=True)
    else:
        print(f"unknown mode {mode}", file=sys.stderr)
        return 2
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
