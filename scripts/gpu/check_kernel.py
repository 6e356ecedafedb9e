#!/usr/bin/env python3
"""A Jupyter kernel from `vramcap kernel install`, with PyTorch on the GPU.

Started by jupyter_client's KernelManager as a notebook server starts it
(the kernelspec found through JUPYTER_PATH / JUPYTER_DATA_DIR as the caller
set them); cells run through a kernel client:

1. `torch.cuda.mem_get_info()[1]` (the card's size as PyTorch sees it)
   and vramcap.is_active() in the kernel;
2. 256 MiB tensors until torch.OutOfMemoryError: how many MiB;
3. from a cell, vramcap.set_limit(0, LOWER) after freeing and
   torch.cuda.empty_cache(): the new get_limit and mem_get_info total.

Prints `RESULTKV key=value ...` (pid_match, active, total, filled_mib, oom,
lowered_limit, lowered_total); exit 0 when the kernel ran the cells.

Usage: check_kernel.py KERNEL_NAME LOWER_BYTES
"""

import sys

from jupyter_client.manager import KernelManager

from jupyter_cell import run_cell

FILL = """
import torch
xs = []
oom = 0
try:
    while len(xs) < 64:
        xs.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError:
    oom = 1
print(len(xs) * 256, oom)
del xs
torch.cuda.empty_cache()
"""


def cell(kc, code):
    out, err = run_cell(kc, code, timeout=300)
    if err:
        raise RuntimeError(f"cell {code!r}: {err[0]}")
    return out.split()


def main():
    name, lower = sys.argv[1], int(sys.argv[2])
    km = KernelManager(kernel_name=name)
    km.start_kernel()
    res = {}
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=300)
        pid, active, total = cell(kc, "import os, torch, vramcap\n"
                                      "print(os.getpid(), vramcap.is_active(), torch.cuda.mem_get_info()[1])")
        res.update(pid_match=int(pid == str(km.provisioner.pid)), active=active, total=total)
        filled, oom = cell(kc, FILL)
        res.update(filled_mib=filled, oom=oom)
        limit, total2 = cell(kc, f"vramcap.set_limit(0, {lower})\n"
                                 "print(vramcap.get_limit(0), torch.cuda.mem_get_info()[1])")
        res.update(lowered_limit=limit, lowered_total=total2)
        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)
    print("RESULTKV " + " ".join(f"{k}={v}" for k, v in res.items()), flush=True)


if __name__ == "__main__":
    main()
