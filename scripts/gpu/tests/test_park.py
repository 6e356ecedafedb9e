"""Parking on the real driver (issue 34's done-when 1, 3 and 4): a notebook-like
process of 40 GiB parked by `vramcap park --idle` (the on-demand idle policy)
releases its GPU memory, a second process allocates 100 GiB, and the first
resumes on its next CUDA call with the same results; managed memory and a
graph capture are refused with their lines and lose nothing; a resume into a
GPU without room waits or refuses and never leaves the process stuck.

Sizes follow the machine's rules: one process's parked footprint is at most
40 GiB, managed memory at most 1 GiB, and no cap above 16 GiB is set (these
rows run without a cap: parking needs none).
"""
import os
import signal
import subprocess
import time

import pytest

import harness
from harness import GiB, as_float, as_int, mib

pytestmark = pytest.mark.park


class Proc:
    """A workload under the shim with its stdout and stderr in files."""

    def __init__(self, gpu, runner, work, name, args, **env):
        self.out = os.path.join(work, "park-%s.out" % name)
        self.err = os.path.join(work, "park-%s.err" % name)
        e = runner.env(shim=gpu.shim, **env)
        self.p = subprocess.Popen([gpu.python, gpu.script("check_park.py")] + args, env=e,
                                  stdin=subprocess.PIPE, stdout=open(self.out, "w"),
                                  stderr=open(self.err, "w"), start_new_session=True)

    def wait_line(self, prefix, seconds, path=None):
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            with open(path or self.out, errors="replace") as f:
                for l in f:
                    if l.startswith(prefix) or (path and prefix in l):
                        return l.strip()
            if self.p.poll() is not None:
                break
            time.sleep(0.1)
        return ""

    def go(self):
        try:
            self.p.stdin.write(b"go\n")
            self.p.stdin.flush()
        except OSError:
            pass

    def finish(self, seconds=300):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
        return open(self.out).read(), open(self.err).read()

    def kill(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()


def cli(gpu, runner, name, *args, timeout=300):
    return runner.run(name, [gpu.cli] + list(args), timeout=timeout)


@pytest.fixture(scope="session")
def control_sum(gpu, runner):
    """STEP1 of a 40 GiB notebook never parked (the reference result)."""
    r = runner.run("park: notebook never parked", [gpu.python, gpu.script("check_park.py"), "notebook", "40"],
                   env=runner.env(), timeout=600, stdin_text="go\n")
    return r.kv().get("step1")


def test_notebook_parked_by_idle_resumes_with_identical_results(gpu, runner, work, check, control_sum):
    check.title = "40 GiB notebook parked when idle, 100 GiB allocated meanwhile, resumed identical"
    nb = Proc(gpu, runner, work, "notebook", ["notebook", "40"], VRAMCAP_PARK="idle:5s", VRAMCAP_CACHE="off")
    try:
        idle = nb.wait_line("IDLE", 600)
        check.that(bool(idle), "the notebook holds 40 GiB and idles", idle or "no IDLE line")
        pid = nb.p.pid
        t0 = time.monotonic()
        r = None
        while time.monotonic() - t0 < 60:  # --idle 5s: parked once it has been idle 5 s
            r = cli(gpu, runner, "park --idle 5s", "park", "--idle", "5s", "--pid", str(pid))
            if "parked" in r.stdout:
                break
            time.sleep(1)
        check.that(r is not None and r.rc == 0 and "parked, 4" in r.stdout, "vramcap park --idle 5s parks it",
                   r.stdout.strip() if r else "not run")
        used = harness.nvml_used_mib(gpu.smi, pid, log=runner._log)
        # Measured at r580: a parked process is gone from the list, or shows a few MiB.
        shown = 0 if used == "missing" else used if isinstance(used, int) else 1e9
        check.at_most("nvidia-smi MiB of the parked notebook (%s)" % used, shown, 100)
        rows = harness.smi_query(gpu.smi, "memory.used")
        check.note("GPU memory used while parked: %s MiB" % (rows[0][0] if rows and rows[0] else "?"))
        grab = runner.run("park: 100 GiB while parked", [gpu.python, gpu.script("check_park.py"), "grab", "100"],
                          env=runner.env(shim=gpu.shim), timeout=600)
        kv = grab.kv()
        check.kv(kv, "oom", 0)
        check.eq("bytes the second process got", as_int(kv.get("got")), 100 * GiB, show=mib)
        nb.go()
        out, err = nb.finish(600)
        kv = harness.parse_kv(next((l for l in out.splitlines() if l.startswith("RESULTKV")), ""))
        check.kv(kv, "same", 1)
        check.eq("step1 against a run never parked", kv.get("step1"), control_sum)
        check.note("resume time (first CUDA call after idling): %s s" % kv.get("resume_s"))
        check.at_most("resume seconds", as_float(kv.get("resume_s")) or 1e9, 60)
    finally:
        nb.kill()


@pytest.mark.parametrize("mode,why", [
    ("managed", "it holds managed (unified) memory, which the driver's checkpoint refuses"),
    ("capture", "a stream capture is in progress"),
])
def test_refused_and_nothing_lost(gpu, runner, work, check, mode, why):
    check.title = "park refused: %s" % mode
    p = Proc(gpu, runner, work, mode, [mode, "256"], VRAMCAP_PARK="manual")
    try:
        idle = p.wait_line("IDLE", 300)
        check.that(bool(idle), "the process is ready", idle or "no IDLE line")
        r = cli(gpu, runner, "park " + mode, "park", "--pid", str(p.p.pid))
        check.eq("vramcap park's exit status", r.rc, 1)
        check.eq("its line", r.stderr.strip(), "vramcap: %d: cannot park: %s" % (p.p.pid, why))
        p.go()
        out, err = p.finish()
        kv = harness.parse_kv(next((l for l in out.splitlines() if l.startswith("RESULTKV")), ""))
        check.kv(kv, "intact" if mode == "managed" else "replayed", 1)
        check.that("vramcap[%d]: cannot park: %s" % (p.p.pid, why) in err, "the process says why on stderr",
                   err.strip()[-200:])
    finally:
        p.kill()


def test_resume_without_room_waits_and_never_sticks(gpu, runner, work, check):
    check.title = "resume into a full GPU refuses or waits; never stuck"
    nb = Proc(gpu, runner, work, "noroom", ["notebook", "8"], VRAMCAP_PARK="manual", VRAMCAP_CACHE="off")
    filler = None
    try:
        check.that(bool(nb.wait_line("IDLE", 300)), "an 8 GiB notebook idles", "")
        pid = nb.p.pid
        r = cli(gpu, runner, "park", "park", "--pid", str(pid))
        check.eq("park exit status", r.rc, 0)
        filler = Proc(gpu, runner, work, "filler", ["fill", "4"])
        check.that(bool(filler.wait_line("FILLED", 600)), "another process leaves less than 5 GiB free", "")
        r = cli(gpu, runner, "resume (no room)", "resume", "--pid", str(pid), "--wait", "3s")
        check.eq("resume exit status without room", r.rc, 1)
        check.eq("its line", r.stderr.strip(),
                 "vramcap: %d: cannot resume: no room on GPU 0 for its parked memory" % pid)
        nb.go()  # its next CUDA call waits for room
        line = nb.wait_line("GiB on GPU 0 to resume", 60, path=nb.err)
        check.that(bool(line), "the notebook says once that it waits", line or "no line")
        filler.go()
        filler.finish()
        out, err = nb.finish(300)
        kv = harness.parse_kv(next((l for l in out.splitlines() if l.startswith("RESULTKV")), ""))
        check.kv(kv, "same", 1)
        check.that("cannot continue" not in err and "stuck" not in err, "never stuck", err.strip()[-200:])
    finally:
        nb.kill()
        if filler:
            filler.kill()


def test_parked_process_exits_normally(gpu, runner, work, check):
    check.title = "a parked process that exits without resuming ends (no hang at the driver's exit)"
    p = Proc(gpu, runner, work, "exit", ["exit", "1"], VRAMCAP_PARK="manual")
    try:
        check.that(bool(p.wait_line("IDLE", 300)), "a 1 GiB process idles", "")
        r = cli(gpu, runner, "park (exit row)", "park", "--pid", str(p.p.pid))
        check.eq("park exit status", r.rc, 0)
        p.go()
        t0 = time.monotonic()
        out, err = p.finish(60)
        check.eq("its exit status", p.p.returncode, 0)
        check.at_most("seconds to exit", time.monotonic() - t0, 30)
    finally:
        p.kill()
