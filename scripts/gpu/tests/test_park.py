"""Parking on the real driver (issue 34's done-when 1, 3 and 4): a notebook-like
process of 40 GiB parked by `vramcap park --idle` (the on-demand idle policy)
releases its GPU memory, a second process allocates 100 GiB, and the first
resumes on its next CUDA call with the same results; managed memory and a
graph capture are refused with their lines and lose nothing; a resume into a
GPU without room waits or refuses and never leaves the process stuck.

Done-when 2 (and a group form of done-when 1): two deterministic training
processes in one group of 12 GiB, about 7.3 GiB each, VRAMCAP_PARK=idle:1s,
take turns at their CPU phases (an allocation or a transparent resume parks
the other once it is idle), both finish with the losses of solo runs, the
group never passes its budget; without parking the second is refused.

Sizes follow the machine's rules: one process's parked footprint is at most
40 GiB, managed memory at most 1 GiB, and no cap above 16 GiB is set (the
first rows run without a cap: parking needs none; the group's is 12 GiB).
"""
import json
import os
import re
import signal
import subprocess
import threading
import time

import pytest

import harness
from harness import GiB, as_float, as_int, mib

pytestmark = pytest.mark.park


class Proc:
    """A workload under the shim with its stdout and stderr in files."""

    def __init__(self, gpu, runner, work, name, args, shim=True, program=None, **env):
        # shim: True (this build's), False (none) or another build's path,
        # which gets no VRAMCAP_PARK_MOVE of --park-move (its own default).
        # program: a built program run with args, instead of check_park.py.
        # Beside the table (--out), so that they come back from the GPU
        # machine: the first run's hang left nothing to read.
        keep = os.path.dirname(gpu.log) or work
        self.out = os.path.join(keep, "park-%s.out" % name)
        self.err = os.path.join(keep, "park-%s.err" % name)
        self.t0 = time.monotonic()
        self.gpu, self.diag = gpu, ""
        env.setdefault("VRAMCAP_LOG", "info")
        if gpu.park_move and env.get("VRAMCAP_PARK") and shim is True:
            env.setdefault("VRAMCAP_PARK_MOVE", gpu.park_move)
        e = runner.env(shim=gpu.shim if shim is True else (shim or None), **env)
        # The CLI reads the pages where the process writes them.
        self.cli_env = runner.env(VRAMCAP_STATS_DIR=e.get("VRAMCAP_STATS_DIR"))
        argv = [program] if program else [gpu.python, gpu.script("check_park.py")]
        self.p = subprocess.Popen(argv + args, env=e,
                                  stdin=subprocess.PIPE, stdout=open(self.out, "w"),
                                  stderr=open(self.err, "w"), start_new_session=True)

    def stat(self, *flags, timeout=60):
        """`vramcap stat FLAGS --pid` of this process, run where it writes
        its page."""
        return subprocess.run([self.gpu.cli, "stat", *flags, "--pid", str(self.p.pid)], capture_output=True,
                              text=True, timeout=timeout, env=self.cli_env)

    def wait_line(self, prefix, seconds, path=None):
        return harness.wait_line(path or self.out, prefix, seconds, self.p, anywhere=bool(path))

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
            self.diag = self.where()
            with open(self.err, "a") as f:
                f.write("\n[test_park: killed after %s s]\n%s\n" % (seconds, self.diag))
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
        self.wall = time.monotonic() - self.t0
        return open(self.out).read(), open(self.err).read()

    def where(self):
        """Where a process that did not end waits: its page's parking state
        and each thread's name, kernel wait channel and the libraries on
        its stack."""
        lines = []
        try:
            r = self.stat("--json", timeout=20)
            lines.append("stat: " + " ".join((r.stdout + r.stderr).split())[:1500])
        except (OSError, subprocess.SubprocessError) as e:
            lines.append("stat: %s" % e)
        lines += harness.thread_stacks(self.p.pid)
        return "\n".join(lines)

    def result(self):
        """The RESULTKV line of its stdout, as a dict."""
        with open(self.out, errors="replace") as f:
            return harness.parse_kv(next((l for l in f if l.startswith("RESULTKV")), ""))

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


