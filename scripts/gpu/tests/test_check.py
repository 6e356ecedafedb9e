"""The cap on every allocation path and framework, and the freed-block cache
(the rows of the former scripts/gpu-check.sh; CAP = --cap, default 4 GiB).

Every check is a fresh process. Allocation loops step by 256 MiB (CHUNK)
and stop at CAP + 1 GiB whatever happens; the counted context may take up
to 768 MiB of the cap (a bare context is 518 MiB in NVML on the H200,
PyTorch's 610), so a capped loop must end within CHUNK + 768 MiB of CAP.
"""
import os

import pytest

from harness import GiB, MiB, as_int, mib, ratio

pytestmark = pytest.mark.full

CHUNK = 256 * MiB
CTX_ALLOW = 768 * MiB
CU_TIMEOUT = 120
PY_TIMEOUT = 180
MANAGED_LOOP_MAX = 6 * GiB - 256 * MiB  # what capcheck clamps managed memory to


@pytest.fixture(scope="session")
def capcheck(build):
    return build("capcheck")


def shim_env(runner, gpu, cap, **vars):
    return runner.env(shim=gpu.shim, VRAMCAP_LIMIT=cap.text, **vars)


# ---------------------------------------------------------------- the CLI and limit parsing

@pytest.mark.smoke
def test_artefacts_present(gpu, check):
    check.title = "artefacts present"
    check.that(os.access(gpu.shim, os.R_OK), "libvramcap.so readable in DIR", "libvramcap.so: %s" % gpu.shim)
    check.that(os.access(gpu.cli, os.X_OK), "vramcap executable in DIR", "vramcap: %s" % gpu.cli)


@pytest.mark.smoke
def test_cli_version(gpu, runner, check):
    check.title = "vramcap --version"
    r = runner.run("cli-version", [gpu.cli, "--version"], timeout=30)
    check.ran(r)
    check.note(r.first_line(width=60))


@pytest.mark.smoke
def test_bad_limit_refused(gpu, runner, check):
    check.title = "VRAMCAP_LIMIT=8XB true"
    r = runner.run("shim-bad-limit", ["true"], env=runner.env(shim=gpu.shim, VRAMCAP_LIMIT="8XB"), timeout=30)
    check.ran(r, rc=2)
    check.that("VRAMCAP_LIMIT" in r.stderr, "stderr names VRAMCAP_LIMIT", "stderr: " + r.first_line("stderr", 100))


@pytest.mark.smoke
def test_good_limit_leaves_non_cuda_program(gpu, runner, cap, check):
    check.title = "VRAMCAP_LIMIT=%s true (non-CUDA program unaffected)" % cap.text
    r = runner.run("shim-good-limit", ["true"], env=shim_env(runner, gpu, cap), timeout=30)
    check.ran(r)
    check.note("stderr: " + (r.first_line("stderr", 80) or "(empty)"))


@pytest.mark.smoke
def test_build_capcheck(builds, check):
    check.title = "build capcheck.cu"
    path, err = builds.try_build("capcheck")
    check.that(path is not None, "nvcc builds it (%s)" % builds.arch, "ok" if path else err[:300])


# ---------------------------------------------------------------- cudaMemGetInfo and totalGlobalMem

def info_obs(d):
    return "total=%s props=%s cu_total=%s cu_devtotal=%s free=%s" % (
        mib(d.get("total")), mib(d.get("props_total")), mib(d.get("cu_total")), mib(d.get("cu_devtotal")),
        mib(d.get("free")))


@pytest.fixture(scope="session")
def baseline_info(runner, capcheck):
    """capcheck info without the shim, run once: the real totals."""
    return runner.run("capcheck-info-noshim", [capcheck, "info"], env=runner.env(), timeout=CU_TIMEOUT)


@pytest.mark.smoke
def test_info_no_shim(baseline_info, cap, check):
    check.title = "capcheck info, no shim (baseline)"
    r = baseline_info
    d = r.kv("RESULT")
    check.ran(r)
    check.within("total", d.get("total"), cap, None, show=mib, lo_open=True)
    check.within("props_total", d.get("props_total"), cap, None, show=mib, lo_open=True)
    check.note(info_obs(d))


