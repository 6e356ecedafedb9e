"""Issue 14: a cap changed while the program runs, from outside (`vramcap
limit --pid`) and from inside (the Python package over the C ABI), for
PyTorch, CuPy and JAX; and what a changing cap costs an allocation
(../bench_live.cu, side by side in one process). The rows of the former
scripts/gpu-live.sh. Every process starts under VRAMCAP_LIMIT=8GiB and sees
only the first GPU.
"""
import pytest

from harness import GiB, MiB, mib

pytestmark = pytest.mark.live

G = GiB


def shim_env(runner, gpu, **vars):
    return runner.env(shim=gpu.shim, VRAMCAP_LIMIT="8GiB", CUDA_VISIBLE_DEVICES=gpu.uuid0 or "0", **vars)


def live(gpu, runner, mode, **vars):
    return runner.run("live-" + mode, [gpu.python, gpu.script("check_live.py"), mode, "--cli", gpu.cli,
                                       "--root", gpu.root], env=shim_env(runner, gpu, **vars), timeout=180)


def wants(check, d, pairs):
    for k, v in pairs:
        check.kv(d, k, v, show=lambda x: mib(x) if str(x).isdigit() and int(x) >= MiB else str(x))


def test_torch_outside(gpu, runner, check):
    """exit 0; mem_get_info total 2 GiB; a 1.5 GiB tensor OutOfMemoryError, 64
    MiB fits; back to 8 GiB: 1.5 GiB fits; lowered while holding 2.5 GiB: 'over
    the new cap'; freed: --wait exits 0."""
    check.title = "PyTorch at 8 GiB holding 1 GiB, `vramcap limit --pid P 2GiB` from outside"
    r = live(gpu, runner, "torch-outside")
    d = r.kv()
    check.ran(r)
    wants(check, d, [("lower_ok", 1), ("total_low", 2 * G), ("refused_low", 1), ("small_fits", 1),
                     ("raise_ok", 1), ("total_back", 8 * G), ("big_fits_back", 1), ("over_rc", 0),
                     ("over_over", 1), ("wait_rc", 0)])


@pytest.mark.smoke
def test_torch_inside(gpu, runner, check):
    """get_limit and memory_stats 2 GiB; a 1.5 GiB tensor OutOfMemoryError; back
    to 8 GiB fits; 9 GiB PermissionError; with vramcap.limit(): 2 GiB inside,
    8 GiB after."""
    check.title = "PyTorch, vramcap.set_limit(0, '2GiB') from inside (python/vramcap over the C ABI)"
    r = live(gpu, runner, "torch-inside")
    d = r.kv()
    check.ran(r)
    wants(check, d, [("active", 1), ("limit_start", 8 * G), ("limit_low", 2 * G), ("stats_limit", 2 * G),
                     ("total_low", 2 * G), ("refused_low", 1), ("small_fits", 1), ("total_back", 8 * G),
                     ("big_fits_back", 1), ("above_refused", 1), ("in_block", 2 * G), ("after_block", 8 * G)])


def test_cupy(gpu, runner, check):
    """memGetInfo total 2 GiB; a 1.5 GiB array OutOfMemoryError beside 1 GiB;
    back to 8 GiB: fits."""
    check.title = "CuPy, lowered to 2 GiB from outside"
    r = live(gpu, runner, "cupy")
    d = r.kv()
    check.ran(r)
    wants(check, d, [("lower_ok", 1), ("total_low", 2 * G), ("refused_low", 1), ("raise_ok", 1),
                     ("total_back", 8 * G), ("big_fits_back", 1)])


def test_jax(gpu, runner, check):
    """A 1.5 GiB array RESOURCE_EXHAUSTED; back to 8 GiB: fits."""
    check.title = "JAX (platform allocator), lowered to 2 GiB from outside while holding 1 GiB"
    r = live(gpu, runner, "jax", XLA_PYTHON_CLIENT_PREALLOCATE="false", XLA_PYTHON_CLIENT_ALLOCATOR="platform")
    d = r.kv()
    check.ran(r)
    wants(check, d, [("lower_ok", 1), ("refused_low", 1), ("refused_exhausted", 1), ("raise_ok", 1),
                     ("big_fits_back", 1)])


@pytest.mark.goal
@pytest.mark.parametrize("cache", ["on", "off"])
def test_changing_cap_cost(gpu, runner, build, check, cache):
    """cuMemAlloc_v2+cuMemFree_v2 pairs of 1 MiB in one process, blocks
    alternating between a fixed cap and a second thread calling
    vramcap_set_limit every 20 us: the changing blocks' median within 10%."""
    what = "cache hit" if cache == "on" else "VRAMCAP_CACHE=off: the driver's pair"
    check.title = ("alloc+free pair 1 MiB (%s) while another thread changes the cap every 20 µs vs fixed, "
                   "one process" % what)
    bench = build("bench_live")
    extra = {} if cache == "on" else {"VRAMCAP_CACHE": "off"}
    r = runner.run("bench_live_" + cache, [bench, MiB, 20000, 6, 20], env=shim_env(runner, gpu, **extra),
                   timeout=180)
    d = r.kv("LIVE")
    check.ran(r)
    check.at_most("changing/fixed median (ratio)", d.get("ratio"), 1.10)
    check.note(" ".join("%s=%s" % kv for kv in d.items()))
