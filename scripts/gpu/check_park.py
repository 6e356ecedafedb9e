"""Parking's workloads on the real driver (run by tests/test_park.py).

  check_park.py notebook GIB   hold GIB GiB of float32 tensors (1 GiB each,
                               filled from a fixed seed), do a step (a sum
                               over all of them), print "STEP1 sum=S", then
                               "IDLE pid=P" and wait for a line on stdin; then
                               time the first CUDA call (a sum of the first
                               tensor: it resumes a parked process), print
                               "RESUMED seconds=T", do the step again and
                               print "STEP2 sum=S"; "RESULTKV same=0|1 ..."
  check_park.py exit GIB       hold GIB GiB, print "IDLE pid=P", wait for a
                               line on stdin, then exit normally without
                               another CUDA call of its own (while parked)
  check_park.py grab GIB       allocate GIB GiB (1 GiB tensors) and print
                               "RESULTKV got=BYTES oom=0|1", then exit
  check_park.py fill LEAVE_GIB allocate 1 GiB tensors until less than
                               LEAVE_GIB GiB are free, print "FILLED bytes=B",
                               then wait for a line on stdin and exit
  check_park.py managed MIB    cuMemAllocManaged MIB MiB (at most 1024),
                               write a pattern, print "IDLE pid=P", wait for a
                               line, check the pattern: "RESULTKV intact=0|1"
  check_park.py capture        begin a CUDA graph capture on a side stream,
                               print "IDLE pid=P", wait for a line, end it,
                               replay it: "RESULTKV replayed=0|1"
  check_park.py calls GIB      hold GIB GiB (1 GiB tensors of ones), print
                               "IDLE pid=P", wait for a line on stdin, then
                               make three calls that are no driver call of
                               the program's own (the shim's C ABI through
                               dlsym(RTLD_DEFAULT), and NVML's init and
                               device count through ctypes on
                               libnvidia-ml.so.1), each timed, then check
                               the tensors: "RESULTKV limit=L nvml=RC
                               count=N abi_s=T nvml_s=T intact=0|1"
  check_park.py jax GIB        "notebook" with JAX (no preallocation: set
                               XLA_PYTHON_CLIENT_PREALLOCATE=false): GIB
                               arrays of 1 GiB from a fixed key, the same
                               lines ("STEP1", "IDLE", "RESUMED", "STEP2",
                               "RESULTKV same=0|1 ...")
  check_park.py cycles GIB N   hold GIB GiB (1 GiB tensors from a fixed
                               seed, summed: "SUM0 sum=S"), then N times:
                               print "IDLE i" and wait for a line on stdin,
                               time the first CUDA call (it resumes a parked
                               process: "RESUMED i seconds=T") and sum again
                               ("SUM i sum=S"); last "RESULTKV same=0|1
                               cycles=N" (every sum equal to the first)
  check_park.py graph GIB      a CUDA graph captured by PyTorch (its
                               private memory pool: a 1 GiB input filled
                               from a fixed seed, GIB GiB of intermediates
                               and output made by the capture), replayed
                               and summed ("STEP1 sum=S"), then "IDLE
                               pid=P"; after a line on stdin the output is
                               summed as it was left (the first CUDA call:
                               it resumes a parked process), the graph
                               replayed and summed again: "RESULTKV
                               same=0|1 kept=0|1 ..." (kept: the output
                               read back before the replay equals STEP1)
  check_park.py train SEED LAYERS ROUNDS STEPS CPU_S DELAY_S
                               a deterministic training loop (fixed seed, an
                               MLP of LAYERS 8192x8192 layers, SGD with
                               momentum: 0.75 GiB a layer): wait DELAY_S
                               (a negative one: a line on stdin) before the
                               first CUDA call, then ROUNDS rounds
                               of STEPS steps, each round but the last
                               followed by CPU_S seconds without a CUDA call
                               ("ROUND i" after its GPU steps); "RESULTKV
                               oom=0|1 losses=SHA256 last=L rounds=R
                               wall_s=S" (the losses as repr, hashed)
Each step of "notebook" is deterministic: the two sums of a run that was
parked between them are equal to each other and to a run never parked.
"""

import ctypes
import os
import sys
import time


def notebook(gib):
    import torch

    g = torch.Generator(device="cuda").manual_seed(1234)
    n = (1 << 30) // 4
    keep = [torch.rand(n, device="cuda", generator=g) for _ in range(gib)]
    torch.cuda.synchronize()

    def step():
        return sum(float(t.double().sum().item()) for t in keep)

    # The first CUDA call after the idle time resumes a parked process.
    return step_idle_step(gib, step, lambda: float(keep[0].double().sum().item()))