@pytest.mark.smoke
def test_info_capped(gpu, runner, cap, capcheck, check):
    check.title = "capcheck info, CAP"
    r = runner.run("capcheck-info-cap", [capcheck, "info"], env=shim_env(runner, gpu, cap), timeout=CU_TIMEOUT)
    d = r.kv("RESULT")
    check.ran(r)
    check.eq("cudaMemGetInfo total", d.get("total"), int(cap), show=mib)
    check.eq("totalGlobalMem", d.get("props_total"), int(cap), show=mib)
    check.note(info_obs(d))


@pytest.mark.smoke
def test_info_shim_without_limit(gpu, runner, capcheck, baseline_info, check):
    check.title = "capcheck info, shim without VRAMCAP_LIMIT"
    base = baseline_info.kv("RESULT")
    r = runner.run("capcheck-info-nolimit", [capcheck, "info"], env=runner.env(shim=gpu.shim), timeout=CU_TIMEOUT)
    d = r.kv("RESULT")
    check.ran(r)
    check.that(base.get("total"), "a baseline to compare with", "baseline total=%s" % mib(base.get("total")))
    check.eq("total", d.get("total"), base.get("total"), show=mib)
    check.eq("props_total", d.get("props_total"), base.get("props_total"), show=mib)
    check.note(info_obs(d))


# ---------------------------------------------------------------- allocation loops

def alloc_obs(d):
    return "bytes=%s err=%s(%s) stop=%s total=%s free=%s" % (
        mib(d.get("bytes")), d.get("err"), d.get("errname"), d.get("stop"), mib(d.get("total")), mib(d.get("free")))


def verify_state(r):
    if r.has_line(r"^VERIFY ok$"):
        return "ok"
    return "bad" if r.has_line(r"^VERIFY") else "none"


def touch_state(r):
    if r.has_line(r"^TOUCH (bad|error)"):
        return "bad"
    return "ok" if r.has_line(r"^TOUCH ok") else "none"


def test_cudamalloc_no_shim_reaches_hard_stop(runner, capcheck, check):
    check.title = "capcheck cudaMalloc, no shim, stop 6 GiB"
    r = runner.run("capcheck-cudaMalloc-noshim", [capcheck, "cudaMalloc", 6 * GiB], env=runner.env(),
                   timeout=CU_TIMEOUT)
    d = r.kv("RESULT")
    check.ran(r)
    check.eq("bytes", d.get("bytes"), 6 * GiB, show=mib)
    check.eq("stop", d.get("stop"), "limit")
    check.eq("VERIFY", verify_state(r), "ok")
    check.note(alloc_obs(d))


