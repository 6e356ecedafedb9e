"""The real-GPU checks of vramcap as a pytest suite (see ../README.md).

  python3 -m pytest scripts/gpu/tests --artefacts .gpu --out "$OUT" -m full

Session fixtures: `gpu` (the staged artefacts, the options, the output
folder), `runner` (one program at a time with a timeout, into OUT/gpu-tests.log),
`builds` (nvcc builds of ../*.cu, each made once per run in a temp folder)
and `cap` (the cap in bytes, read by `vramcap size`). Each test fills a
`check` (harness.Check): every criterion is one of its methods, which records
what it asked and what it saw; the test fails at its end if any did not hold.
Every test becomes one row of OUT/gpu-tests.md, rewritten after each test.

Nothing here needs a GPU at collection: `--collect-only` works anywhere; a
missing artefact, nvcc or GPU errors the tests that need it at run time.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_SRC = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(GPU_SRC))
sys.path.insert(0, GPU_SRC)

import harness  # noqa: E402
from harness import GiB  # noqa: E402

_TABLE = None
_T0 = time.monotonic()


def pytest_addoption(parser):
    g = parser.getgroup("vramcap-gpu")
    g.addoption("--artefacts", default=os.environ.get("VRAMCAP_ARTEFACTS"),
                help="folder with libvramcap.so and vramcap (and COMMIT), e.g. .gpu")
    g.addoption("--out", default=os.environ.get("OUT") or "/tmp/vramcap-gpu",
                help="output folder: NAME.md (the table) and NAME.log (default $OUT, else /tmp/vramcap-gpu)")
    g.addoption("--name", default="gpu-tests", help="the stem of the table and log files (default gpu-tests)")
    g.addoption("--cap", default=os.environ.get("CAP", "4GiB"),
                help="the cap of the full and held checks (1..16 GiB, default 4GiB)")
    g.addoption("--python", default=os.environ.get("PYTHON") or sys.executable,
                help="python with torch/jax/cupy/numba (default: this one)")
    g.addoption("--nvcc", default=os.environ.get("NVCC"), help="nvcc (default /usr/local/cuda/bin/nvcc)")
    g.addoption("--cuda-arch", default=os.environ.get("CUDA_ARCH", "sm_90"))
    g.addoption("--budget", type=float, default=float(os.environ.get("BUDGET_S", 0) or 0),
                help="seconds: no test starts after this (it errors 'not run'); 0 = none")
    g.addoption("--test-timeout", type=float, default=900.0,
                help="seconds one test may take before it is stopped (each process has its own too)")
    g.addoption("--keep-work", action="store_true", help="keep the temp folder of builds and scratch files")
    g.addoption("--rounds", type=int, default=3, help="rounds of the cache rows' timings (default 3)")
    g.addoption("--tiered-steps", type=int, default=30)
    g.addoption("--context-mib", type=int, default=520, help="the context counted in tiered caps (MiB)")
    g.addoption("--host-spill", action="store_true", help="tiered: add host spill at the first ratio (slow)")
    g.addoption("--tiered-models", help='tiered: the models (default "llama mlp")')
    g.addoption("--tiered-ratios", help='tiered: the oversubscriptions (default "1.5 1.25 1.1")')
    g.addoption("--tiered-programs", help='tiered: changed programs, e.g. "save_on_cpu fused+save_on_cpu '
                'cuda_graph expandable" (default none)')
    g.addoption("--tiered-program-ratios", help="tiered: the changed programs' ratios (default --tiered-ratios)")
    g.addoption("--tiered-variants", help='tiered: other builds of libvramcap.so side by side, "NAME=PATH ..."')
    g.addoption("--tiered-host-state", help='tiered: AdamW state placed on the host by hand, "MIB[:sq] ..."')
    g.addoption("--park-move", choices=["checkpoint", "shim", "shim+checkpoint"], default=None,
                help="park: VRAMCAP_PARK_MOVE for every row that parks and sets none itself "
                     "(default: unset, the driver's checkpoint)")
    g.addoption("--park-baseline", default=None,
                help="park: another build's libvramcap.so (e.g. .gpu/base/libvramcap.so): the two trainers also "
                     "take turns under it, with its own parking, side by side (issue 43, done-when 4)")
    g.addoption("--tiered-profile", action="store_true",
                help="tiered: profile two more steps of each run and compare kernels (kernel_delta.py)")


class Gpu:
    """What the session knows: paths, options, the GPU's name and UUIDs."""

    def __init__(self, config):
        o = config.getoption
        self.config = config
        self.art = os.path.realpath(o("--artefacts")) if o("--artefacts") else None
        self.shim = os.path.join(self.art, "libvramcap.so") if self.art else None
        self.cli = os.path.join(self.art, "vramcap") if self.art else None
        self.out = o("--out")
        self.log = None  # NAME.log, set when the run writes its outputs
        self.python = o("--python")
        self.src = GPU_SRC
        self.root = ROOT
        self.smi = harness.find_nvidia_smi()
        rows = harness.smi_query(self.smi, "name,driver_version,uuid")
        self.gpu_name = rows[0][0] if rows and len(rows[0]) >= 3 else "unknown"
        self.driver = rows[0][1] if rows and len(rows[0]) >= 3 else "unknown"
        self.uuids = [r[2] for r in rows if len(r) >= 3]
        self.uuid0 = self.uuids[0] if self.uuids else None
        self.commit = harness.commit_of(self.art, ROOT)
        self.rounds = o("--rounds")
        self.park_move = o("--park-move")
        base = o("--park-baseline")
        self.park_baseline = os.path.realpath(base) if base else None

    def script(self, name):
        return os.path.join(self.src, name)


