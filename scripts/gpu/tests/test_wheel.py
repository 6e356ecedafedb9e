"""Issue 16: the release wheel (DIR/vramcap-*.whl, from scripts/package.sh)
installed offline into a fresh virtual environment caps PyTorch on the real
driver (the rows of the former scripts/gpu-wheel.sh). The environment sees
--python's packages (for torch) through a .pth file.
"""
import glob
import os
import re

import pytest

from harness import GiB, mib

pytestmark = pytest.mark.wheel


def wheel_venv(gpu, runner, work, name):
    """A fresh venv WORK/NAME with DIR's vramcap-*.whl installed offline:
    (venv, wheel, the venv's run, pip's run). It sees --python's own
    packages (torch) through a .pth file, also when --python is itself a
    virtual environment, whose packages --system-site-packages does not
    reach. No wheel fails the test that asked."""
    whls = sorted(glob.glob(os.path.join(gpu.art, "vramcap-*.whl")))
    if not whls:
        pytest.fail("no vramcap-*.whl in %s" % gpu.art, pytrace=False)
    v = os.path.join(work, name)
    r1 = runner.run(name, [gpu.python, "-m", "venv", "--system-site-packages", v], timeout=120)
    sp = runner.run(name + "-site", [gpu.python, "-c", "import sys; print('\\n'.join(p for p in sys.path if "
                                     "p.endswith(('site-packages', 'dist-packages'))))"], timeout=60)
    for d in glob.glob(os.path.join(v, "lib", "python3*", "site-packages")):
        with open(os.path.join(d, "outer-packages.pth"), "w") as f:
            f.write(sp.stdout)
    r2 = runner.run(name + "-pip", [os.path.join(v, "bin", "pip"), "install", "--no-index", "--no-deps",
                                    "--no-cache-dir", whls[0]], env=runner.env(PIP_DISABLE_PIP_VERSION_CHECK=1),
                    timeout=120)
    return v, whls[0], r1, r2


@pytest.fixture(scope="session")
def venv(gpu, runner, work):
    return wheel_venv(gpu, runner, work, "venv")


def test_install(venv, check):
    v, whl, r1, r2 = venv
    check.title = "pip install %s into a fresh venv (offline)" % os.path.basename(whl)
    check.ran(r1)
    check.ran(r2)


def test_doctor(venv, runner, check):
    check.title = "vramcap doctor (the wheel's CLI, the real driver)"
    v = venv[0]
    r = runner.run("doctor", [os.path.join(v, "bin", "vramcap"), "doctor"], timeout=60)
    check.ran(r)
    check.that(re.search(r"^ok    shim: %s/lib/python3.*/site-packages/vramcap/libvramcap.so" % re.escape(v),
                         r.stdout, re.M), "finds the shim in the venv's package",
               "; ".join(l for l in r.stdout.splitlines() if re.match(r"(ok|FAIL|warn) +shim", l))[:300] or "none")
    check.that(re.search(r"^ok    interposition: ", r.stdout, re.M), "interposition proven",
               "; ".join(l for l in r.stdout.splitlines() if re.match(r"(ok|FAIL|warn) +interposition", l))[:300]
               or "none")


@pytest.mark.parametrize("how", ["cli", "module"])
def test_run_caps_torch(gpu, venv, runner, check, how):
    v = venv[0]
    pre = [os.path.join(v, "bin", "vramcap")] if how == "cli" else [os.path.join(v, "bin", "python"), "-m", "vramcap"]
    check.title = "%s --limit 2GiB -- python check_torch.py" % ("vramcap run" if how == "cli" else
                                                                 "python -m vramcap run")
    r = runner.run("torch-" + how, pre + ["run", "--limit", "2GiB", "--", os.path.join(v, "bin", "python"),
                                          gpu.script("check_torch.py"), "--max-bytes", 4 * GiB], timeout=180)
    d = r.kv()
    check.ran(r)
    check.eq("total", d.get("total"), 2 * GiB, show=mib)
    check.kv(d, "oom", 1)
    check.within("bytes", d.get("bytes"), GiB, 2 * GiB, show=mib)


def test_import_inside(venv, runner, check):
    check.title = "import vramcap under the wheel's vramcap run"
    v = venv[0]
    r = runner.run("inside", [os.path.join(v, "bin", "vramcap"), "run", "--limit", "2GiB", "--",
                              os.path.join(v, "bin", "python"), "-c",
                              'import torch, vramcap; torch.zeros(1, device="cuda"); '
                              'print("INSIDE", vramcap.is_active(), vramcap.get_limit(0))'], timeout=120)
    line = next((l for l in r.stdout.splitlines() if l.startswith("INSIDE")), "")
    check.eq("is_active() and get_limit(0)", line, "INSIDE True %d" % (2 * GiB))
