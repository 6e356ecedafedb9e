"""Issue 35: Python without a launcher, on the real driver. The release wheel
(DIR/vramcap-*.whl) and, for the Jupyter row, DIR/jupyter-wheels/
(jupyter_client and ipykernel for the machine's Python) are installed
offline into a fresh virtual environment that sees --python's packages
(torch) through a .pth file. No row uses a launcher or LD_PRELOAD.
"""
import glob
import os

import pytest

from harness import GiB, mib
from test_wheel import wheel_venv

pytestmark = pytest.mark.python

BARE = dict(LD_PRELOAD=None, VRAMCAP_LIBRARY=None, VRAMCAP_LIMIT=None, VRAMCAP_GROUP=None)


@pytest.fixture(scope="session")
def pyenv(gpu, runner, work):
    v, whl, r1, r2 = wheel_venv(gpu, runner, work, "pyvenv")
    site = (glob.glob(os.path.join(v, "lib", "python3*", "site-packages")) or [None])[0]
    return dict(dir=v, site=site, whl=whl, py=os.path.join(v, "bin", "python"), made=(r1, r2))


def bare(runner, **vars):
    return runner.env(**dict(BARE, **vars))


def test_install(pyenv, check):
    check.title = "pip install %s into a fresh venv (offline)" % os.path.basename(pyenv["whl"])
    for r in pyenv["made"]:
        check.ran(r)
    pth = pyenv["site"] and os.path.isfile(os.path.join(pyenv["site"], "vramcap_autostart.pth"))
    check.that(pth, "site-packages/vramcap_autostart.pth", "the .pth is there" if pth else "no .pth")


def torch_fill_checks(check, r):
    d = r.kv()
    check.ran(r)
    check.eq("total", d.get("total"), 2 * GiB, show=mib)
    check.kv(d, "oom", 1)
    check.within("bytes", d.get("bytes"), GiB, 2 * GiB, show=mib)


def test_the_variable_alone(gpu, pyenv, runner, check):
    check.title = "VRAMCAP_LIMIT=2GiB python check_torch.py (the .pth alone)"
    r = runner.run("py-env-limit", [pyenv["py"], gpu.script("check_torch.py"), "--max-bytes", 4 * GiB],
                   env=bare(runner, VRAMCAP_LIMIT="2GiB"), timeout=180)
    torch_fill_checks(check, r)


def test_set_limit_at_the_top(gpu, pyenv, runner, work, check):
    check.title = 'python train.py, first line vramcap.set_limit(0, "2GiB")'
    script = os.path.join(work, "train.py")
    with open(script, "w") as f:
        f.write('import vramcap; vramcap.set_limit(0, "2GiB")\n'
                "import runpy, sys\n"
                "sys.path.insert(0, %r)\n"
                "sys.argv = ['check_torch.py', '--max-bytes', '%d']\n"
                "runpy.run_path(%r, run_name='__main__')\n" % (gpu.src, 4 * GiB, gpu.script("check_torch.py")))
    r = runner.run("py-set-limit", [pyenv["py"], script], env=bare(runner), timeout=180)
    torch_fill_checks(check, r)
    said = ("vramcap: set_limit(0, '2GiB'): restarting this program under libvramcap.so with "
            "VRAMCAP_LIMIT=0=2GiB")
    lines = r.stderr.splitlines()
    check.eq("restart lines", sum(1 for l in lines if l == said), 1)


def test_not_active_after_cuda(pyenv, runner, check):
    check.title = "set_limit after torch.zeros(1, device='cuda')"
    r = runner.run("py-after-cuda", [pyenv["py"], "-c", "\n".join([
        "import vramcap._autostart as a",
        "import torch",
        "print('LOADED_AFTER_IMPORT', int(a.cuda_loaded()))",
        "torch.zeros(1, device='cuda')",
        "import vramcap",
        "try:",
        "    vramcap.set_limit(0, '2GiB')",
        "except vramcap.NotActive as e:",
        "    print('NOTACTIVE', str(e).splitlines()[0])"])], env=bare(runner), timeout=120)
    check.ran(r)
    want = ("NOTACTIVE set_limit(0, '2GiB'): libvramcap.so is not loaded and CUDA is initialised in this "
            "process already, and the shim must be there first; start it as: ")
    got = next((l for l in r.stdout.splitlines() if l.startswith("NOTACTIVE")), "")
    check.that(got.startswith(want) and "vramcap run --limit 0=2GiB -- " in got,
               "NotActive naming vramcap run --limit 0=2GiB", got[:220] or "no NotActive")
    check.note(next((l for l in r.stdout.splitlines() if l.startswith("LOADED_AFTER_IMPORT")), "")
               + " (libcuda loaded by import torch alone)")