def resumed_identical(nb, check, control_sum):
    """Lets the parked notebook go on: its next CUDA call resumes it; its
    results are checked against the run never parked, its resume timed."""
    nb.go()
    out, err = nb.finish(180)
    if nb.diag:
        check.note("the notebook did not end: " + " | ".join(nb.diag.splitlines()[:12]))
    kv = harness.parse_kv(next((l for l in out.splitlines() if l.startswith("RESULTKV")), ""))
    check.kv(kv, "same", 1)
    check.eq("step1 against a run never parked", kv.get("step1"), control_sum)
    check.note("resume time (first CUDA call after idling): %s s" % kv.get("resume_s"))
    check.at_most("resume seconds", as_float(kv.get("resume_s")) or 1e9, 60)


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
        # Measured at r580: a parked process is gone from the list, or shows a
        # few MiB; with the shim's moves (the default, VRAMCAP_PARK_MOVE unset
        # or shim) its context stays (about 610 MiB).
        shown = 0 if used == "missing" else used if isinstance(used, int) else 1e9
        check.at_most("nvidia-smi MiB of the parked notebook (%s)" % used, shown,
                      1024 if gpu.park_move in (None, "shim") else 100)
        rows = harness.smi_query(gpu.smi, "memory.used")
        check.note("GPU memory used while parked: %s MiB" % (rows[0][0] if rows and rows[0] else "?"))
        grab = runner.run("park: 100 GiB while parked", [gpu.python, gpu.script("check_park.py"), "grab", "100"],
                          env=runner.env(shim=gpu.shim), timeout=600)
        kv = grab.kv()
        check.kv(kv, "oom", 0)
        check.eq("bytes the second process got", as_int(kv.get("got")), 100 * GiB, show=mib)
        resumed_identical(nb, check, control_sum)
    finally:
        nb.kill()


def test_notebook_parked_for_a_full_gpu_resumes_with_identical_results(gpu, runner, work, check, control_sum):
    check.title = ("40 GiB notebook (idle:5s, no group) parked by the policy when a 100 GiB allocation finds the GPU "
                   "full, resumed identical")
    nb = Proc(gpu, runner, work, "notebook-full", ["notebook", "40"], VRAMCAP_PARK="idle:5s", VRAMCAP_CACHE="off")
    try:
        idle = nb.wait_line("IDLE", 600)
        check.that(bool(idle), "the notebook holds 40 GiB and idles", idle or "no IDLE line")
        pid = nb.p.pid
        # No vramcap park: the second process's allocation finds the GPU full
        # and waits (VRAMCAP_PARK_WAIT) until the notebook has idled 5 s.
        grab = runner.run("park: 100 GiB on a full GPU", [gpu.python, gpu.script("check_park.py"), "grab", "100"],
                          env=runner.env(shim=gpu.shim, VRAMCAP_PARK_WAIT="120s", VRAMCAP_LOG="info"), timeout=600)
        kv = grab.kv()
        check.kv(kv, "oom", 0)
        check.eq("bytes the second process got", as_int(kv.get("got")), 100 * GiB, show=mib)
        said = next((l for l in grab.stderr.splitlines() if "parking idle process %d" % pid in l), "")
        check.that("GPU 0 is full; parking idle process %d: done in " % pid in said,
                   "the second process says it parked the notebook", said or "no line")
        resumed_identical(nb, check, control_sum)
    finally:
        nb.kill()


