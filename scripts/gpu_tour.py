#!/usr/bin/env python3
"""The README's tour, from a real run on the GPU machine (not a check: it
prints what it saw).

  python3 scripts/gpu_tour.py --artefacts .gpu --out "$OUT"

Five CUDA programs under vramcap at once (scripts/gpu/tour_workload.py: a
PyTorch loop swinging between 2 and 6 GiB under an 8 GiB cap; two PyTorch
processes in a 6 GiB group, the second refused; JAX under 4 GiB; CuPy
spilling past 2 GiB to host memory), then `vramcap top` recorded in a 120x32
terminal for 12 s (scripts/gpu/pty_capture.py), `vramcap stat` and an
exporter scrape. Writes OUT/tour-top.bin (draw it with
`scripts/render-terminal.py 120 32 tour-top.bin top.png`), OUT/tour-stat.txt,
OUT/tour-metrics.txt and OUT/tour.log.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_SRC = os.path.join(HERE, "gpu")


def wait_for(path, prefix, seconds):
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        with open(path, errors="replace") as f:
            if any(l.startswith(prefix) for l in f):
                return True
        time.sleep(0.1)
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artefacts", required=True)
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp")
    ap.add_argument("--python", default=os.environ.get("PYTHON") or sys.executable)
    a = ap.parse_args()
    cli = os.path.join(os.path.realpath(a.artefacts), "vramcap")
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="vramcap-tour.")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "VRAMCAP_LIMIT")}
    env["VRAMCAP_STATS_DIR"] = os.path.join(work, "stats")
    log = open(os.path.join(a.out, "tour.log"), "w")
    procs = []
    metrics = ""
    workload = os.path.join(GPU_SRC, "tour_workload.py")
    starts = [
        ("train", ["--limit", "8GiB"], ["train", "2", "6"]),
        ("group-a", ["--limit", "6GiB", "--group", "train"], ["hold", "4"]),
        ("group-b", ["--limit", "6GiB", "--group", "train"], ["greedy", "4"]),
        ("jax", ["--limit", "4GiB"], ["jax"]),
        ("cupy", ["--limit", "2GiB", "--spill", "host", "--spill-limit", "4GiB"], ["cupy", "3"]),
    ]
    try:
        for name, opts, args in starts:
            out = os.path.join(work, name + ".out")
            p = subprocess.Popen([cli, "run"] + opts + ["--", a.python, workload] + args, env=env,
                                 stdin=subprocess.PIPE, stdout=open(out, "w"), stderr=log, start_new_session=True)
            procs.append(p)
            wait_for(out, "READY", 60)
            log.write("%s: %s\n" % (name, open(out).read()))
            log.flush()
        r = subprocess.run([a.python, os.path.join(GPU_SRC, "pty_capture.py"), "120", "32", "12",
                            os.path.join(a.out, "tour-top.bin"), "--", cli, "top", "--interval", "0.5"],
                           env=env, capture_output=True, text=True, timeout=120)
        log.write(r.stdout + r.stderr + "top exit: %d\n" % r.returncode)
        stat = subprocess.run([cli, "stat"], env=env, capture_output=True, text=True, timeout=30)
        with open(os.path.join(a.out, "tour-stat.txt"), "w") as f:
            f.write(stat.stdout)
        log.write(stat.stderr)
        errf = os.path.join(work, "exporter.err")
        exp = subprocess.Popen([cli, "exporter", "--listen", "127.0.0.1:0"], env=env, stderr=open(errf, "w"),
                               stdout=subprocess.DEVNULL, start_new_session=True)
        procs.append(exp)
        url = None
        for _ in range(100):
            m = re.search(r"listening on (http\S*)", open(errf).read())
            if m:
                url = m.group(1)
                break
            time.sleep(0.1)
        metrics = urllib.request.urlopen(url, timeout=30).read().decode() if url else ""
        with open(os.path.join(a.out, "tour-metrics.txt"), "w") as f:
            f.write(metrics)
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # vramcap run and its program
                except OSError:
                    p.kill()
                p.wait()
        log.close()
    print(open(os.path.join(a.out, "tour-stat.txt")).read())
    print("metric samples: %d" % sum(1 for l in metrics.splitlines() if l.startswith("vramcap_")))
    top = os.path.join(a.out, "tour-top.bin")
    print("%s: %s" % (top, "%d bytes" % os.path.getsize(top) if os.path.exists(top) else "missing"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
