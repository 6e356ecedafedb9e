"""Two-GPU checks under the shim (issue 18), run by tests/test_two_gpu.py.

Usage: check_2gpu.py {context|live|peer} --cli PATH

PyTorch holds 256 MiB on cuda:0 and 512 MiB on cuda:1, then
- context: prints what `vramcap stat --json` counts on each device (the
  context's footprint, what is held) beside NVML's figure for the process
  on that GPU: each context must be charged to the device it lives on;
- live: lowers device 1's cap alone to 2 GiB with `vramcap limit --pid
  SELF -i <its UUID>`, then asks 1.5 GiB more on each device: device 1
  must refuse (OutOfMemoryError), device 0 (cap 8 GiB) must fit, and
  mem_get_info must report 2 GiB and 8 GiB totals.
- peer (run with VRAMCAP_PARK=manual, whose allocations are the shim's
  VMM blocks): enables peer access both ways (PyTorch does so for copies
  between GPUs), has a kernel on each GPU read the other's memory (a
  non-contiguous copy across devices), asks `vramcap park` for itself
  (refused: PyTorch maps NCCL, and the process uses two GPUs) and reads
  again: `before` and `after` are 1 when every read equals the CPU's.
Prints one `RESULTKV` line.
"""

import argparse
import json
import os
import subprocess
import sys

MIB = 1 << 20


def stat(cli):
    out = subprocess.run([cli, "stat", "--json", "--pid", str(os.getpid())],
                         capture_output=True, text=True, timeout=30)
    j = json.loads(out.stdout)
    return {d["gpu"]: d for d in j["processes"][0]["devices"]}


def nvml_by_uuid():
    try:
        import pynvml

        pynvml.nvmlInit()
        out = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                if p.pid == os.getpid():
                    out[uuid.lower()] = (p.usedGpuMemory or 0) // MIB
        return out
    except Exception:  # noqa: BLE001
        return {}


def peer(cli):
    """Kernels on each GPU read the other's blocks, before and after a park."""
    import torch

    kv = {"p2p": int(torch.cuda.can_device_access_peer(0, 1) and torch.cuda.can_device_access_peer(1, 0))}
    g = torch.Generator().manual_seed(7)
    host = [torch.rand(4096, 4096, generator=g) for _ in (0, 1)]
    want = [h.t().contiguous() for h in host]
    dev = [host[d].to(f"cuda:{d}") for d in (0, 1)]

    def reads():
        # A transposed (non-contiguous) tensor copied to the other GPU: with
        # peer access, a kernel there reads this GPU's memory.
        got = [dev[0].t().to("cuda:1"), dev[1].t().to("cuda:0")]
        for d in (0, 1):
            torch.cuda.synchronize(d)
        return all(torch.equal(got[i].cpu(), want[i]) for i in (0, 1))

    kv["before"] = int(reads())
    r = subprocess.run([cli, "park", "--pid", str(os.getpid())], capture_output=True, text=True, timeout=120)
    kv["park_rc"] = r.returncode
    kv["after"] = int(reads())
    kv["same"] = int(kv["before"] and kv["after"])
    print("RESULTKV " + " ".join(f"{k}={v}" for k, v in kv.items()), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["context", "live", "peer"])
    ap.add_argument("--cli", required=True)
    a = ap.parse_args()
    import torch

    held = [torch.empty(256 * MIB, dtype=torch.uint8, device="cuda:0"),
            torch.empty(512 * MIB, dtype=torch.uint8, device="cuda:1")]
    for d in (0, 1):
        torch.cuda.synchronize(d)
    kv = {}
    if a.mode == "peer":
        return peer(a.cli)
    if a.mode == "context":
        s = stat(a.cli)
        nv = nvml_by_uuid()
        for d in (0, 1):
            uuid = (s[d].get("uuid") or "").lower()
            kv[f"ctx{d}_mib"] = s[d]["context_bytes"] // MIB
            kv[f"used{d}_mib"] = s[d]["used_bytes"] // MIB
            kv[f"nvml{d}_mib"] = nv.get(uuid, -1)
            kv[f"uuid{d}"] = uuid or "none"
    else:
        uuid1 = "GPU-" + str(torch.cuda.get_device_properties(1).uuid)
        r = subprocess.run([a.cli, "limit", "--pid", str(os.getpid()), "-i", uuid1, "2GiB"],
                           capture_output=True, text=True, timeout=30)
        kv["limit_rc"] = r.returncode
        kv["total0"] = torch.cuda.mem_get_info(0)[1]
        kv["total1"] = torch.cuda.mem_get_info(1)[1]
        for d in (0, 1):
            try:
                held.append(torch.empty(1536 * MIB, dtype=torch.uint8, device=f"cuda:{d}"))
                kv[f"extra{d}"] = "fits"
            except torch.OutOfMemoryError:
                kv[f"extra{d}"] = "refused"
    print("RESULTKV " + " ".join(f"{k}={v}" for k, v in kv.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
