#!/usr/bin/env python3
"""bench-python-start.py — what the wheel's start hook adds to `python -c pass`.

A benchmark, not a test: prints numbers, checks nothing. Issue 35's goal
is under 2 ms added to interpreter start when no vramcap variable is set.

It makes a virtual environment (target/bench-python-venv) with the package
laid out as the wheel lays it out (site-packages/vramcap/ and
site-packages/vramcap_autostart.pth; the shim too when one is built), then
runs `python -c pass` RUNS times in each of two states, interleaved so
that drift on a shared machine falls on both alike: with the .pth, and
with it renamed away. Reports the median, mean, 10th and 90th percentile
of each, their difference, and what site spends on the .pth file itself
(site.addpackage, timed in-process). `--set` adds a third state, VRAMCAP_LIMIT=8GiB,
whose cost is the restart under the shim (one more interpreter start).

    python3 scripts/bench-python-start.py [--runs 300] [--python python3] [--set]
    python3 scripts/bench-python-start.py --venv DIR   # a venv with the wheel installed
"""

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTH = "vramcap_autostart.pth"


def make_venv(python, where):
    if not os.path.exists(os.path.join(where, "bin", "python")):
        subprocess.run([python, "-m", "venv", "--without-pip", where], check=True)
    site = glob.glob(os.path.join(where, "lib", "python3*", "site-packages"))[0]
    pkg = os.path.join(site, "vramcap")
    shutil.rmtree(pkg, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "python", "vramcap"), pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "libvramcap.so"))
    for built in ("release", "debug"):
        shim = os.path.join(ROOT, "target", built, "libvramcap.so")
        if os.path.exists(shim):
            shutil.copyfile(shim, os.path.join(pkg, "libvramcap.so"))
            break
    shutil.copyfile(os.path.join(ROOT, "python", PTH), os.path.join(site, PTH))
    return os.path.join(where, "bin", "python"), site


def once(py, env):
    t = time.perf_counter_ns()
    subprocess.run([py, "-c", "pass"], env=env, check=True)
    return (time.perf_counter_ns() - t) / 1e6


def describe(name, ms):
    q = statistics.quantiles(ms, n=10)
    return (f"{name:<28} median {statistics.median(ms):7.2f} ms  mean {statistics.mean(ms):7.2f}  "
            f"p10 {q[0]:7.2f}  p90 {q[-1]:7.2f}  stdev {statistics.stdev(ms):5.2f}  (n={len(ms)})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--venv", help="a virtual environment with the wheel installed (else one is made)")
    ap.add_argument("--set", action="store_true", help="also time VRAMCAP_LIMIT=8GiB (the restart)")
    a = ap.parse_args()
    if a.venv:
        py = os.path.join(a.venv, "bin", "python")
        site = glob.glob(os.path.join(a.venv, "lib", "python3*", "site-packages"))[0]
    else:
        py, site = make_venv(a.python, os.path.join(ROOT, "target", "bench-python-venv"))
    pth, off = os.path.join(site, PTH), os.path.join(site, PTH + ".off")
    if not os.path.exists(pth):
        sys.exit(f"bench-python-start: {pth} is missing")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMCAP_") and k != "LD_PRELOAD"}
    states = ["with the .pth", "without the .pth"]
    if a.set:
        states.append("with the .pth, VRAMCAP_LIMIT")
    times = {s: [] for s in states}
    try:
        for _ in range(10):  # warm the page cache
            once(py, env)
        for i in range(a.runs):
            order = states if i % 2 == 0 else states[::-1]
            for s in order:
                if s == "without the .pth":
                    os.rename(pth, off)
                    try:
                        times[s].append(once(py, env))
                    finally:
                        os.rename(off, pth)
                elif s == "with the .pth":
                    times[s].append(once(py, env))
                else:
                    times[s].append(once(py, dict(env, VRAMCAP_LIMIT="8GiB")))
    finally:
        if os.path.exists(off):
            os.rename(off, pth)
    # What site does with the file at each start (open, read, compile and
    # run its lines), timed in the environment's own interpreter.
    probe = ("import site, timeit; n = 20000; "
             f"print(timeit.timeit(lambda: site.addpackage({site!r}, {PTH!r}, set()), number=n) / n * 1e6)")
    per = float(subprocess.run([py, "-c", probe], env=env, capture_output=True, text=True,
                               check=True).stdout)
    out = subprocess.run([py, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                         text=True, check=True).stdout.strip()
    print(f"python {out} ({py}), {a.runs} interleaved runs of `python -c pass` per state, "
          f"{os.cpu_count()} CPUs")
    for s in states:
        print(describe(s, times[s]))
    w, wo = statistics.median(times[states[0]]), statistics.median(times[states[1]])
    print(f"difference of medians (with - without): {w - wo:+.2f} ms ({w / wo:.3f}x)")
    print(f"site.addpackage of the .pth alone, no vramcap variable set: {per:.1f} us per interpreter start")
    if a.set:
        s = statistics.median(times[states[2]])
        print(f"VRAMCAP_LIMIT set (restart under the shim): {s - w:+.2f} ms over the unset start")


if __name__ == "__main__":
    main()
