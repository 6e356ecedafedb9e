"""What parking's entry gate costs (issue 34), measured side by side in one
run: ../park_gate_cost.cu in three variants, interleaved round by round
(ABC, then CBA), each figure the median over rounds of one run's median.

  none  no shim
  off   the shim, VRAMCAP_PARK unset (the forwarders are not handed out)
  park  the shim, VRAMCAP_PARK=manual (every unhooked function the program
        looks up is a forwarder; the hooks pass the gate too)

Used by ../../bench_gate.py (the table, with the PyTorch step of
bench_torch.py in the same three variants) and tests/test_park_gate.py (the
row with its bound). The cap is VRAMCAP_LIMIT=8GiB in both shim variants.
"""
from harness import as_float, median, ratio

VARIANTS = ("none", "off", "park")
LABELS = {"none": "no shim", "off": "shim, VRAMCAP_PARK unset", "park": "shim, VRAMCAP_PARK=manual"}
FIGURES = (
    ("launch_rt_ns", "empty kernel, <<<>>> (the runtime's launch), ns"),
    ("launch_drv_ns", "empty kernel, cuLaunchKernel through the runtime's entry point, ns"),
    ("ctx_current_ns", "cuCtxGetCurrent (unhooked, cheap), ns"),
    ("stream_query_ns", "cuStreamQuery of an idle stream (unhooked), ns"),
    ("alloc_pair_ns", "cuMemAlloc_v2+cuMemFree_v2 pair of 1 MiB (a cache hit under the shim), ns"),
)
LIBS = ("lib_launch", "lib_ctx", "lib_query")


def env_of(runner, shim, variant, park_move=None, **extra):
    """The environment of a variant; PARK_MOVE (VRAMCAP_PARK_MOVE, e.g.
    shim) for the park variant only (without parking it is refused)."""
    if variant == "none":
        return runner.env(**extra)
    if variant == "park":
        return runner.env(shim=shim, VRAMCAP_LIMIT="8GiB", VRAMCAP_PARK="manual",
                          VRAMCAP_PARK_MOVE=park_move, **extra)
    return runner.env(shim=shim, VRAMCAP_LIMIT="8GiB", VRAMCAP_PARK=None, **extra)


def measure(runner, prog, shim, rounds, iters=200000, inner_rounds=5, timeout=180, park_move=None, **extra):
    """{variant: {figure: [per-run figures], lib: set(files)}}, and the runs
    that failed (Results)."""
    got = {v: {} for v in VARIANTS}
    failed = []
    for rnd in range(1, rounds + 1):
        for v in (VARIANTS if rnd % 2 else VARIANTS[::-1]):
            r = runner.run("park-gate-cost round %d %s" % (rnd, v), [prog, iters, inner_rounds],
                           env=env_of(runner, shim, v, park_move, **extra), timeout=timeout)
            d = r.kv("RESULT")
            if r.rc != 0 or not d:
                failed.append(r)
                continue
            for k, _ in FIGURES:
                got[v].setdefault(k, []).append(as_float(d.get(k)))
            for k in LIBS:
                got[v].setdefault(k, set()).add(d.get(k))
    return got, failed


def measure_torch(runner, shim, python, script, rounds, timeout=240, park_move=None, **extra):
    """The PyTorch step (../bench_torch.py: an MLP, AdamW) in the three
    variants, interleaved: {variant: {"ms_per_step": [per-run figures]}},
    and the runs that failed."""
    got = {v: {} for v in VARIANTS}
    failed = []
    for rnd in range(1, rounds + 1):
        for v in (VARIANTS if rnd % 2 else VARIANTS[::-1]):
            r = runner.run("park-gate torch round %d %s" % (rnd, v), [python, script],
                           env=env_of(runner, shim, v, park_move, **extra), timeout=timeout)
            d = r.kv("BENCH")
            if r.rc != 0 or not d:
                failed.append(r)
                continue
            got[v].setdefault("ms_per_step", []).append(as_float(d.get("ms_per_step")))
    return got, failed


def figure(got, variant, key):
    """The median over rounds of one figure, None when no run gave it."""
    xs = [x for x in got[variant].get(key, []) if x is not None]
    return median(xs) if xs else None


def table(got, torch=None):
    """Markdown lines: each figure in the three variants, with the ratios
    (and the PyTorch step's, given TORCH from measure_torch)."""
    out = ["| what | %s | %s | %s | park / off | off / none | park / none |" % tuple(LABELS[v] for v in VARIANTS),
           "|---|---|---|---|---|---|---|"]
    for k, label in FIGURES:
        n, o, p = (figure(got, v, k) for v in VARIANTS)
        show = ["NA" if x is None else "%.2f" % x for x in (n, o, p)]
        out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            label, show[0], show[1], show[2], ratio(o, p, "%.3f"), ratio(n, o, "%.3f"), ratio(n, p, "%.3f")))
    if torch is not None:
        n, o, p = (figure(torch, v, "ms_per_step") for v in VARIANTS)
        show = ["NA" if x is None else "%.3f" % x for x in (n, o, p)]
        out.append("| PyTorch MLP training step (8×Linear(4096), AdamW, fp32), ms | %s | %s | %s | %s | %s | %s |" % (
            show[0], show[1], show[2], ratio(o, p, "%.3f"), ratio(n, o, "%.3f"), ratio(n, p, "%.3f")))
    out.append("")
    for v in VARIANTS:
        out.append("Pointers' files, %s: %s" % (LABELS[v], "; ".join(
            "%s=%s" % (k, ",".join(sorted(str(x) for x in got[v].get(k, ())))) for k in LIBS)))
    return out