def pytest_configure(config):
    global _TABLE
    if config.option.collectonly or getattr(config, "workerinput", None):
        return
    out = config.getoption("--out")
    os.makedirs(out, exist_ok=True)
    gpu = Gpu(config)
    config._vramcap_gpu = gpu
    header = "vramcap GPU checks (pytest, -m %s) — %s — commit %s — GPU %s, driver %s — CAP=%s%s" % (
        config.option.markexpr or "(all)", time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        gpu.commit, gpu.gpu_name, gpu.driver, config.getoption("--cap"),
        " — VRAMCAP_PARK_MOVE=%s" % gpu.park_move if gpu.park_move else "")
    stem = os.path.join(out, config.getoption("--name"))
    gpu.log = stem + ".log"
    _TABLE = harness.Table(stem + ".md", header)
    with open(gpu.log, "w") as f:
        f.write(header + "\nartefacts: %s\npython: %s\n" % (gpu.art, gpu.python))
    _TABLE.write()


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="session")
def gpu(request):
    g = getattr(request.config, "_vramcap_gpu", None) or Gpu(request.config)
    if not g.art:
        pytest.fail("no artefacts: pass --artefacts DIR (a folder with libvramcap.so and vramcap)", pytrace=False)
    missing = [p for p in (g.shim, g.cli) if not os.path.isfile(p)]
    if missing:
        pytest.fail("artefacts missing: %s" % ", ".join(missing), pytrace=False)
    if not os.access(g.cli, os.X_OK):
        pytest.fail("%s is not executable" % g.cli, pytrace=False)
    return g


@pytest.fixture(scope="session")
def work(request):
    d = tempfile.mkdtemp(prefix="vramcap-gpu.")
    yield d
    if not request.config.getoption("--keep-work"):
        subprocess.run(["rm", "-rf", d], check=False)


@pytest.fixture(scope="session")
def runner(request, gpu, work):
    budget = request.config.getoption("--budget")
    deadline = _T0 + budget if budget else None
    env = dict(os.environ)
    env["VRAMCAP_STATS_DIR"] = os.path.join(work, "stats")
    return harness.Runner(gpu.log, deadline=deadline, env=env)


@pytest.fixture(scope="session")
def builds(request, gpu, work):
    return harness.Builds(GPU_SRC, work, harness.find_nvcc(request.config.getoption("--nvcc")),
                          request.config.getoption("--cuda-arch"), log=gpu.log)


@pytest.fixture(scope="session")
def build(builds):
    """build(name) -> the path of ../NAME.cu built with nvcc, once per run; a
    failed build fails the test that needed it with nvcc's words."""
    def b(name, **kw):
        try:
            return builds.build(name, **kw)
        except harness.BuildError as e:
            pytest.fail(str(e), pytrace=False)
    return b