@pytest.mark.parametrize("mode,why", [
    ("managed", "it holds managed (unified) memory, which neither the driver's checkpoint nor the shim's moves take"),
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


def same_and_never_stuck(nb, check):
    """The notebook ends with its two steps' sums equal, never stuck."""
    out, err = nb.finish(300)
    kv = harness.parse_kv(next((l for l in out.splitlines() if l.startswith("RESULTKV")), ""))
    check.kv(kv, "same", 1)
    check.that("cannot continue" not in err and "stuck" not in err, "never stuck", err.strip()[-200:])


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
        same_and_never_stuck(nb, check)
    finally:
        nb.kill()
        if filler:
            filler.kill()


def test_parked_process_exits_normally(gpu, runner, work, check):
    check.title = ("a parked process that exits without resuming ends at once: its exit handlers' driver calls "
                   "answer 4 (nothing restored), and the driver frees its memory")
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
        check.eq("it says once that it exits parked",
                 err.count("exiting while parked: the parked GPU memory is discarded"), 1)
        check.eq("restored before exiting", "resumed:" in err, False)
        apps = subprocess.run([gpu.smi, "--query-compute-apps=pid", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60).stdout.split()
        check.eq("nvidia-smi still lists it", str(p.p.pid) in apps, False)
    finally:
        p.kill()


def test_parked_process_calls_off_the_hooks_resume_it(gpu, runner, work, check):
    check.title = ("a parked process's calls to the shim's C ABI and to NVML (through dlsym) resume it "
                   "instead of waiting in the checkpointed driver (issue 42, item 4)")
    p = Proc(gpu, runner, work, "calls", ["calls", "2"], VRAMCAP_PARK="manual", VRAMCAP_LIMIT="8GiB")
    try:
        check.that(bool(p.wait_line("IDLE", 300)), "a 2 GiB process idles", "")
        r = cli(gpu, runner, "park (calls row)", "park", "--pid", str(p.p.pid))
        check.eq("park exit status", r.rc, 0)
        p.go()
        out, err = p.finish(120)
        kv = harness.parse_kv(next((l for l in out.splitlines() if l.startswith("RESULTKV")), ""))
        check.kv(kv, "limit", 8 << 30)
        check.kv(kv, "nvml", 0)
        check.kv(kv, "intact", 1)
        check.that(as_int(kv.get("count")) >= 1, "NVML counts the GPU", kv.get("count"))
        check.that("resumed:" in err, "the first of them resumed it", err.strip()[-200:])
    finally:
        p.kill()


def test_a_linked_programs_address_query_resumes_it(gpu, runner, work, build, check):
    check.title = ("a program linked with -lcuda, parked, whose next calls ask the driver about its allocation's "
                   "address (cuPointerGetAttribute, cuMemGetAddressRange, cuMemGetAccess: exported by the shim since "
                   "session 21) is resumed by the first and gets the running answers, its data intact")
    prog = build("park_linked")
    p = Proc(gpu, runner, work, "linked", ["1024"], program=prog, VRAMCAP_PARK="manual")
    try:
        check.that(bool(p.wait_line("IDLE", 120)), "a 1 GiB process linked with -lcuda idles", "")
        r = cli(gpu, runner, "park (linked row)", "park", "--pid", str(p.p.pid))
        check.eq("park exit status", r.rc, 0)
        used = harness.nvml_used_mib(gpu.smi, p.p.pid, log=runner._log)
        check.note("nvidia-smi MiB while parked: %s" % used)
        p.go()
        out, err = p.finish(120)
        kv = p.result()
        for k, want in (("rc_attr", 0), ("dev", 0), ("start_off", 0), ("rc_range", 0), ("base_off", 0),
                        ("size", 1 << 30), ("rc_access", 0), ("flags", 3), ("same", 1)):
            check.kv(kv, k, want)
        check.eq("it says the pointer query resumed it",
                 err.count("parking: cuPointerGetAttribute resumes this process"), 1)
    finally:
        p.kill()


@pytest.mark.parametrize("move", ["checkpoint", "shim", "shim+checkpoint"])
def test_park_cycles_by_the_driver_and_by_the_shim(gpu, runner, work, check, move):
    check.title = ("a 12 GiB PyTorch process parked and resumed 5 times with VRAMCAP_PARK_MOVE=%s: "
                   "each park's and resume's seconds per GiB, sums identical every time (issue 43; "
                   "both moves in the same call, side by side)" % move)
    gib, n = 12, 5
    p = Proc(gpu, runner, work, "cycles-" + move.replace("+", "-"), ["cycles", str(gib), str(n)], VRAMCAP_PARK="manual",
             VRAMCAP_PARK_MOVE=move, VRAMCAP_CACHE="off", VRAMCAP_LIMIT="16GiB")
    try:
        parks, resumes = [], []
        for i in range(1, n + 1):
            if not p.wait_line("IDLE %d " % i, 600):
                check.that(False, "cycle %d idles" % i, "no IDLE line")
                break
            t0 = time.monotonic()
            r = cli(gpu, runner, "park (%s, cycle %d)" % (move, i), "park", "--pid", str(p.p.pid))
            parks.append(time.monotonic() - t0)
            check.eq("park %d exit status" % i, r.rc, 0)
            if i == 1:
                used = harness.nvml_used_mib(gpu.smi, p.p.pid, log=runner._log)
                check.note("nvidia-smi MiB of the parked process (%s): %s" % (move, used))
            p.go()
            line = p.wait_line("RESUMED %d " % i, 600)
            resumes.append(as_float(harness.parse_kv(line or "").get("seconds")) or 1e9)
        out, err = p.finish(300)
        kv = harness.parse_kv(next((l for l in out.splitlines() if l.startswith("RESULTKV")), ""))
        check.kv(kv, "same", 1)
        check.note("%s: park s/GiB %s; resume s/GiB %s" % (
            move, ", ".join("%.3f" % (t / gib) for t in parks), ", ".join("%.3f" % (t / gib) for t in resumes)))
        if move != "checkpoint" and len(parks) == n:
            # Issue 43's goals: the first park at most 0.3 s/GiB (plus the
            # driver's checkpoint of the rest, about 1.5 s, with
            # shim+checkpoint), later ones and resumes at most 0.05 s/GiB
            # + 1.5 s.
            rest = 1.5 if move == "shim+checkpoint" else 0.0
            check.at_most("first park, s", parks[0], 0.3 * gib + rest)
            check.at_most("a later park, s", max(parks[1:]), 0.05 * gib + 1.5)
            check.at_most("a resume, s", max(resumes), 0.05 * gib + 1.5)
    finally:
        p.kill()


def rss_mib(pid):
    """The process's resident memory (VmRSS), MiB; None when unreadable."""
    try:
        with open("/proc/%d/status" % pid) as f:
            kb = next((int(l.split()[1]) for l in f if l.startswith("VmRSS:")), None)
        return None if kb is None else kb // 1024
    except (OSError, ValueError):
        return None


def test_hundred_cycles_with_the_shims_moves(gpu, runner, work, check):
    check.title = ("a 2 GiB PyTorch process parked and resumed 100 times with VRAMCAP_PARK_MOVE=shim: sums "
                   "identical every time, resident host memory while parked at most its GPU footprint and 512 MiB "
                   "over its own before the first park, the same after 99 resumes (issue 43, done-when 7)")
    gib, n = 2, 100
    p = Proc(gpu, runner, work, "hundred", ["cycles", str(gib), str(n)], VRAMCAP_PARK="manual",
             VRAMCAP_PARK_MOVE="shim", VRAMCAP_CACHE="off", VRAMCAP_LIMIT="6GiB", VRAMCAP_LOG="warn")
    try:
        parked_rss, failed, base, after, st, footprint = [], [], None, None, None, None
        for i in range(1, n + 1):
            if not p.wait_line("IDLE %d " % i, 300):
                check.that(False, "cycle %d idles" % i, "no IDLE line")
                break
            if base is None:
                base = rss_mib(p.p.pid)
                # Its GPU footprint: what the shim counts on GPU 0 (PyTorch's
                # cached segments too), not only the tensors' 2 GiB.
                j = p.stat("--json").stdout
                try:
                    footprint = json.loads(j)["processes"][0]["devices"][0]["used_bytes"] >> 20
                except (ValueError, KeyError, IndexError, TypeError):
                    footprint = None
            if i == n:  # after n - 1 resumes, before the last park
                after = rss_mib(p.p.pid)
                st = p.stat("--json")
            r = cli(gpu, runner, "park (hundred, cycle %d)" % i, "park", "--pid", str(p.p.pid))
            if r.rc != 0:
                failed.append((i, r.rc, r.stderr.strip()[:200]))
            parked_rss.append(rss_mib(p.p.pid) or 1 << 30)
            p.go()
        out, err = p.finish(120)
        kv = harness.parse_kv(next((l for l in out.splitlines() if l.startswith("RESULTKV")), ""))
        check.kv(kv, "same", 1)
        check.eq("cycles", as_int(kv.get("cycles")), n)
        check.eq("parks that failed", failed, [])
        check.that(footprint is not None, "the process's GPU footprint is known (vramcap stat)", "%s MiB" % footprint)
        bound = (base or 0) + (footprint or 0) + 512
        check.note("GPU footprint %s MiB; RSS MiB: %s before the first park; while parked %s (cycle 1), %s (cycle 50), "
                   "%s (cycle 100); "
                   "%s after 99 resumes" % (footprint, base, parked_rss[0] if parked_rss else "?",
                                                 parked_rss[49] if len(parked_rss) > 49 else "?",
                                                 parked_rss[-1] if parked_rss else "?", after))
        check.at_most("largest RSS while parked, MiB", max(parked_rss) if parked_rss else 1 << 30, bound)
        check.at_most("RSS after 99 resumes, MiB", after if after is not None else 1 << 30, bound)
        m = re.search(r'"host_kept_bytes":\s*(\d+)', st.stdout if st else "")
        check.note("stat --json after 99 resumes: host_kept_bytes=%s" % (m.group(1) if m else "?"))
    finally:
        p.kill()


@pytest.mark.parametrize("move", ["shim", "shim+checkpoint"])
def test_a_cuda_graphs_pool_moves_with_the_rest(gpu, runner, work, check, move):
    check.title = ("a PyTorch CUDA graph (its private pool: a 1 GiB input, 2 GiB of intermediates and output) "
                   "parked with VRAMCAP_PARK_MOVE=%s: nvidia-smi shows at most the context while parked, the "
                   "output is kept and a replay after the resume gives the same sum (issue 43, done-when 7)" % move)
    p = Proc(gpu, runner, work, "graph-" + move.replace("+", "-"), ["graph", "2"], VRAMCAP_PARK="manual",
             VRAMCAP_PARK_MOVE=move, VRAMCAP_LIMIT="8GiB")
    try:
        check.that(bool(p.wait_line("IDLE", 300)), "the graph was captured and replayed", "")
        before = harness.nvml_used_mib(gpu.smi, p.p.pid, log=runner._log)
        r = cli(gpu, runner, "park (graph, %s)" % move, "park", "--pid", str(p.p.pid))
        check.eq("park exit status", r.rc, 0)
        used = harness.nvml_used_mib(gpu.smi, p.p.pid, log=runner._log)
        shown = 0 if used == "missing" else used if isinstance(used, int) else 1e9
        check.note("nvidia-smi MiB: %s before the park, %s while parked" % (before, used))
        check.at_most("nvidia-smi MiB while parked", shown, 1024 if move == "shim" else 0)
        p.go()
        out, err = p.finish(300)
        kv = harness.parse_kv(next((l for l in out.splitlines() if l.startswith("RESULTKV")), ""))
        check.kv(kv, "kept", 1)
        check.kv(kv, "same", 1)
        check.note("resume %s s" % kv.get("resume_s"))
    finally:
        p.kill()


def test_an_idle_jax_process_stays_parked(gpu, runner, work, check):
    check.title = ("a JAX process (no preallocation, 4 GiB), idle after its work, is picked by the idle "
                   "policy (`vramcap park --idle 6s` after 8 s), stays parked for 20 s until its own next "
                   "computation, then resumes with identical results; the log names any call that resumed "
                   "it (issue 43, done-when 5)")
    p = Proc(gpu, runner, work, "jax", ["jax", "4"], VRAMCAP_PARK="manual", VRAMCAP_CACHE="off",
             XLA_PYTHON_CLIENT_PREALLOCATE="false")
    try:
        check.that(bool(p.wait_line("IDLE", 300)), "a 4 GiB JAX process idles", "")
        before = p.stat()
        check.note("before the park: " + " ".join((before.stdout + before.stderr).split())[:600])
        # The measure itself: 8 s idle, then parked only if its runtime's own
        # calls in that time counted as no activity.
        time.sleep(8)
        r = cli(gpu, runner, "park (jax row)", "park", "--idle", "6s", "--pid", str(p.p.pid))
        check.eq("park --idle 6s exit status", r.rc, 0)
        check.that("parked" in r.stdout, "the idle policy picked it (vramcap park --idle 6s)",
                   " ".join((r.stdout + r.stderr).split())[:200])
        time.sleep(20)  # the measure itself: 20 s idle, parked
        st = p.stat("--json")
        err = open(p.err, errors="replace").read()
        wakers = [l for l in err.splitlines() if "resumes this process" in l]
        check.eq("calls that resumed it while idle", wakers, [])
        check.that('"parked"' in st.stdout, "still parked after 20 s (stat)", " ".join(st.stdout.split())[:300])
        used = harness.nvml_used_mib(gpu.smi, p.p.pid, log=runner._log)
        shown = 0 if used == "missing" else used if isinstance(used, int) else 1e9
        check.note("nvidia-smi MiB of the parked JAX process: %s" % used)
        check.at_most("nvidia-smi MiB of the parked JAX process", shown, 1024)
        p.go()
        out, err = p.finish(300)
        kv = harness.parse_kv(next((l for l in out.splitlines() if l.startswith("RESULTKV")), ""))
        check.kv(kv, "same", 1)
    finally:
        p.kill()


def test_a_lying_nvidia_smi_keeps_a_parked_process_parked(gpu, runner, work, check):
    check.title = ("a resume from the driver's checkpoint trusts no nvidia-smi that says a GPU has more free "
                   "than its size: it stays parked, says why, and resumes with the same results once the answer "
                   "is true (item 11; the shim's moves ask the driver for the memory itself, not nvidia-smi)")
    fake = os.path.join(work, "fake-smi")
    os.makedirs(fake, exist_ok=True)
    flag = os.path.join(fake, "lie")
    script = os.path.join(fake, "nvidia-smi")
    with open(script, "w") as f:
        f.write("#!/bin/sh\nif [ -e %s ]; then\n  %s --query-gpu=uuid --format=csv,noheader | "
                "sed 's/$/, 99999999/'\n  exit 0\nfi\nexec %s \"$@\"\n" % (flag, gpu.smi, gpu.smi))
    os.chmod(script, 0o755)
    path = fake + ":" + os.environ.get("PATH", "/usr/bin:/bin")
    nb = Proc(gpu, runner, work, "lying-smi", ["notebook", "4"], VRAMCAP_PARK="manual", VRAMCAP_CACHE="off",
              VRAMCAP_PARK_MOVE="checkpoint", PATH=path)
    try:
        check.that(bool(nb.wait_line("IDLE", 300)), "a 4 GiB notebook idles", "")
        r = cli(gpu, runner, "park (lying nvidia-smi)", "park", "--pid", str(nb.p.pid))
        check.eq("park exit status", r.rc, 0)
        open(flag, "w").close()
        nb.go()
        line = nb.wait_line("resume: nvidia-smi says GPU 0 has", 60, path=nb.err)
        check.that(bool(line) and "not trusted" in line, "it says the answer is not trusted", line or "no line")
        os.unlink(flag)
        same_and_never_stuck(nb, check)
    finally:
        nb.kill()


# ---------------------------------------------------------------- two trainers take turns (done-when 2)

TURN_BUDGET = "12GiB"          # the group's limit (VRAMCAP_LIMIT of its members)
TURN_LAYERS = 9                # 9 x 0.75 GiB (weights, gradients, momentum) + context: about 7.3 GiB a process
TURN_ROUNDS, TURN_STEPS, TURN_CPU_S = 3, 50, 3
TURN_ENV = dict(VRAMCAP_CACHE="off", VRAMCAP_LIMIT=TURN_BUDGET, VRAMCAP_LOG="info",
                CUBLAS_WORKSPACE_CONFIG=":4096:8")


def trainer(seed, delay):
    return ["train", str(seed), str(TURN_LAYERS), str(TURN_ROUNDS), str(TURN_STEPS), str(TURN_CPU_S), str(delay)]


def two_trainers(gpu, runner, work, name, shim=True, **env):
    """A (seed 1) and B (seed 2) started together; B's first CUDA call waits
    until A has done its first round (all of its memory allocated), so A is
    the first and B the second (two allocations waiting for each other
    would wait up to VRAMCAP_PARK_WAIT: neither is idle)."""
    a = Proc(gpu, runner, work, name + "-a", trainer(1, 0), shim=shim, **env)
    b = Proc(gpu, runner, work, name + "-b", trainer(2, -1), shim=shim, **env)
    a.wait_line("ROUND 0", 300)
    b.go()
    return a, b


class Sampler(threading.Thread):
    """Every 0.5 s: the group's bytes on GPU 0 (`vramcap stat --json`) and
    what NVML lists for the PIDs (MiB, summed); keeps the highest of each."""

    def __init__(self, gpu, env, group, pids):
        super().__init__(daemon=True)
        self.gpu, self.env, self.group, self.pids = gpu, env, group, pids
        self.group_max, self.nvml_max, self.samples = 0, 0, 0
        # Every sample: (seconds from the start, the group's bytes, each
        # PID's MiB), so a figure over the budget can be placed.
        self.timeline, self.t0 = [], time.monotonic()
        self.halt = threading.Event()

    def around_max(self):
        """The samples beside NVML's highest, as text."""
        i = max(range(len(self.timeline)), key=lambda k: sum(
            v for v in self.timeline[k][2] if isinstance(v, int)), default=None)
        if i is None:
            return "no samples"
        return "; ".join("%.1fs group %s nvml %s" % (t, mib(g), "+".join(str(v) for v in per))
                         for t, g, per in self.timeline[max(0, i - 3):i + 4])

    def run(self):
        while not self.halt.wait(0.5):
            try:
                j = subprocess.run([self.gpu.cli, "stat", "--json"], env=self.env, capture_output=True, text=True,
                                   timeout=20).stdout
                group = 0
                for g in json.loads(j).get("groups", []):
                    if g.get("name") == self.group:
                        group = g["devices"][0]["used_bytes"]
                        self.group_max = max(self.group_max, group)
                apps = subprocess.run([self.gpu.smi, "--query-compute-apps=pid,gpu_uuid,used_memory",
                                       "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                      timeout=20).stdout
                per = [harness.sum_apps(apps, p) for p in self.pids]
                mib_sum = sum(v for v in per if isinstance(v, int))
                self.nvml_max = max(self.nvml_max, mib_sum)
                self.timeline.append((time.monotonic() - self.t0, group, per))
                self.samples += 1
            except (OSError, ValueError, KeyError, IndexError, subprocess.TimeoutExpired):
                pass


# Every park move's lines (the shim's moves name no driver seconds: 0).
PARKED = re.compile(r"parked: (\d+) bytes moved to host memory (?:by the shim )?(?:and \d+ by the driver's "
                    r"checkpoint )?in ([\d.]+)s(?:;| \((?:the driver's lock and checkpoint ([\d.]+)s)?)")
RESUMED = re.compile(r"resumed: the parked memory is back on the GPU in ([\d.]+)s "
                     r"\((?:the driver's restore and unlock ([\d.]+)s\)|moved by the shim)")
ASKED = re.compile(r"parking idle member (\d+): done in ([\d.]+)s")


def swap_times(errs):
    """From the Info lines of both: parkings, the driver's checkpoint and
    restore seconds, and the shim's seconds for the same steps (a parking
    as the asking process waited for it; a resume from its reservation)."""
    text = "\n".join(errs)
    parked = [(float(a), float(b or 0)) for _, a, b in PARKED.findall(text)]
    resumed = [(float(a), float(b or 0)) for a, b in RESUMED.findall(text)]
    asked = [float(t) for _, t in ASKED.findall(text)]
    return dict(parkings=len(parked), asked=len(asked), resumes=len(resumed),
                driver_s=sum(b for _, b in parked) + sum(b for _, b in resumed),
                shim_s=sum(asked) + sum(a for a, _ in resumed),
                park_driver_s=sum(b for _, b in parked), park_shim_s=sum(asked),
                resume_driver_s=sum(b for _, b in resumed), resume_shim_s=sum(a for a, _ in resumed))


def pair_in_a_group(gpu, runner, work, name, shim=True):
    """The two trainers in a fresh group of TURN_BUDGET with idle:1s
    parking under `shim` (Proc's): (A's and B's results, walls and exit
    statuses; the pair's wall; the sampler; A's and B's stderr)."""
    group = "park-%s-%d" % (name, os.getpid())
    stats = os.path.join(work, "stats-" + name)
    env = dict(TURN_ENV, VRAMCAP_GROUP=group, VRAMCAP_STATS_DIR=stats, VRAMCAP_PARK="idle:1s",
               VRAMCAP_PARK_WAIT="10m")
    t0 = time.monotonic()
    a, b = two_trainers(gpu, runner, work, name, shim=shim, **env)
    sampler = Sampler(gpu, runner.env(VRAMCAP_STATS_DIR=stats), group, [a.p.pid, b.p.pid])
    sampler.start()  # A alone before: its bytes are within its own cap of 12 GiB
    try:
        _, a_err = a.finish(400)
        _, b_err = b.finish(400)
    finally:
        sampler.halt.set()
        a.kill()
        b.kill()
    pair_wall = time.monotonic() - t0
    sampler.join(30)
    runner._log("\n=== park: two trainers in one group (%s) ===\n== a\n%s\n%s\n== b\n%s\n%s\n" % (
        name, open(a.out).read(), a_err, open(b.out).read(), b_err))
    together = [(a.result(), a.wall, a.p.returncode), (b.result(), b.wall, b.p.returncode)]
    return together, pair_wall, sampler, [a_err, b_err]


def test_turns_sooner_than_the_baseline_parking(gpu, runner, work, turns, check):
    check.title = ("the two trainers taking turns finish sooner than under the baseline build's parking "
                   "(--park-baseline, side by side in this call; issue 43, done-when 4)")
    if not gpu.park_baseline:
        pytest.skip("no --park-baseline given")
    solo, _, pair_wall, _, _ = turns
    base, base_wall, _, _ = pair_in_a_group(gpu, runner, work, "turns-base", shim=gpu.park_baseline)
    for name, (s, t) in zip("AB", zip(solo, base)):
        check.eq("%s losses under the baseline against its solo run" % name, t[0].get("losses"),
                 s[0].get("losses"))
    check.note("pair %.1f s (this build) against %.1f s (%s), solo sum %.1f s" % (
        pair_wall, base_wall, gpu.park_baseline, solo[0][1] + solo[1][1]))
    check.at_most("the pair's wall over the baseline's", pair_wall / base_wall if base_wall else 1e9, 1.0,
                  show=lambda x: "%.3f" % x)
    check.at_most("the pair's wall over the solo runs' sum", pair_wall / (solo[0][1] + solo[1][1]), 1.0,
                  show=lambda x: "%.3f" % x)


@pytest.fixture(scope="session")
def turns(gpu, runner, work):
    """The solo runs (no shim, side by side), then the two in one group with
    parking: (solo results and walls, group results and walls, wall of the
    pair, sampler, swap times, the stderr texts)."""
    a = Proc(gpu, runner, work, "solo-a", trainer(1, 0), shim=False, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    b = Proc(gpu, runner, work, "solo-b", trainer(2, 0), shim=False, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    a.finish(300)
    b.finish(300)
    solo = [(a.result(), a.wall, a.p.returncode), (b.result(), b.wall, b.p.returncode)]
    together, pair_wall, sampler, errs = pair_in_a_group(gpu, runner, work, "turns")
    return solo, together, pair_wall, sampler, swap_times(errs)


def test_two_trainers_in_one_group_take_turns(turns, check):
    check.title = "two trainers of ~7.3 GiB in a group of 12 GiB, idle:1s: they take turns, losses as solo"
    solo, together, pair_wall, sampler, sw = turns
    for name, (s, t) in zip("AB", zip(solo, together)):
        check.eq("%s solo exit status" % name, s[2], 0)
        check.eq("%s exit status in the group" % name, t[2], 0)
        check.kv(t[0], "oom", "0")
        check.eq("%s rounds" % name, t[0].get("rounds"), str(TURN_ROUNDS))
        check.eq("%s losses (sha256 of every step's) against its solo run" % name, t[0].get("losses"),
                 s[0].get("losses"))
        check.eq("%s last loss against its solo run" % name, t[0].get("last"), s[0].get("last"))
    budget = 12 * GiB
    check.that(sampler.samples > 0, "the group and NVML were sampled", "%d samples" % sampler.samples)
    check.at_most("group's highest bytes on GPU 0 (vramcap stat)", sampler.group_max, budget, show=mib)
    # NVML counts what the driver holds; the shim charges the context by an estimate.
    check.at_most("NVML's highest MiB of the two together", sampler.nvml_max, budget // (1 << 20) + 256)
    check.at_least("parkings", sw["parkings"], 2)
    check.eq("parkings asked by the policy (an allocation or a resume)", sw["asked"], sw["parkings"])
    check.note("wall: %.1f s for the pair taking turns against %.1f s, the sum of the solo runs' (%.1f + %.1f; "
               "they ran side by side without the shim)" % (pair_wall, solo[0][1] + solo[1][1], solo[0][1], solo[1][1]))
    check.note("group highest %s, NVML highest %d MiB, %d parkings, %d resumes" % (
        mib(sampler.group_max), sampler.nvml_max, sw["parkings"], sw["resumes"]))
    check.note("samples beside NVML's highest (A+B MiB): " + sampler.around_max())


@pytest.mark.goal
def test_turns_cost_within_ten_percent_of_the_drivers_checkpoints(gpu, turns, check):
    check.title = "two trainers taking turns: the shim's swap time within 10% of the driver's checkpoint and restore"
    sw = turns[4]
    if gpu.park_move != "checkpoint":
        pytest.skip("the row compares the driver's checkpoint with the shim's part around it: "
                    "it runs with --park-move checkpoint")
    check.that(sw["parkings"] >= 2 and sw["resumes"] >= 1, "parkings and resumes to measure",
               "%d parkings, %d resumes" % (sw["parkings"], sw["resumes"]))
    over = (sw["shim_s"] - sw["driver_s"]) / sw["driver_s"] if sw["driver_s"] > 0 else None
    check.at_most("(shim's swap seconds - driver's) / driver's", over, 0.10, show=lambda x: "%.3f" % x)
    check.note("parking: the asker waited %.2f s, the driver's lock and checkpoint %.2f s; resuming: %.2f s, "
               "the driver's restore and unlock %.2f s" % (sw["park_shim_s"], sw["park_driver_s"],
                                                           sw["resume_shim_s"], sw["resume_driver_s"]))


def test_without_parking_the_second_trainer_is_refused(gpu, runner, work, check):
    check.title = "the same two trainers in a group of 12 GiB without parking: the second is out of memory"
    group = "park-noturns-%d" % os.getpid()
    env = dict(TURN_ENV, VRAMCAP_GROUP=group, VRAMCAP_STATS_DIR=os.path.join(work, "stats-noturns"))
    a, b = two_trainers(gpu, runner, work, "noturns", **env)
    try:
        _, b_err = b.finish(300)
        kv = b.result()
        check.eq("the second's exit status (3: out of memory)", b.p.returncode, 3)
        check.kv(kv, "oom", "1")
        check.that(a.p.poll() is None or a.p.returncode == 0, "the first is unharmed",
                   "rc=%s" % a.p.returncode)
    finally:
        a.kill()
        b.kill()
