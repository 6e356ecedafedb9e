"""Two PyTorch processes in one vramcap group (run by tests/test_group.py).

  check_group.py hold GIB     allocate GIB GiB, print "HELD pid=...", then wait
                              for a line on stdin (the script SIGKILLs it instead)
  check_group.py probe GIB HOLDER_PID
                              allocate 512 MiB chunks until torch.OutOfMemoryError,
                              print what it got and the NVML device memory of both
                              processes; then wait for a line on stdin (sent after
                              the holder is killed) and try to allocate GIB GiB,
                              retrying for up to 3 s
Lines: RESULTKV key=value ...
"""

import os
import sys
import time


def nvml_used(pids):
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        by_pid = {p.pid: (p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
        return {pid: by_pid.get(pid, 0) for pid in pids}
    except Exception as e:  # noqa: BLE001
        print("nvml error", e)
        return {pid: -1 for pid in pids}


def main() -> int:
    import torch

    mode = sys.argv[1]
    gib = float(sys.argv[2])
    torch.empty(1, device="cuda")  # context
    if mode == "hold":
        keep = [torch.empty(512 << 20, dtype=torch.uint8, device="cuda") for _ in range(int(gib * 2))]
        torch.cuda.synchronize()
        print(f"HELD pid={os.getpid()} bytes={sum(t.numel() for t in keep)}", flush=True)
        sys.stdin.readline()
        return 0
    holder = int(sys.argv[3])
    got = []
    oom = 0
    try:
        while len(got) < 64:
            got.append(torch.empty(512 << 20, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        oom = 1
    torch.cuda.synchronize()
    used = nvml_used([holder, os.getpid()])
    print(f"RESULTKV phase=shared got={len(got) * (512 << 20)} oom={oom} "
          f"nvml_holder={used[holder]} nvml_probe={used[os.getpid()]} nvml_sum={used[holder] + used[os.getpid()]}", flush=True)
    del got
    torch.cuda.empty_cache()
    print("READY", flush=True)
    sys.stdin.readline()  # the holder has been killed
    t0 = time.monotonic()
    ok = 0
    while time.monotonic() - t0 < 3.0:
        try:
            x = torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda")
            x.fill_(1)
            torch.cuda.synchronize()
            ok = 1
            break
        except torch.OutOfMemoryError:
            time.sleep(0.05)
    print(f"RESULTKV phase=after_kill ok={ok} seconds={time.monotonic() - t0:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