@pytest.fixture(scope="session")
def cap(request, gpu):
    """The cap of the full and held checks, in bytes (as `vramcap size` reads --cap)."""
    text = request.config.getoption("--cap")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "VRAMCAP_LIMIT")}
    p = subprocess.run([gpu.cli, "size", text], capture_output=True, text=True, env=env, timeout=30)
    n = harness.as_int(p.stdout.strip())
    if p.returncode != 0 or n is None:
        pytest.fail("cannot read --cap %r with `vramcap size`: %s" % (text, p.stderr.strip()), pytrace=False)
    if not GiB <= n <= 16 * GiB:
        pytest.fail("--cap %s (%d bytes) is outside 1..16 GiB (the machine's safety rule)" % (text, n), pytrace=False)
    return Cap(text, n)


class Cap(int):
    """The cap in bytes, with the text given (passed verbatim as VRAMCAP_LIMIT)."""

    def __new__(cls, text, n):
        c = int.__new__(cls, n)
        c.text = text
        return c


@pytest.fixture
def check(request):
    c = harness.Check(request.node.name)
    request.node._vramcap_check = c
    return c


# ---------------------------------------------------------------- hooks

def pytest_collection_modifyitems(config, items):
    """Rows an option adds (e.g. --tiered-programs) are absent, not skipped,
    when the option is not given: pytest's empty parameter sets go."""
    keep, drop = [], []
    for item in items:
        m = item.get_closest_marker("skip")
        reason = (m.kwargs.get("reason") or (m.args[0] if m.args else "")) if m else ""
        (drop if str(reason).startswith("got empty parameter set") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_runtest_setup(item):
    budget = item.config.getoption("--budget")
    if budget and time.monotonic() - _T0 > budget:
        pytest.fail("not run: the time budget of %.0f s is spent" % budget, pytrace=False)


class TestTimeout(Exception):
    pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    limit = item.config.getoption("--test-timeout")
    old = None
    if limit and limit > 0 and hasattr(signal, "SIGALRM"):
        def on_alarm(signum, frame):
            raise TestTimeout("the test ran past --test-timeout %.0f s" % limit)
        old = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        outcome = yield
    finally:
        if old is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    c = getattr(item, "_vramcap_check", None)
    if outcome.excinfo is None and c is not None:
        err = None
        if not c.expected:
            err = AssertionError("the test asserted nothing through its check")
        elif c.failures:
            err = AssertionError("not as expected:\n  " + "\n  ".join(c.failures))
        if err is not None:
            if hasattr(outcome, "force_exception"):
                outcome.force_exception(err)
            else:  # pluggy < 1.1
                raise err


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if _TABLE is None:
        return
    c = getattr(item, "_vramcap_check", None)
    title = (c.title if c is not None and c.title else item.name)
    if rep.when == "call":
        verdict = "PASS" if rep.passed else ("SKIP" if rep.skipped else "FAIL")
        exp = c.expected_text() if c is not None else ""
        obs = c.observed_text() if c is not None else ""
        if rep.failed and c is not None and not c.failures:
            obs = (obs + "; " if obs else "") + _reason(call)
        elif rep.failed and c is None:
            obs = _reason(call)
        elif rep.skipped:
            obs = _reason(call)
        _TABLE.add(title, exp, obs, verdict)
    elif rep.when == "setup" and not rep.passed:
        verdict = "SKIP" if rep.skipped else "ERROR"
        _TABLE.add(title, "", ("not run: " if rep.failed else "skipped: ") + _reason(call), verdict)
    elif rep.when == "teardown" and rep.failed:
        _TABLE.add(title + " (teardown)", "", _reason(call), "ERROR")


def _reason(call):
    if call.excinfo is None:
        return ""
    e = call.excinfo.value
    text = getattr(e, "msg", None) or str(e) or call.excinfo.typename
    return " ".join(str(text).split())[:400]


def pytest_sessionfinish(session, exitstatus):
    if _TABLE is not None:
        _TABLE.write(finished=True)


def pytest_terminal_summary(terminalreporter):
    if _TABLE is not None and _TABLE.rows:
        terminalreporter.write_sep("=", "vramcap GPU table (%s)" % _TABLE.path)
        terminalreporter.write(_TABLE.render(finished=True))
