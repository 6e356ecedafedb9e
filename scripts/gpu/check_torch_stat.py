"""PyTorch under `vramcap run`, its counters read with `vramcap stat --json`.

Run as: vramcap run --limit CAP -- python3 check_torch_stat.py VRAMCAP_CLI
Allocates tensors through PyTorch's caching allocator, runs a matmul (which
makes cuBLAS allocate its workspace), then asks `vramcap stat --json --pid`
for this process's counters while it is running. Prints
`RESULTKV used=… reserved=… allocated=… extra=… peak=… allocs=… limit=…`.
"""

import json
import os
import subprocess
import sys


def main() -> int:
    cli = sys.argv[1]
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"torch missing: {e}")
        return 3
    if not torch.cuda.is_available():
        print("no cuda")
        return 3
    keep = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
    a = torch.randn(2048, 2048, device="cuda")
    b = a @ a
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    allocated = torch.cuda.memory_allocated()
    out = subprocess.run([cli, "stat", "--json", "--pid", str(os.getpid())],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        print(f"stat failed rc={out.returncode}: {out.stderr}")
        return 1
    doc = json.loads(out.stdout)
    procs = doc["processes"]
    if len(procs) != 1:
        print(f"expected one process, got {doc}")
        return 1
    dev = next(d for d in procs[0]["devices"] if d["gpu"] == 0)
    used = dev["used_bytes"]
    # What the cap counts beyond the allocations (VRAMCAP_COUNT=held): the
    # context, and pools and graphs (none here); "extra" is the rest.
    beyond = dev.get("context_bytes", 0) + dev.get("pool_bytes", 0) + dev.get("graph_bytes", 0)
    print("STAT", json.dumps(dev))
    print(f"RESULTKV used={used} reserved={reserved} allocated={allocated} "
          f"context={dev.get('context_bytes', 0)} extra={used - beyond - reserved} "
          f"peak={dev['peak_bytes']} allocs={dev['allocations']} limit={dev['limit_bytes']} "
          f"cmd_ok={int('check_torch_stat' in procs[0]['command'])}")
    del keep, b
    return 0


if __name__ == "__main__":
    sys.exit(main())