def test_vramcap_torch(pyenv, runner, check):
    check.title = "vramcap.torch beside torch.cuda (VRAMCAP_LIMIT=4GiB, lowered to 2 GiB)"
    r = runner.run("py-vramcap-torch", [pyenv["py"], "-c", "\n".join([
        "import vramcap.torch as vt",
        "vt.set_limit('cuda:0', 2 * 1024**3)",
        "import torch",
        "x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')",
        "s = vt.memory_stats(0)",
        "print('VT', 'limit=%d' % vt.get_limit(0), 'alloc=%d' % s['allocated_bytes.all.current'],",
        "      'reserved=%d' % s['reserved_bytes.all.current'], 'torch_reserved=%d' % torch.cuda.memory_reserved(0),",
        "      'total=%d' % torch.cuda.mem_get_info()[1], 'vt_total=%d' % vt.mem_get_info(0)[1])"])],
        env=bare(runner, VRAMCAP_LIMIT="4GiB"), timeout=120)
    d = r.kv("VT")
    check.ran(r)
    for k in ("limit", "total", "vt_total"):
        check.kv(d, k, 2 * GiB, show=mib)
    a, res, t = (int(d.get(k, -1)) for k in ("alloc", "reserved", "torch_reserved"))
    check.that(res >= a >= t >= GiB, "reserved >= allocated >= torch.cuda.memory_reserved >= 1 GiB",
               "reserved=%d allocated=%d torch_reserved=%d" % (res, a, t))


def test_jupyter_kernel(gpu, pyenv, runner, work, check):
    check.title = "kernel from vramcap kernel install --limit 2GiB, started by jupyter_client"
    wheels = os.path.join(gpu.art, "jupyter-wheels")
    if os.path.isdir(wheels):
        check.ran(runner.run("py-jupyter-pip", [os.path.join(pyenv["dir"], "bin", "pip"), "install", "--no-index",
                                                "--no-cache-dir", "--find-links", wheels, "jupyter_client",
                                                "ipykernel"], env=runner.env(PIP_DISABLE_PIP_VERSION_CHECK=1),
                                 timeout=180))
    jenv = dict(JUPYTER_DATA_DIR=os.path.join(work, "jupyter"), JUPYTER_RUNTIME_DIR=os.path.join(work, "jupyter-run"))
    ri = runner.run("py-kernel-install", [os.path.join(pyenv["dir"], "bin", "vramcap"), "kernel", "install",
                                          "--limit", "2GiB"], env=bare(runner, **jenv), timeout=60)
    check.ran(ri)
    r = runner.run("py-kernel", [pyenv["py"], gpu.script("check_kernel.py"), "vramcap-2gib", GiB],
                   env=bare(runner, **jenv), timeout=300)
    d = r.kv()
    check.ran(r)
    check.kv(d, "pid_match", 1)
    check.kv(d, "active", "True")
    check.kv(d, "total", 2 * GiB, show=mib)
    check.kv(d, "oom", 1)
    check.within("filled_mib", d.get("filled_mib"), 1024, 2048)
    check.kv(d, "lowered_limit", GiB, show=mib)
    check.kv(d, "lowered_total", GiB, show=mib)
    check.note(ri.first_line())


def test_start_cost(gpu, pyenv, runner, check):
    check.title = "python -c pass, with and without the .pth (150 interleaved runs)"
    r = runner.run("py-start", [pyenv["py"], os.path.join(gpu.root, "scripts", "bench-python-start.py"),
                                "--venv", pyenv["dir"], "--runs", 150, "--set"], env=bare(runner), timeout=300)
    check.ran(r)
    check.note("; ".join(" ".join(l.split()) for l in r.stdout.splitlines()
                         if l.startswith(("with", "without", "difference", "site", "VRAMCAP_LIMIT set")))[:600])