def step_idle_step(gib, step, first_call):
    """"notebook"'s lines: a step, idle until a line on stdin, the first
    call timed, the step again, and whether both steps agree."""
    s1 = step()
    print(f"STEP1 sum={s1!r}", flush=True)
    print(f"IDLE pid={os.getpid()} bytes={gib << 30}", flush=True)
    sys.stdin.readline()
    t0 = time.monotonic()
    first = first_call()
    resumed = time.monotonic() - t0
    print(f"RESUMED seconds={resumed:.3f}", flush=True)
    s2 = step()
    print(f"STEP2 sum={s2!r}", flush=True)
    print(f"RESULTKV same={int(s1 == s2)} first={first!r} resume_s={resumed:.3f} step1={s1!r} step2={s2!r}",
          flush=True)
    return 0


def jax_notebook(gib):
    """"notebook" with JAX, whose runtime has threads of its own (issue 43:
    a parked JAX process must stay parked while its program is idle)."""
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(1234)
    n = (1 << 30) // 4
    keep = [jax.random.uniform(jax.random.fold_in(key, i), (n,), dtype=jnp.float32) for i in range(gib)]
    for t in keep:
        t.block_until_ready()

    def step():
        return sum(float(jnp.sum(t)) for t in keep)

    # The first computation after the idle time resumes a parked process.
    return step_idle_step(gib, step, lambda: float(jnp.sum(keep[0])))


