"""Issue 15's cache part: the freed-block cache reuses a block without waiting
for the GPU while every stream is one the legacy stream orders, and waits
once a non-blocking stream exists; what that is worth (the rows of the
former scripts/gpu-cache.sh). Every process sees only the first GPU; the
shim runs at VRAMCAP_LIMIT=8GiB with VRAMCAP_LOG=info. The timings are
--rounds rounds (default 3) interleaved; the speed rows (marker `goal`)
hold a figure to its goal.
"""
import pytest

from harness import median, ratio

pytestmark = pytest.mark.cache

NB_NOTE = "asked for a non-blocking stream"


def noshim(runner, gpu, **vars):
    return runner.env(CUDA_VISIBLE_DEVICES=gpu.uuid0 or "0", **vars)


def shim(runner, gpu, **vars):
    return runner.env(shim=gpu.shim, VRAMCAP_LIMIT="8GiB", VRAMCAP_LOG="info",
                      CUDA_VISIBLE_DEVICES=gpu.uuid0 or "0", **vars)


@pytest.fixture(scope="session")
def cs(build):
    return build("cache_safety")


def line_text(d):
    return " ".join("%s=%s" % kv for kv in d.items()) or "no RESULT line"


@pytest.mark.parametrize("streams", ["nonblocking", "blocking"])
def test_control_clobbers(gpu, runner, cs, check, streams):
    check.title = "control: the program reuses a block a kernel still writes, %s streams, no shim" % streams
    r = runner.run("naive-" + streams, [cs, "naive", streams], env=noshim(runner, gpu), timeout=60)
    d = r.kv("RESULT")
    check.ran(r)
    check.within("clobbered (the check can see a reuse that does not wait)", d.get("clobbered"), 1, None)
    check.note(line_text(d))


@pytest.mark.parametrize("streams", ["nonblocking", "blocking"])
def test_cache_reuse(gpu, runner, cs, check, streams):
    check.title = ("cache on: cudaFree while a kernel writes, cudaMalloc + copy on another stream, %s streams"
                   % streams)
    r = runner.run("shim-" + streams, [cs, "cuda", streams], env=shim(runner, gpu), timeout=60)
    d = r.kv("RESULT")
    check.ran(r)
    check.within("clobbered", d.get("clobbered"), 0, 0)
    check.kv(d, "reused", 1)
    waited = "yes" if NB_NOTE in r.stderr else "no"
    if streams == "nonblocking":
        check.eq("the shim waited (its log says so: a non-blocking stream)", waited, "yes")
    else:
        check.eq("the shim waited (not needed: the legacy stream orders blocking streams)", waited, "no")
    check.note(line_text(d))


def test_late_nonblocking_stream(gpu, runner, cs, check):
    check.title = ("cache on: a non-blocking stream created after an ordered reuse, copies on it into a block "
                   "a kernel still writes")
    r = runner.run("shim-late", [cs, "late"], env=shim(runner, gpu), timeout=60)
    d = r.kv("RESULT")
    check.ran(r)
    check.within("clobbered (the shim waits for its orderings when the stream is asked for)",
                 d.get("clobbered"), 0, 0)
    check.kv(d, "reused", 1)
    check.note(line_text(d))


CHURN = {
    "base": (False, [], {}),
    "off": (True, [], {"VRAMCAP_CACHE": "off"}),
    "wait": (True, ["nbstream"], {}),
    "ordered": (True, [], {}),
    "once": (False, ["once"], {}),
}


@pytest.fixture(scope="session")
def churn_runs(gpu, runner, build):
    """churn.cu 5000 iterations, --rounds rounds of: without the shim, cache
    off, cache on with an unused non-blocking stream (the cache waits), cache
    on (ordered), and the kernels alone with the buffers allocated once (the
    floor). {variant: [RESULT dicts]}."""
    ch = build("churn")
    out = {v: [] for v in CHURN}
    for rnd in range(1, gpu.rounds + 1):
        for v, (with_shim, args, vars) in CHURN.items():
            env = shim(runner, gpu, **vars) if with_shim else noshim(runner, gpu, **vars)
            out[v].append(runner.run("churn-%s-%d" % (v, rnd), [ch, 5000] + args, env=env, timeout=60).kv("RESULT"))
    return out


def test_churn_identical(churn_runs, check):
    check.title = "churn.cu 5000 iterations: identical results"
    sums = {d.get("checksum") for runs in churn_runs.values() for d in runs}
    check.that(len(sums) == 1 and all(s and s.isdigit() for s in sums), "one checksum over every run",
               "checksums: %s" % " ".join(sorted(str(s) for s in sums)))


@pytest.mark.goal
def test_churn_speedup(gpu, churn_runs, check):
    check.title = "churn.cu speed-up over no shim (median ms of %d)" % gpu.rounds
    m = {v: median(d.get("ms") for d in runs) for v, runs in churn_runs.items()}
    sp = ratio(m["ordered"], m["base"])
    check.at_least("cache on, ordered: speed-up over no shim (goal)", sp if sp != "NA" else None, 10,
                   show=lambda x: "%gx" % x)
    check.note("no shim %s ms; cache off %s ms; cache waits %s ms (%sx); cache ordered %s ms; the kernels alone, "
               "buffers allocated once, no shim: %s ms (%sx, the floor)" % (
                   m["base"], m["off"], m["wait"], ratio(m["wait"], m["base"]), m["ordered"], m["once"],
                   ratio(m["once"], m["base"])))


@pytest.mark.goal
def test_torch_without_caching_allocator(gpu, runner, check):
    """PyTorch's caching allocator without the shim, PYTORCH_NO_CUDA_MEMORY_CACHING=1
    without and with the shim, --rounds rounds interleaved."""
    check.title = ("PyTorch MLP step, PYTORCH_NO_CUDA_MEMORY_CACHING=1 under the shim vs PyTorch's own caching "
                   "allocator (median ms of %d)" % gpu.rounds)
    ts = {"caching": [], "nocache": [], "shim": []}
    waited = "no"
    argv = [gpu.python, gpu.script("bench_torch.py")]
    for rnd in range(1, gpu.rounds + 1):
        for v in ts:
            env = {"caching": noshim(runner, gpu),
                   "nocache": noshim(runner, gpu, PYTORCH_NO_CUDA_MEMORY_CACHING=1),
                   "shim": shim(runner, gpu, PYTORCH_NO_CUDA_MEMORY_CACHING=1)}[v]
            r = runner.run("torch-%s-%d" % (v, rnd), argv, env=env, timeout=180)
            ts[v].append(r.kv("BENCH").get("ms_per_step"))
            if v == "shim" and NB_NOTE in r.stderr:
                waited = "yes"
    tc, tn, t_s = (median(ts[v]) for v in ("caching", "nocache", "shim"))
    rs = ratio(tc, t_s)
    check.at_most("no caching under the shim / caching allocator (goal)", rs if rs != "NA" else None, 1.2,
                  show=lambda x: "%gx" % x)
    check.note("caching allocator %s ms; no caching, no shim %s ms (%sx); no caching, shim %s ms; the shim waited: %s"
               % (tc, tn, ratio(tc, tn), t_s, waited))
