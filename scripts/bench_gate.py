#!/usr/bin/env python3
"""What parking's entry gate costs (issue 34), side by side (a benchmark, not a test).

  python3 scripts/bench_gate.py --artefacts .gpu --out "$OUT" [--rounds 6]

DIR (--artefacts) holds libvramcap.so. Builds scripts/gpu/park_gate_cost.cu
with nvcc and runs it --rounds times in each of three variants, interleaved
(ABC, then CBA): no shim; the shim with VRAMCAP_PARK unset; the shim with
VRAMCAP_PARK=manual (both with VRAMCAP_LIMIT=8GiB). Each run measures, as the
median ns per call over its own 5 rounds: an empty kernel launched with
<<<>>>, the same kernel through cuLaunchKernel as the runtime's entry point
hands it out (a forwarder under parking), cuCtxGetCurrent and cuStreamQuery
(unhooked: forwarders under parking), and names the file each pointer lies
in. Then scripts/gpu/bench_torch.py (a PyTorch MLP training step, ms per
step) runs --torch-rounds times (default 4; 0: none) in the same three
variants (--python: one with torch). The table (OUT/bench-gate.md, also printed) gives each figure as the
median over rounds, and the ratios park/off, off/none and park/none; the
raw output goes to OUT/bench-gate.log. The GPU suite's row with a bound is
scripts/gpu/tests/test_park_gate.py (marker park). Exit status 0 when every
run gave its figures, else 1.
"""
import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))
import gate_cost  # noqa: E402
import harness  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artefacts", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=200000, help="launches per inner round (x10 for cuCtxGetCurrent)")
    ap.add_argument("--budget", type=float, default=480, help="no new run starts after this many seconds")
    ap.add_argument("--torch-rounds", type=int, default=4, help="rounds of the PyTorch step (0: none)")
    ap.add_argument("--python", default=os.environ.get("PYTHON") or sys.executable, help="python with torch")
    ap.add_argument("--nvcc", default=os.environ.get("NVCC"))
    ap.add_argument("--cuda-arch", default="sm_90")
    ap.add_argument("--park-move", choices=["checkpoint", "shim", "shim+checkpoint"], default=None,
                    help="VRAMCAP_PARK_MOVE of the parking variant (default: unset, the driver's checkpoint)")
    a = ap.parse_args()
    if a.rounds < 1 or a.iters < 1 or a.torch_rounds < 0:
        print("bench_gate: --rounds and --iters must be positive and --torch-rounds at least 0 "
              "(e.g. --rounds 6 --iters 200000 --torch-rounds 4)", file=sys.stderr)
        return 2

    bench = harness.Bench("bench_gate", a.artefacts, a.out, "bench-gate.log", a.budget,
                          env=dict(os.environ, VRAMCAP_STATS_DIR=tempfile.mkdtemp(prefix="vramcap-bench-gate-stats.")))
    if bench.shim is None:
        return 2
    shim, log, src, work, t0, rn = bench.shim, bench.log, bench.src, bench.work, bench.t0, bench.rn
    gpu, commit = bench.gpu, bench.commit
    header = "vramcap gate bench — %s — commit %s — GPU %s%s" % (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), commit, gpu,
        " — parking variant with VRAMCAP_PARK_MOVE=%s" % a.park_move if a.park_move else "")
    rn._log(header + "\nROUNDS=%d ITERS=%d\n" % (a.rounds, a.iters))
    print("[bench-gate] " + header, file=sys.stderr)
    try:
        prog = harness.Builds(src, work, harness.find_nvcc(a.nvcc), a.cuda_arch, log=log).build("park_gate_cost")
    except harness.BuildError as e:
        print("[bench-gate] %s" % e, file=sys.stderr)
        return 1
    got, failed = gate_cost.measure(rn, prog, shim, a.rounds, iters=a.iters, park_move=a.park_move)
    torch = None
    if a.torch_rounds:
        torch, more = gate_cost.measure_torch(rn, shim, a.python, os.path.join(src, "bench_torch.py"),
                                              a.torch_rounds, park_move=a.park_move)
        failed += more
    out = [header, "", "Median over %d rounds (interleaved ABC/CBA) of each run's median ns per call; "
           "%d launches a round (cuCtxGetCurrent: %d)." % (a.rounds, a.iters, 10 * a.iters), ""]
    if torch is not None:
        out[-1:-1] = ["The PyTorch step: bench_torch.py, %d rounds in the same order, ms per step." % a.torch_rounds]
    out += gate_cost.table(got, torch)
    out.append("Failed runs: %d (%s). Elapsed: %.0fs. Raw data: %s" % (
        len(failed), ", ".join(r.name for r in failed) or "none", time.monotonic() - t0, log))
    text = "\n".join(out) + "\n"
    with open(os.path.join(a.out, "bench-gate.md"), "w") as f:
        f.write(text)
    rn._log("\n=== summary ===\n" + text)
    print(text)
    missing = any(gate_cost.figure(got, v, k) is None for v in gate_cost.VARIANTS for k, _ in gate_cost.FIGURES)
    missing = missing or (torch is not None and any(
        gate_cost.figure(torch, v, "ms_per_step") is None for v in gate_cost.VARIANTS))
    return 0 if not failed and not missing else 1


if __name__ == "__main__":
    sys.exit(main())