def cycles(gib, n):
    """Parked and resumed n times (issue 43: the first park, the later
    ones into host memory already resident, and nothing lost)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(4321)
    keep = [torch.rand((1 << 30) // 4, device="cuda", generator=g) for _ in range(gib)]
    torch.cuda.synchronize()

    def total():
        return sum(float(t.double().sum().item()) for t in keep)

    first = total()
    print(f"SUM0 sum={first!r}", flush=True)
    same = True
    for i in range(1, n + 1):
        print(f"IDLE {i} pid={os.getpid()}", flush=True)
        sys.stdin.readline()
        t0 = time.monotonic()
        float(keep[0][0].item())  # the first CUDA call: resumes
        print(f"RESUMED {i} seconds={time.monotonic() - t0:.3f}", flush=True)
        s = total()
        same = same and s == first
        print(f"SUM {i} sum={s!r}", flush=True)
    print(f"RESULTKV same={int(same)} cycles={n}", flush=True)
    return 0


def hold_then_exit(gib):
    import torch

    keep = [torch.ones((1 << 30) // 4, device="cuda") for _ in range(gib)]
    torch.cuda.synchronize()
    print(f"IDLE pid={os.getpid()} bytes={gib << 30} tensors={len(keep)}", flush=True)
    sys.stdin.readline()
    print("EXITING", flush=True)
    return 0


def grab(gib):
    import torch

    got, oom = [], 0
    try:
        for _ in range(gib):
            got.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
        torch.cuda.synchronize()
    except torch.OutOfMemoryError:
        oom = 1
    print(f"RESULTKV got={len(got) << 30} oom={oom}", flush=True)
    return 0


def fill(leave_gib):
    import torch

    got = []
    while True:
        free, _ = torch.cuda.mem_get_info()
        if free < (leave_gib + 1) << 30:
            break
        got.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    print(f"FILLED bytes={len(got) << 30} free={torch.cuda.mem_get_info()[0]}", flush=True)
    sys.stdin.readline()
    return 0


def train(seed, layers, rounds, steps, cpu_s, delay_s):
    import hashlib

    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    print(f"READY pid={os.getpid()}", flush=True)
    if delay_s < 0:
        sys.stdin.readline()
    else:
        time.sleep(delay_s)
    t0 = time.monotonic()
    losses, done, oom = [], 0, 0
    try:
        torch.manual_seed(seed)
        width = 8192
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width, bias=False), torch.nn.Tanh())
                                      for _ in range(layers)]).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        g = torch.Generator(device="cuda").manual_seed(seed)
        for r in range(rounds):
            for _ in range(steps):
                x = torch.randn(512, width, device="cuda", generator=g)
                loss = (model(x) - x).pow(2).mean()
                opt.zero_grad(set_to_none=False)
                loss.backward()
                opt.step()
                losses.append(repr(float(loss.item())))
            done += 1
            print(f"ROUND {r} loss={losses[-1]} t={time.monotonic() - t0:.3f}", flush=True)
            if r + 1 < rounds:
                end = time.monotonic() + cpu_s  # the CPU phase: no CUDA call
                n = 0
                while time.monotonic() < end:
                    n += sum(i * i for i in range(10000)) & 1
    except torch.OutOfMemoryError:
        oom = 1
    digest = hashlib.sha256(",".join(losses).encode()).hexdigest()[:16]
    last = losses[-1] if losses else "none"
    print(f"RESULTKV oom={oom} losses={digest} last={last} rounds={done} steps={len(losses)} "
          f"wall_s={time.monotonic() - t0:.3f}", flush=True)
    return 3 if oom else 0


def calls(gib):
    """A parked process's calls that skip the driver's hooks (issue 42,
    item 4): each must have the process resumed, not wait for good."""
    import torch

    keep = [torch.ones((1 << 30) // 4, device="cuda") for _ in range(gib)]
    torch.cuda.synchronize()
    print(f"IDLE pid={os.getpid()} bytes={gib << 30}", flush=True)
    sys.stdin.readline()
    t0 = time.monotonic()
    abi = ctypes.CDLL(None)
    abi.vramcap_get_limit.restype = ctypes.c_uint64
    limit = abi.vramcap_get_limit(0)
    abi_s = time.monotonic() - t0
    t0 = time.monotonic()
    nv = ctypes.CDLL("libnvidia-ml.so.1")
    count = ctypes.c_uint(0)
    rc = nv.nvmlInit_v2()
    if rc == 0:
        rc = nv.nvmlDeviceGetCount_v2(ctypes.byref(count))
    nvml_s = time.monotonic() - t0
    intact = int(all(float(t.sum().item()) == float((1 << 30) // 4) for t in keep))
    print(f"RESULTKV limit={limit} nvml={rc} count={count.value} abi_s={abi_s:.3f} nvml_s={nvml_s:.3f} "
          f"intact={intact}", flush=True)
    return 0


def cuda():
    lib = ctypes.CDLL("libcuda.so.1")
    for name in ("cuInit", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuMemAllocManaged",
                 "cuMemsetD32_v2", "cuMemcpyDtoH_v2", "cuCtxSynchronize"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def managed(mib):
    mib = min(mib, 1024)
    lib = cuda()
    ctx = ctypes.c_void_p()
    assert lib.cuInit(0) == 0
    assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert lib.cuCtxSetCurrent(ctx) == 0
    ptr = ctypes.c_uint64()
    rc = lib.cuMemAllocManaged(ctypes.byref(ptr), ctypes.c_size_t(mib << 20), 1)
    assert rc == 0, rc
    words = (mib << 20) // 4
    assert lib.cuMemsetD32_v2(ptr, 0x5CA1AB1E, ctypes.c_size_t(words)) == 0
    assert lib.cuCtxSynchronize() == 0
    print(f"IDLE pid={os.getpid()} bytes={mib << 20}", flush=True)
    sys.stdin.readline()
    buf = (ctypes.c_uint32 * 1024)()
    rc = lib.cuMemcpyDtoH_v2(buf, ptr, ctypes.c_size_t(4096))
    intact = int(rc == 0 and all(w == 0x5CA1AB1E for w in buf))
    print(f"RESULTKV intact={intact} rc={rc}", flush=True)
    return 0


def capture():
    import torch

    x = torch.ones(1 << 20, device="cuda")
    y = torch.zeros_like(x)
    s = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        graph.capture_begin()
        y.copy_(x * 2)
        print(f"IDLE pid={os.getpid()} bytes=0", flush=True)
        sys.stdin.readline()
        graph.capture_end()
    graph.replay()
    torch.cuda.synchronize()
    print(f"RESULTKV replayed={int(float(y.sum().item()) == 2.0 * (1 << 20))}", flush=True)
    return 0


def graph(gib):
    """A graph's private pool parked and resumed (issue 43, done-when 7:
    CUDA-graph memory pools move with the rest)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(2468)
    x = torch.rand((1 << 30) // 4, device="cuda", generator=g)
    layers = max(gib, 1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream, as PyTorch asks
        for _ in range(2):
            y = x
            for k in range(layers):
                y = torch.sin(y) * 0.5 + x * (k + 1)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = x
        for k in range(layers):
            y = torch.sin(y) * 0.5 + x * (k + 1)
    graph.replay()
    torch.cuda.synchronize()

    def total():
        return float(y.double().sum().item())

    s1 = total()
    print(f"STEP1 sum={s1!r}", flush=True)
    print(f"IDLE pid={os.getpid()} bytes={(layers + 1) << 30}", flush=True)
    sys.stdin.readline()
    t0 = time.monotonic()
    kept = total()  # the first CUDA call: resumes
    resumed = time.monotonic() - t0
    print(f"RESUMED seconds={resumed:.3f}", flush=True)
    graph.replay()
    torch.cuda.synchronize()
    s2 = total()
    print(f"STEP2 sum={s2!r}", flush=True)
    print(f"RESULTKV same={int(s1 == s2)} kept={int(kept == s1)} resume_s={resumed:.3f} step1={s1!r} "
          f"step2={s2!r}", flush=True)
    return 0


def main():
    mode = sys.argv[1]
    if mode == "cycles":
        return cycles(int(sys.argv[2]), int(sys.argv[3]))
    if mode == "train":
        a = sys.argv[2:]
        return train(int(a[0]), int(a[1]), int(a[2]), int(a[3]), float(a[4]), float(a[5]))
    arg = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    return {"notebook": notebook, "exit": hold_then_exit, "grab": grab, "fill": fill, "managed": managed,
            "capture": lambda _: capture(), "calls": calls, "jax": jax_notebook,
            "graph": graph}[mode](arg)


if __name__ == "__main__":
    sys.exit(main())
