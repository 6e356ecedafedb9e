#!/usr/bin/env python3
"""The overhead of the vramcap shim, measured side by side (a benchmark, not a test).

  python3 scripts/gpu_bench.py --artefacts .gpu --out "$OUT"

DIR (--artefacts) holds libvramcap.so. Builds scripts/gpu/bench_ab.cu and
bench_alloc.cu with nvcc and runs:
  - bench_ab, 3 rounds: hooked vs the driver's own cuMemAlloc_v2+cuMemFree_v2
    in one process, with the shim (cache on; cache off; cache and counters
    off) and without it (the noise floor)
  - bench_alloc, --rounds rounds in ABBA order (without, cache off, counting
    allocations only, with; then the reverse): cuMemAlloc_v2+cuMemFree_v2 and
    cudaMalloc+cudaFree pairs at 4 KiB, 1 MiB, 64 MiB, 1 GiB
  - bench_torch.py (MLP training step), --torch-rounds rounds, ABBA
"With shim" is LD_PRELOAD=DIR/libvramcap.so VRAMCAP_LIMIT=--limit (16GiB).
Each figure is the median over rounds of each run's median. Writes the
tables to OUT/bench.md (and prints them), the raw output to OUT/bench.log.
Exit status 0 when every figure was measured for both variants, else 1.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))
import harness  # noqa: E402
from harness import median  # noqa: E402

SIZES = [4096, 1 << 20, 64 << 20, 1 << 30]
SIZE_NAMES = {4096: "4 KiB", 1 << 20: "1 MiB", 64 << 20: "64 MiB", 1 << 30: "1 GiB"}


def fmt(x, p=1):
    return "NA" if x is None else "%.*f" % (p, x)


def rat(a, b):
    return "NA" if a is None or b is None or a == 0 else "%.3f" % (b / a)


def delta(a, b, k=1):
    return "NA" if a is None or b is None else "%+.1f" % ((b - a) * k)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artefacts", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--torch-rounds", type=int, default=4)
    ap.add_argument("--limit", default="16GiB", choices=["1GiB", "2GiB", "4GiB", "8GiB", "16GiB"],
                    help="the cap with the shim (at most 16 GiB: the machine's safety rule)")
    ap.add_argument("--budget", type=float, default=420, help="no new run starts after this many seconds")
    ap.add_argument("--python", default=os.environ.get("PYTHON") or sys.executable)
    ap.add_argument("--nvcc", default=os.environ.get("NVCC"))
    ap.add_argument("--cuda-arch", default="sm_90")
    a = ap.parse_args()

    bench = harness.Bench("gpu_bench", a.artefacts, a.out, "bench.log", a.budget)
    if bench.shim is None:
        return 2
    shim, log, src, work, t0, rn = bench.shim, bench.log, bench.src, bench.work, bench.t0, bench.rn
    gpu, commit = bench.gpu, bench.commit
    rn.MIN_LEFT = 10
    header = "vramcap bench — %s — commit %s — GPU %s — with shim: VRAMCAP_LIMIT=%s" % (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), commit, gpu, a.limit)
    rn._log(header + "\nROUNDS=%d TORCH_ROUNDS=%d PYTHON=%s\n" % (a.rounds, a.torch_rounds, a.python))
    print("[bench] " + header, file=sys.stderr)

    V = {
        "base": rn.env(),
        "shim": rn.env(shim=shim, VRAMCAP_LIMIT=a.limit),
        "nostats": rn.env(shim=shim, VRAMCAP_LIMIT=a.limit, VRAMCAP_STATS="off", VRAMCAP_CACHE="off"),
        "nocache": rn.env(shim=shim, VRAMCAP_LIMIT=a.limit, VRAMCAP_CACHE="off"),
        "allocs": rn.env(shim=shim, VRAMCAP_LIMIT=a.limit, VRAMCAP_COUNT="allocations"),
    }
    b = harness.Builds(src, work, harness.find_nvcc(a.nvcc), a.cuda_arch, log=log)
    failed = 0

    def build(name, **kw):
        try:
            return b.build(name, **kw)
        except harness.BuildError as e:
            print("[bench] %s" % e, file=sys.stderr)
            return None

    def run(name, argv, env, timeout):
        nonlocal failed
        print("[bench] " + name, file=sys.stderr)
        r = rn.run(name, argv, env=env, timeout=timeout)
        if r.rc != 0:
            failed += 1
            print("[bench] %s failed: %s" % (name, r.note or r.describe()), file=sys.stderr)
        return r

    ab = {}  # (variant, size) -> [(hooked, real)]
    bench_ab = build("bench_ab", flags=[], links=["-ldl"])
    if bench_ab:
        for rnd in range(1, 4):
            for v in ("shim", "nocache", "nostats", "base"):
                r = run("bench_ab round %d %s" % (rnd, v), [bench_ab], V[v], 120)
                if r.rc == 0:
                    for d in r.lines("AB"):
                        ab.setdefault((v, int(d.get("size", 0))), []).append(
                            (d.get("hooked_median_us"), d.get("real_median_us")))

    data = {}  # (variant, api, size) -> [(median, mean)]
    info = {}  # variant -> {total}
    bench_alloc = build("bench_alloc")
    if bench_alloc:
        for rnd in range(1, a.rounds + 1):
            order = ["base", "nocache", "allocs", "shim"]
            for v in (order if rnd % 2 else order[::-1]):
                r = run("bench_alloc round %d %s" % (rnd, v), [bench_alloc], V[v], 120)
                if r.rc == 0:
                    for d in r.lines("BENCH"):
                        data.setdefault((v, d.get("api"), int(d.get("size", 0))), []).append(
                            (d.get("median_us"), d.get("mean_us")))
                    info.setdefault(v, set()).add(r.kv("INFO").get("total"))
    torch = {}
    for rnd in range(1, a.torch_rounds + 1):
        order = ["base", "allocs", "shim"]
        for v in (order if rnd % 2 else order[::-1]):
            r = run("bench_torch round %d %s" % (rnd, v), [a.python, os.path.join(src, "bench_torch.py")], V[v], 180)
            if r.rc == 0:
                torch.setdefault(v, []).append(r.kv("BENCH").get("ms_per_step"))
                info.setdefault("torch-" + v, set()).add(r.kv("INFO").get("total"))

    def col(v, api, size, i=0):
        return median(x[i] for x in data.get((v, api, size), []))

    def abcol(v, size, i):
        return median(x[i] for x in ab.get((v, size), []))

    missing = 0
    out = [header, "", "In one process, alternating pair by pair: cuMemAlloc_v2+cuMemFree_v2 through the shim's hooks "
           "vs the driver's own functions (median µs, median of 3 runs). Without the shim both columns are the "
           "driver's (noise floor).", "", "| variant | size | driver's own | through the hooks | ratio | delta µs |",
           "|---|---|---|---|---|---|"]
    labels = {"shim": "shim, defaults (cache on: hooked pairs are cache hits)",
              "nocache": "shim, VRAMCAP_CACHE=off (counters in the shared page)",
              "nostats": "shim, VRAMCAP_CACHE=off VRAMCAP_STATS=off", "base": "no shim (A/A)"}
    for v in ("shim", "nocache", "nostats", "base"):
        for s in SIZES:
            rl, hk = abcol(v, s, 1), abcol(v, s, 0)
            if v == "shim" and (rl is None or hk is None):
                missing += 1
            out.append("| %s | %s | %s | %s | %s | %s |" % (labels[v], SIZE_NAMES[s], fmt(rl, 2), fmt(hk, 2),
                                                          rat(rl, hk), delta(rl, hk)))
    out += ["", "Separate processes (each figure the median over rounds of one process's median; this machine's "
            "per-process variation is large, see the A/B table for the shim's own cost):", "",
            "| what | size | without shim | shim, cache off | shim, cache on | cache off / without | "
            "cache on / without |", "|---|---|---|---|---|---|---|"]
    for api, label in (("cuMemAlloc", "cuMemAlloc_v2+cuMemFree_v2 pair, median µs"),
                       ("cudaMalloc", "cudaMalloc+cudaFree pair, median µs")):
        for s in SIZES:
            x, n, y = col("base", api, s), col("nocache", api, s), col("shim", api, s)
            if None in (x, n, y):
                missing += 1
            out.append("| %s | %s | %s | %s | %s | %s | %s |" % (label, SIZE_NAMES[s], fmt(x), fmt(n), fmt(y),
                                                                rat(x, n), rat(x, y)))
    ta, tb, tc = (median(torch.get(v, [])) for v in ("base", "shim", "allocs"))
    if ta is None or tb is None:
        missing += 1
    out += ["", "| what | without shim | with shim (defaults) | ratio | delta µs |", "|---|---|---|---|---|",
            "| PyTorch MLP training step (8×Linear(4096), batch 256, AdamW, fp32), ms | %s | %s | %s | %s |" % (
                fmt(ta, 3), fmt(tb, 3), rat(ta, tb), delta(ta, tb, 1000)),
            "", "What counting everything held costs: the shim with VRAMCAP_COUNT=held (the default) against "
            "VRAMCAP_COUNT=allocations, same runs (medians; ratio held/allocations):", "",
            "| what | size | allocations only | held (default) | ratio | delta µs |", "|---|---|---|---|---|---|",
            "| PyTorch MLP training step, ms | — | %s | %s | %s | %s |" % (fmt(tc, 3), fmt(tb, 3), rat(tc, tb),
                                                                      delta(tc, tb, 1000))]
    for api in ("cuMemAlloc", "cudaMalloc"):
        for s in SIZES:
            x, y = col("allocs", api, s), col("shim", api, s)
            out.append("| %s pair (cache hit), median µs | %s | %s | %s | %s | %s |" % (
                api, SIZE_NAMES[s], fmt(x, 2), fmt(y, 2), rat(x, y), delta(x, y)))
    out += ["", "Means (median over rounds of each run's mean, µs):", "",
            "| what | size | without shim | with shim | ratio (with/without) | delta µs |", "|---|---|---|---|---|---|"]
    for api in ("cuMemAlloc", "cudaMalloc"):
        for s in SIZES:
            x, y = col("base", api, s, 1), col("shim", api, s, 1)
            out.append("| %s pair, mean µs | %s | %s | %s | %s | %s |" % (api, SIZE_NAMES[s], fmt(x), fmt(y),
                                                                         rat(x, y), delta(x, y)))
    out += ["", "Rounds: bench_alloc %d without / %d with shim (interleaved); PyTorch (ABBA order) %d without / %d with."
            % (len(data.get(("base", "cuMemAlloc", 4096), [])), len(data.get(("shim", "cuMemAlloc", 4096), [])),
               len(torch.get("base", [])), len(torch.get("shim", [])))]
    for v in ("base", "nocache", "shim", "torch-base", "torch-shim"):
        out.append("cudaMemGetInfo total seen by %s runs: %s" % (v, " ".join(sorted(str(t) for t in info.get(v, ())))
                                                                  or "none"))
    out.append("Failed runs: %d. Elapsed: %.0fs. Raw data: %s" % (failed, time.monotonic() - t0, log))
    text = "\n".join(out) + "\n"
    with open(os.path.join(a.out, "bench.md"), "w") as f:
        f.write(text)
    rn._log("\n=== summary ===\n" + text)
    print(text)
    return 0 if missing == 0 and failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
