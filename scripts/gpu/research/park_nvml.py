"""What nvidia-smi shows of a process while it is parked, sampled about
every 50 ms: the process's own figure (--query-compute-apps) beside the
GPU's used memory (--query-gpu), from before `vramcap park` to after the
resume. Answers whether a figure above the cap in the two-trainer row
with VRAMCAP_PARK_MOVE=shim+checkpoint is memory the driver holds or a
per-process figure that lags while the process is locked.

  python3 scripts/gpu/research/park_nvml.py ART MOVE GIB [PYTHON]

ART holds libvramcap.so and vramcap; MOVE is a VRAMCAP_PARK_MOVE value;
the workload is ../check_park.py notebook GIB run by PYTHON (default: the
one running this). Prints one "T ms pid=MiB gpu=MiB" line a sample, the
park's and resume's marks, and "SUMMARY ..." last.
"""
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def smi(*args):
    return subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"], capture_output=True,
                          text=True, timeout=20).stdout


def sample(pid):
    """(the process's MiB or None, the GPU's used MiB)."""
    own = None
    for line in smi("--query-compute-apps=pid,used_memory").splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) == 2 and cols[0] == str(pid) and cols[1].isdigit():
            own = (own or 0) + int(cols[1])
    used = smi("--query-gpu=memory.used").split()
    return own, int(used[0]) if used and used[0].isdigit() else None


def main():
    if len(sys.argv) < 4:
        print("usage: park_nvml.py ART MOVE GIB [PYTHON] (e.g. park_nvml.py .gpu shim+checkpoint 8)",
              file=sys.stderr)
        return 2
    art, move, gib = sys.argv[1], sys.argv[2], sys.argv[3]
    python = sys.argv[4] if len(sys.argv) > 4 else sys.executable
    stats = tempfile.mkdtemp(prefix="park-nvml.")
    env = dict(os.environ, LD_PRELOAD=os.path.abspath(os.path.join(art, "libvramcap.so")),
               VRAMCAP_PARK="manual", VRAMCAP_PARK_MOVE=move, VRAMCAP_STATS_DIR=stats, VRAMCAP_LOG="info")
    cli_env = dict(os.environ, VRAMCAP_STATS_DIR=stats)
    p = subprocess.Popen([python, os.path.join(HERE, "..", "check_park.py"), "notebook", gib], env=env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith("IDLE"):
            break
    t0 = time.monotonic()
    rows, marks, halt = [], [], threading.Event()

    def sampler():
        while not halt.is_set():
            own, used = sample(p.pid)
            rows.append((time.monotonic() - t0, own, used))

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    time.sleep(1.0)  # the figures before the park (a measure, not a synchronisation)
    marks.append((time.monotonic() - t0, "park begins"))
    r = subprocess.run([os.path.join(art, "vramcap"), "park", "--pid", str(p.pid)], env=cli_env,
                       capture_output=True, text=True, timeout=300)
    marks.append((time.monotonic() - t0, "park ends, rc=%d" % r.returncode))
    time.sleep(3.0)
    marks.append((time.monotonic() - t0, "go (the next CUDA call resumes)"))
    p.stdin.write("go\n")
    p.stdin.flush()
    for line in p.stdout:
        if line.startswith("RESUMED"):
            marks.append((time.monotonic() - t0, "resumed: " + line.strip()))
    p.wait(timeout=300)
    time.sleep(0.5)
    halt.set()
    th.join(30)
    events = sorted([(t, "%8.0f ms pid=%s gpu=%s" % (t * 1000, o, u)) for t, o, u in rows] +
                    [(t, "%8.0f ms --- %s" % (t * 1000, m)) for t, m in marks])
    for _, text in events:
        print(text)
    parked = [(o, u) for t, o, u in rows if marks[0][0] <= t <= marks[1][0]]
    print("SUMMARY move=%s park_s=%.3f samples=%d during the park: pid MiB max=%s, gpu MiB min=%s max=%s" % (
        move, marks[1][0] - marks[0][0], len(rows), max((o or 0 for o, _ in parked), default=None),
        min((u for _, u in parked if u is not None), default=None),
        max((u for _, u in parked if u is not None), default=None)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
