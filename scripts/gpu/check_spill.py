"""PyTorch training whose working set is larger than the cap, with spill.

Usage: check_spill.py [--layers N] [--width W] [--steps S]
Trains a deterministic MLP (fixed seed, TF32 off, deterministic algorithms)
and prints `RESULTKV loss=… checksum=… ms_per_step=… oom=0|1 max_proc_mib=…`,
where max_proc_mib is the largest device memory NVML reports for this process
during the run (nvmlDeviceGetComputeRunningProcesses: the driver's own count,
which the shim does not change). Run it without the shim for the reference
loss, and under the shim with a cap, with and without VRAMCAP_SPILL.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def proc_mib():
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == os.getpid():
                return (p.usedGpuMemory or 0) / 2**20
    except Exception:  # noqa: BLE001
        return -1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--width", type=int, default=6144)
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    import torch

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    layers = []
    for _ in range(a.layers):
        layers += [torch.nn.Linear(a.width, a.width), torch.nn.ReLU()]
    oom = 0
    loss_v = float("nan")
    checksum = float("nan")
    ms = float("nan")
    peak = 0.0
    try:
        model = torch.nn.Sequential(*layers).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(64, a.width, device="cuda")
        y = torch.randn(64, a.width, device="cuda")
        times = []
        for step in range(a.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            if step >= 2:
                times.append(time.perf_counter() - t0)
            peak = max(peak, proc_mib())
            loss_v = loss.item()
        times.sort()
        ms = 1000 * times[len(times) // 2]
        checksum = float(sum(p.double().sum().item() for p in model.parameters()))
    except torch.OutOfMemoryError as e:
        oom = 1
        print("OOM", str(e).splitlines()[0])
    params = sum(p.numel() for p in layers[0].parameters()) * a.layers
    print(f"RESULTKV loss={loss_v!r} checksum={checksum!r} ms_per_step={ms:.2f} oom={oom} "
          f"max_proc_mib={peak:.0f} working_set_mib={params * 4 * 4 / 2**20:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