@pytest.mark.parametrize("mode", [
    pytest.param("cudaMalloc", marks=pytest.mark.smoke),
    pytest.param("cuMemAlloc", marks=pytest.mark.smoke),
    "cudaMallocPitch",
    "cudaMallocManaged",
])
def test_capped_loop(gpu, runner, cap, capcheck, check, mode):
    check.title = "capcheck %s, CAP" % mode
    maxb = cap + GiB
    if mode == "cudaMallocManaged":
        maxb = min(maxb, 6 * GiB)  # never more managed memory than that (the machine's rule)
        if (cap // CHUNK + 1) * CHUNK > MANAGED_LOOP_MAX:
            check.note("CAP too large for the managed 6 GiB safety stop")
    r = runner.run("capcheck-%s-cap" % mode, [capcheck, mode, maxb], env=shim_env(runner, gpu, cap),
                   timeout=CU_TIMEOUT)
    d = r.kv("RESULT")
    check.ran(r)
    check.that(d, "a RESULT line", "RESULT line: %s" % ("yes" if d else "none"))
    check.within("bytes", d.get("bytes"), cap - CHUNK - CTX_ALLOW, cap, show=mib, lo_open=True)
    check.eq("err", d.get("err"), 2)
    if mode == "cudaMalloc":
        check.eq("total", d.get("total"), int(cap), show=mib)
    check.eq("VERIFY", verify_state(r), "ok")
    if mode == "cudaMallocPitch":
        check.note("pitch=%s" % d.get("pitch"))
    check.note(alloc_obs(d))


NEW_MODES = ["cudaMallocAsync", "cudaMemPool", "cuMemCreate", "cudaMallocArray", "cudaMalloc3DArray"]
TOUCHES = {"cuMemCreate", "cudaMallocArray", "cudaMalloc3DArray"}
ARRAYS = {"cudaMallocArray", "cudaMalloc3DArray"}


def mode_extra(mode, d):
    if mode in ("cudaMallocAsync", "cudaMemPool"):
        return "pool_reserved=%s errat=%s" % (mib(d.get("pool_reserved")), d.get("errat"))
    if mode == "cuMemCreate":
        return "granularity=%s mapped=%s" % (mib(d.get("granularity")), d.get("mapped"))
    return "first_delta=%s" % mib(d.get("first_delta"))


@pytest.mark.parametrize("mode", NEW_MODES)
def test_path_works_without_shim(runner, capcheck, check, mode):
    """Without the shim each path reaches a 1 GiB hard stop: the program itself
    works there, so a failure under the shim is the shim's."""
    check.title = "capcheck %s, no shim, stop 1 GiB" % mode
    r = runner.run("capcheck-%s-noshim" % mode, [capcheck, mode, GiB], env=runner.env(), timeout=CU_TIMEOUT)
    d = r.kv("RESULT")
    check.ran(r)
    check.eq("bytes", d.get("bytes"), GiB, show=mib)
    check.eq("stop", d.get("stop"), "limit")
    if mode in TOUCHES:
        check.eq("TOUCH", touch_state(r), "ok")
    check.eq("VERIFY", verify_state(r), "ok")
    check.note(mode_extra(mode, d) + " " + alloc_obs(d))


@pytest.mark.parametrize("mode", NEW_MODES)
def test_path_capped(gpu, runner, cap, capcheck, check, mode):
    """Stop within one chunk below CAP (arrays: two, as the driver's real
    array size may be a bit more than the 256 MiB counted), refused with 2,
    and the process still healthy."""
    check.title = "capcheck %s, CAP" % mode
    lo = cap - (2 if mode in ARRAYS else 1) * CHUNK - CTX_ALLOW
    r = runner.run("capcheck-%s-cap" % mode, [capcheck, mode, cap + GiB], env=shim_env(runner, gpu, cap),
                   timeout=CU_TIMEOUT)
    d = r.kv("RESULT")
    check.ran(r)
    check.that(d, "a RESULT line", "RESULT line: %s" % ("yes" if d else "none"))
    check.within("bytes", d.get("bytes"), lo, cap, show=mib, lo_open=True)
    check.eq("err", d.get("err"), 2)
    check.eq("stop", d.get("stop"), "refused")
    if mode in TOUCHES:
        check.eq("TOUCH", touch_state(r), "ok")
    check.eq("VERIFY", verify_state(r), "ok")
    check.note(mode_extra(mode, d) + " " + alloc_obs(d))


# ---------------------------------------------------------------- frameworks

def py_run(gpu, runner, cap, name, script, args, **vars):
    return runner.run(name, [gpu.python, gpu.script(script)] + [str(a) for a in args],
                      env=runner.env(shim=gpu.shim, VRAMCAP_LIMIT=cap.text, **vars), timeout=PY_TIMEOUT)


def show_keys(d, keys):
    sizes = {"total", "bytes", "allocated", "reserved", "bytes_limit", "bytes_reserved", "pool_total_bytes",
             "used", "free", "torch_total", "total_v2", "used_v2"}
    return " ".join("%s=%s" % (k, mib(d.get(k)) if k in sizes else d.get(k, "?")) for k in keys)


TORCH_CONFS = [
    pytest.param(None, id="default", marks=pytest.mark.smoke),
    pytest.param("expandable_segments:True", id="expandable"),
    pytest.param("backend:cudaMallocAsync", id="cudaMallocAsync"),
]


@pytest.mark.parametrize("conf", TORCH_CONFS)
def test_torch(gpu, runner, cap, check, conf):
    check.title = "torch" + (" PYTORCH_CUDA_ALLOC_CONF=%s" % conf if conf else "")
    vars = {"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else {}
    r = py_run(gpu, runner, cap, "torch-%s" % (conf or "default").split(":")[0], "check_torch.py",
               ["--max-bytes", cap + GiB], **vars)
    d = r.kv()
    check.ran(r)
    check.eq("mem_get_info total", d.get("total"), int(cap), show=mib)
    check.kv(d, "oom", 1)
    check.within("memory_allocated", d.get("allocated"), cap - GiB, cap, show=mib)
    check.kv(d, "matmul_ok", 1)
    if conf and "expandable_segments" in conf:
        check.ne("expandable_seen", d.get("expandable_seen"), 0)
    if conf and "cudaMallocAsync" in conf:
        check.kv(d, "alloc_backend_async", 1)
    check.note(show_keys(d, ["reserved", "alloc_backend_async", "expandable_seen", "expandable_segments"]))


def test_torch_under_vramcap_run_and_stat(gpu, runner, cap, check, work):
    check.title = "torch under vramcap run + vramcap stat"
    env = runner.env(VRAMCAP_STATS_DIR=os.path.join(work, "stats-torch-stat"))
    r = runner.run("torch-stat", [gpu.cli, "run", "--limit", cap.text, "--", gpu.python,
                                  gpu.script("check_torch_stat.py"), gpu.cli], env=env, timeout=PY_TIMEOUT)
    d = r.kv()
    check.ran(r)
    used, reserved = as_int(d.get("used")), as_int(d.get("reserved"))
    check.that(used is not None and reserved is not None and used >= reserved,
               "stat USED >= torch.cuda.memory_reserved()", "used=%s reserved=%s" % (mib(used), mib(reserved)))
    check.within("extra (USED - context - reserved)", d.get("extra"), 0, 256 * MiB, show=mib)
    check.eq("limit", d.get("limit"), int(cap), show=mib)
    check.kv(d, "cmd_ok", 1)
    check.note(show_keys(d, ["reserved", "allocated"]) + " context=%s allocs=%s" % (
        mib(d.get("context")), d.get("allocs")))


@pytest.mark.parametrize("mode", ["default", "async"])
def test_cupy(gpu, runner, cap, check, mode):
    check.title = "cupy" + (" MemoryAsyncPool" if mode == "async" else "")
    args = (["--mode", "async"] if mode == "async" else []) + ["--max-bytes", cap + GiB]
    r = py_run(gpu, runner, cap, "cupy-%s" % mode, "check_cupy.py", args)
    d = r.kv()
    check.ran(r)
    if mode == "async":
        check.kv(d, "async_pool", 1)
    check.eq("memGetInfo total", d.get("total"), int(cap), show=mib)
    check.kv(d, "oom", 1)
    check.within("bytes", d.get("bytes"), cap - GiB, cap, show=mib)
    check.kv(d, "compute_ok", 1)
    check.note(show_keys(d, ["pool_total_bytes", "other_error_status", "roundtrip_ok", "kernel_ok"]))


def test_jax_default_preallocation(gpu, runner, cap, check):
    check.title = "jax default (preallocate)"
    r = py_run(gpu, runner, cap, "jax-default", "check_jax.py", ["default"])
    d = r.kv()
    check.ran(r)
    check.within("bytes_limit", d.get("bytes_limit"), cap // 2, cap * 3 // 4 + 64 * MiB, show=mib)
    check.kv(d, "compute_ok", 1)
    check.note(show_keys(d, ["bytes_reserved"]))


JAX_LOOPS = [
    pytest.param("platform", "env_allocator_is_platform", {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"},
                 id="platform"),
    # MEM_FRACTION=1.0 makes the BFC limit the whole (capped) total: with the
    # default 0.75 XLA itself would stop at 0.75*CAP, below CAP-1GiB.
    pytest.param("growth", "env_preallocate_is_false",
                 {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": "1.0"}, id="growth"),
]


@pytest.mark.parametrize("mode,seen,vars", JAX_LOOPS)
def test_jax_loop(gpu, runner, cap, check, mode, seen, vars):
    check.title = ("jax XLA_PYTHON_CLIENT_ALLOCATOR=platform" if mode == "platform" else
                   "jax XLA_PYTHON_CLIENT_PREALLOCATE=false (BFC grows, MEM_FRACTION=1.0)")
    r = py_run(gpu, runner, cap, "jax-%s" % mode, "check_jax.py", [mode, "--max-bytes", cap + GiB], **vars)
    d = r.kv()
    check.ran(r)
    check.kv(d, seen, 1)
    check.kv(d, "exception_raised", 1)
    check.kv(d, "exception_resource_exhausted", 1)
    check.within("bytes", d.get("bytes"), cap - GiB, cap, show=mib)
    check.kv(d, "compute_ok", 1)
    check.note(show_keys(d, ["bytes_limit"]))


def test_numba_device_array(gpu, runner, cap, check):
    check.title = "numba-cuda device_array"
    r = py_run(gpu, runner, cap, "numba", "check_numba.py", ["--max-bytes", cap + GiB])
    d = r.kv()
    check.ran(r)
    check.kv(d, "exception_raised", 1)
    check.eq("oom_error (CUDA_ERROR_OUT_OF_MEMORY or its text)", d.get("oom_error"), 1)
    check.within("bytes", d.get("bytes"), cap - GiB, cap, show=mib)
    check.eq("compute_ok (round trip and @cuda.jit kernel, or a device-to-device copy where the JIT cannot load)",
             d.get("compute_ok"), 1)
    check.note(show_keys(d, ["total", "exception_code", "roundtrip_ok", "kernel_ok", "jit_unavailable", "d2d_ok"]))


def test_nvml_memory_info(gpu, runner, cap, check):
    check.title = "NVML nvmlDeviceGetMemoryInfo"
    r = py_run(gpu, runner, cap, "nvml", "check_nvml.py", ["--hold-bytes", GiB])
    d = r.kv()
    check.ran(r)
    check.eq("nvmlDeviceGetMemoryInfo(0) total", d.get("total"), int(cap), show=mib)
    check.within("used", d.get("used"), GiB, cap, show=mib)
    check.eq("torch mem_get_info total (= NVML total)", d.get("torch_total"), d.get("total") or "none", show=mib)
    check.note("nvml_via=%s %s" % (r.json().get("nvml_via", "?"), show_keys(d, ["free", "total_v2", "used_v2"])))


# ---------------------------------------------------------------- the freed-block cache

@pytest.fixture(scope="session")
def cache_safety(build):
    return build("cache_safety")


def test_cache_safety_control(runner, cache_safety, check):
    """The control: a program that itself reuses a block still being written,
    with no wait, must see clobbering, or the check could detect nothing."""
    check.title = "cache safety control (program reuses without waiting, no shim)"
    r = runner.run("cache-safety-naive", [cache_safety, "naive"], env=runner.env(), timeout=CU_TIMEOUT)
    d = r.kv("RESULT")
    check.ran(r)
    check.within("clobbered", d.get("clobbered"), 1, None)
    check.note(" ".join("%s=%s" % kv for kv in d.items()))


@pytest.mark.parametrize("cache", [pytest.param("on", marks=pytest.mark.smoke), "off"])
def test_cache_safety(gpu, runner, cap, cache_safety, check, cache):
    check.title = "cache safety: free while a kernel writes, reuse on another stream (cache %s)" % cache
    r = runner.run("cache-safety-%s" % cache, [cache_safety, "cuda"],
                   env=shim_env(runner, gpu, cap, VRAMCAP_CACHE="25%" if cache == "on" else "off"),
                   timeout=CU_TIMEOUT)
    d = r.kv("RESULT")
    check.ran(r)
    check.within("clobbered", d.get("clobbered"), 0, 0)
    if cache == "on":
        check.kv(d, "reused", 1)
    check.note(" ".join("%s=%s" % kv for kv in d.items()))


def test_churn_same_results(gpu, runner, cap, build, check):
    """A malloc/free-heavy program: identical results without the shim, cache
    off and cache on; the speed-up is shown, not judged."""
    check.title = "churn.cu 5000 iterations (2 cudaMalloc+cudaFree, 3 kernels each)"
    churn = build("churn")
    envs = {"base": runner.env(), "off": shim_env(runner, gpu, cap, VRAMCAP_CACHE="off"),
            "on": shim_env(runner, gpu, cap)}
    got = {}
    for v, env in envs.items():
        got[v] = runner.run("churn-%s" % v, [churn, 5000], env=env, timeout=CU_TIMEOUT).kv("RESULT")
    sums = [got[v].get("checksum") for v in envs]
    check.that(all(s and s.isdigit() for s in sums) and len(set(sums)) == 1,
               "the same checksum without shim, cache off, cache on", "checksums %s" % "/".join(map(str, sums)))
    ms = {v: got[v].get("ms") for v in envs}
    check.note("ms without shim %s, cache off %s, cache on %s (speed-up %sx)" % (
        ms["base"], ms["off"], ms["on"], ratio(ms["on"], ms["base"], "%.1f")))
