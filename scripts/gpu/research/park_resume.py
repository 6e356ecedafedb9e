"""Does a parked PyTorch process resume on its next CUDA call, and if not,
where do its threads wait? (docs/design/parking-resume.md, step 4.)

  python3 scripts/gpu/research/park_resume.py OUT_DIR ART [ART...]

For each artefact folder ART (libvramcap.so and vramcap) and each case, a
worker under the shim (VRAMCAP_PARK=manual, VRAMCAP_LOG=debug) holds 1 GiB,
runs the case's kernel once, and idles; `vramcap park --pid` parks it; then
it runs the case again: "sum" (a kernel that has run) and "cumsum" (one
that has not: lazy module loading). Recorded in OUT_DIR/park-resume.txt:
park's answer, every thread's stack libraries while parked, whether the
call came back within 45 s and how long it took, and on a hang the stacks
again and `vramcap stat --json`. The worker's stderr (the shim's lines) is
kept as OUT_DIR/park-resume-N.err.
"""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import harness  # noqa: E402

WAIT_S = 45
CASES = ("sum", "cumsum")


def worker(case):
    import torch

    x = torch.rand((1 << 30) // 4, device="cuda", generator=torch.Generator(device="cuda").manual_seed(7))
    first = float(x.sum().item())
    print(f"IDLE pid={os.getpid()} sum={first!r}", flush=True)
    sys.stdin.readline()
    t0 = time.monotonic()
    v = float(x.sum().item()) if case == "sum" else float(x.cumsum(0)[-1].item())
    print(f"RESUMED seconds={time.monotonic() - t0:.3f} value={v!r} same={int(case != 'sum' or v == first)}",
          flush=True)
    return 0


def one(n, art, case, out_dir, report):
    stats = tempfile.mkdtemp(prefix="park-resume-")
    env = {k: v for k, v in os.environ.items() if k not in harness.UNSET}
    env.update(LD_PRELOAD=os.path.join(art, "libvramcap.so"), VRAMCAP_PARK="manual", VRAMCAP_LOG="debug",
               VRAMCAP_CACHE="off", VRAMCAP_STATS_DIR=stats)
    out, err = os.path.join(out_dir, "park-resume-%d.out" % n), os.path.join(out_dir, "park-resume-%d.err" % n)
    p = subprocess.Popen([sys.executable, __file__, "--worker", case], env=env, stdin=subprocess.PIPE,
                         stdout=open(out, "w"), stderr=open(err, "w"), start_new_session=True)
    say = lambda s: (report.write(s + "\n"), report.flush(), print(s, flush=True))  # noqa: E731
    say("== %d: %s, case %s" % (n, art, case))
    try:
        idle = harness.wait_line(out, "IDLE", 180, p)
        say("idle: " + (idle or "none"))
        if not idle:
            return "no-idle"
        cli = os.path.join(art, "vramcap")
        cenv = dict(env, LD_PRELOAD="")
        r = subprocess.run([cli, "park", "--pid", str(p.pid)], env=cenv, capture_output=True, text=True, timeout=180)
        say("park: rc=%d %s %s" % (r.returncode, r.stdout.strip(), r.stderr.strip()))
        say("parked stacks:\n  " + "\n  ".join(harness.thread_stacks(p.pid)))
        p.stdin.write(b"go\n")
        p.stdin.flush()
        t0 = time.monotonic()
        got = harness.wait_line(out, "RESUMED", WAIT_S, p)
        say("call: %s after %.1f s" % (got or "NOT BACK", time.monotonic() - t0))
        if not got:
            say("hung stacks:\n  " + "\n  ".join(harness.thread_stacks(p.pid)))
            r = subprocess.run([cli, "stat", "--json", "--pid", str(p.pid)], env=cenv, capture_output=True,
                               text=True, timeout=30)
            say("stat: " + " ".join(r.stdout.split())[:1500])
        return "resumed" if got else "hung"
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
        p.wait()
        with open(err, errors="replace") as f:
            tail = f.read()[-3000:]
        say("stderr tail:\n" + tail)


def main():
    if sys.argv[1] == "--worker":
        return worker(sys.argv[2])
    out_dir, arts = sys.argv[1], sys.argv[2:]
    os.makedirs(out_dir, exist_ok=True)
    results = []
    with open(os.path.join(out_dir, "park-resume.txt"), "w") as report:
        n = 0
        for art in arts:
            for case in CASES:
                results.append((art, case, one(n, art, case, out_dir, report)))
                n += 1
    for art, case, r in results:
        print("RESULT %s %s %s" % (art, case, r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
