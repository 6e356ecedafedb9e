"""Spill (the rows of the former scripts/gpu-spill.sh): ../check_spill.py
training with a working set of ~1.44x a 1920 MiB cap (5 x Linear(6144), AdamW,
~2.9 GiB) with VRAMCAP_SPILL=host, and =managed (a removed mode, taken as
host with one warning line: docs/design/spill-modes.md), against an uncapped
reference; ../spill_bw.cu reading 1 GiB spilled against pinned zero-copy and
device memory, side by side in this run; and the program's own managed
memory past the cap refused under spill. Safe sizes: caps around 2 GiB, at
most 4 GiB spilled. The shim runs with VRAMCAP_CACHE=off.
"""
import pytest

from harness import GiB, MiB, as_float, as_int, mib, ratio

# The shim's one line for VRAMCAP_SPILL=managed (after its "vramcap[PID]: ").
MANAGED_AS_HOST = ("VRAMCAP_SPILL=managed is taken as host (e.g. VRAMCAP_SPILL=host): managed memory past "
                   "the cap could be moved onto the GPU by the program, unseen by NVML")

pytestmark = pytest.mark.spill


def shim_env(runner, gpu, **vars):
    return runner.env(shim=gpu.shim, VRAMCAP_CACHE="off", **vars)


@pytest.fixture(scope="session")
def spill_ref(gpu, runner):
    return runner.run("train-ref", [gpu.python, gpu.script("check_spill.py")], env=runner.env(), timeout=300)


def said(r, line):
    """How many of the run's stderr lines are the shim's `line`."""
    return sum(1 for l in r.stderr.splitlines() if l.startswith("vramcap[") and l.endswith("]: " + line))


def managed_taken_as_host(check, r, mode):
    """`managed` asked for: the one warning line, exactly once."""
    if mode == "managed":
        check.eq("'taken as host' warning lines", said(r, MANAGED_AS_HOST), 1)


def same(a, b):
    a, b = as_float(a), as_float(b)
    return a is not None and b is not None and abs(a - b) <= 1e-5 * max(abs(a), 1)


def test_no_spill_refuses(gpu, runner, check):
    check.title = "training, cap 1920 MiB, no spill"
    r = runner.run("train-nospill", [gpu.python, gpu.script("check_spill.py")],
                   env=shim_env(runner, gpu, VRAMCAP_LIMIT="1920MiB"), timeout=300)
    d = r.kv()
    check.eq("torch.OutOfMemoryError (oom)", d.get("oom"), 1)
    check.note(" ".join("%s=%s" % kv for kv in d.items()))


@pytest.mark.parametrize("mode,cap", [("managed", 1920), ("managed", 2304), ("host", 1920)])
def test_spill_training(gpu, runner, spill_ref, check, mode, cap):
    check.title = "training, cap %d MiB, VRAMCAP_SPILL=%s" % (cap, mode)
    ref = spill_ref.kv()
    r = runner.run("train-%s-%d" % (mode, cap), [gpu.python, gpu.script("check_spill.py")],
                   env=shim_env(runner, gpu, VRAMCAP_LIMIT="%dMiB" % cap, VRAMCAP_SPILL=mode,
                                VRAMCAP_SPILL_LIMIT="4GiB"), timeout=300)
    d = r.kv()
    managed_taken_as_host(check, r, mode)
    check.kv(d, "oom", 0)
    check.that(same(ref.get("loss"), d.get("loss")), "the same loss as uncapped",
               "loss %s vs %s" % (d.get("loss"), ref.get("loss")))
    check.that(same(ref.get("checksum"), d.get("checksum")), "the same weights (checksum) as uncapped",
               "checksum %s vs %s" % (d.get("checksum"), ref.get("checksum")))
    check.within("NVML process max (MiB, cap + 1 GiB context)", as_int(d.get("max_proc_mib")), None, cap + 1024)
    check.note("step %s ms vs %s ms uncapped (slowdown %sx)" % (
        d.get("ms_per_step"), ref.get("ms_per_step"), ratio(ref.get("ms_per_step"), d.get("ms_per_step"))))


@pytest.fixture(scope="session")
def bw_device(runner, build):
    return runner.run("bw-device", [build("spill_bw"), "device"], env=runner.env(), timeout=300)


def bw(r, what):
    for d in reversed(r.lines("BW")):
        if d.get("what") == what:
            return d.get("gbps")
    return None


@pytest.mark.goal
@pytest.mark.parametrize("mode", ["managed", "host"])
def test_spilled_bandwidth(gpu, runner, build, bw_device, check, mode):
    check.title = "kernel reads 1 GiB spilled (%s), cap 256 MiB" % mode
    r = runner.run("bw-" + mode, [build("spill_bw"), "spilled"],
                   env=shim_env(runner, gpu, VRAMCAP_LIMIT="256MiB", VRAMCAP_SPILL=mode, VRAMCAP_SPILL_LIMIT="2GiB"),
                   timeout=300)
    managed_taken_as_host(check, r, mode)
    g, pin = bw(r, "spilled"), bw(bw_device, "pinned-zero-copy")
    rt = ratio(pin, g)
    check.at_least("spilled / pinned zero-copy bandwidth in this run", rt if rt != "NA" else None, 0.9)
    check.note("%s GB/s vs pinned %s GB/s, device memory %s GB/s; SPILLED %s" % (
        g, pin, bw(bw_device, "device"), " ".join("%s=%s" % kv for kv in r.kv("SPILLED").items())))


@pytest.mark.parametrize("mode", ["host", "tiered"])
def test_programs_managed_memory_is_refused_past_the_cap(gpu, runner, build, check, mode):
    """The program's own managed memory is never spilled: past the cap it is
    refused (the program could move spilled managed pages onto the GPU)."""
    check.title = "capcheck cudaMallocManaged, cap 2 GiB, VRAMCAP_SPILL=%s" % mode
    cap = 2 * GiB
    r = runner.run("capcheck-managed-spill-" + mode, [build("capcheck"), "cudaMallocManaged", 4 * GiB],
                   env=shim_env(runner, gpu, VRAMCAP_LIMIT="2GiB", VRAMCAP_SPILL=mode, VRAMCAP_SPILL_LIMIT="4GiB"),
                   timeout=120)
    d = r.kv("RESULT")
    check.ran(r)
    # The counted context may take up to 768 MiB of the cap; loops step by 256 MiB.
    check.within("bytes", d.get("bytes"), cap - 256 * MiB - 768 * MiB, cap, show=mib, lo_open=True)
    check.eq("err", d.get("err"), 2)
    why = ("cuMemAllocManaged: managed memory past the cap is not spilled (the program could move it onto "
           "the GPU); refusing")
    check.eq("'not spilled' lines", said(r, why), 1)
