"""Two PyTorch processes in one vramcap group of 8 GiB (the rows of the former
scripts/gpu-group.sh, ../check_group.py): the holder takes 6 GiB, the second
gets OutOfMemoryError after what is left, NVML's per-process figures summed
stay within the budget plus two CUDA contexts, and after SIGKILL of the
holder the second gets 7 GiB within 3 s.
"""
import os
import signal
import subprocess

import pytest

import harness
from harness import GiB, as_int, mib

pytestmark = pytest.mark.group


@pytest.fixture(scope="session")
def group_run(gpu, runner, work):
    """The two processes, once: (HELD line, shared RESULTKV, after_kill RESULTKV, stat text)."""
    env = runner.env(VRAMCAP_STATS_DIR=os.path.join(work, "stats-group"))
    run = [gpu.cli, "run", "--limit", "8GiB", "--group", "g", "--cache", "off", "--"]
    a_out, b_out = os.path.join(work, "group-a.out"), os.path.join(work, "group-b.out")
    errf = open(os.path.join(work, "group.err"), "w")
    a = subprocess.Popen(run + [gpu.python, gpu.script("check_group.py"), "hold", "6"], env=env,
                         stdin=subprocess.PIPE, stdout=open(a_out, "w"), stderr=errf, start_new_session=True)
    b = None
    try:
        held = harness.wait_line(a_out, "HELD", 60, a)
        b = subprocess.Popen(run + [gpu.python, gpu.script("check_group.py"), "probe", "7", str(a.pid)], env=env,
                             stdin=subprocess.PIPE, stdout=open(b_out, "w"), stderr=errf, start_new_session=True)
        harness.wait_line(b_out, "READY", 60, b)
        shared = harness.wait_line(b_out, "RESULTKV phase=shared", 1, b)
        stat = subprocess.run([gpu.cli, "stat"], env=env, capture_output=True, text=True, timeout=30).stdout
        os.killpg(a.pid, signal.SIGKILL)
        a.wait(timeout=30)
        try:
            b.stdin.write(b"go\n")
            b.stdin.close()
        except OSError:
            pass
        try:
            b.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        after = harness.wait_line(b_out, "RESULTKV phase=after_kill", 1, b)
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        errf.close()
    runner._log("\n=== group ===\n== holder\n%s\n== probe\n%s\n== stat while both ran\n%s\n" % (
        open(a_out).read(), open(b_out).read(), stat))
    return held, harness.parse_kv(shared), harness.parse_kv(after), stat


def test_second_member_refused(group_run, check):
    check.title = "second member while the first holds 6 GiB (group of 8 GiB)"
    held, shared, _, _ = group_run
    check.that(held, "the holder holds 6 GiB", held or "no HELD line")
    check.kv(shared, "oom", 1)
    check.within("got", shared.get("got"), None, 2 * GiB, show=mib)


def test_nvml_sum(group_run, check):
    check.title = "NVML per-process device memory, both summed"
    _, shared, _, _ = group_run
    check.within("nvml_sum (8 GiB budget + two CUDA contexts, 2 GiB allowance)", as_int(shared.get("nvml_sum")),
                 None, 10 * GiB, show=mib)


def test_after_holder_killed(group_run, check):
    check.title = "after SIGKILL of the holder"
    _, _, after, _ = group_run
    check.eq("the second member allocates 7 GiB within 3 s (ok)", after.get("ok"), 1)
    check.note("seconds=%s" % after.get("seconds"))
