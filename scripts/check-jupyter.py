#!/usr/bin/env python3
"""check-jupyter.py — issue 35's Jupyter rows against the stand-in driver.

A kernelspec written by `vramcap kernel install --limit 1GiB` is started by
jupyter_client's KernelManager, as a notebook server starts it, and cells
run in it through a kernel client:

1. install writes the kernelspec into JUPYTER_DATA_DIR, with the
   environment's python (the first python3 on PATH) as the kernel's;
2. the kernel is the process KernelManager started (`vramcap run` execs),
   under the shim with VRAMCAP_LIMIT=1GiB, and its allocations on the
   stand-in driver stop at 1 GiB;
3. a cell lowers the cap with vramcap.set_limit and the next allocation is
   refused at the new cap; a raise above the start cap is refused;
4. the environment's own python3 kernel (not under the shim) answers
   vramcap.set_limit with NotActive naming `vramcap kernel install`;
5. `vramcap kernel list` shows the kernel and `vramcap kernel remove` takes
   it away.

The environment is made as the wheel makes one: the package from python/
with the debug shim in it, the start hook, and the CLI in its bin/.
Installs jupyter_client and ipykernel (pinned) from PyPI into
target/jupyter-venv when missing. Usage: scripts/check-jupyter.py after
`cargo build -p vramcap -p vramcap-shim`. Exits non-zero with one line
naming the first difference.
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile

from check_report import reporters

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "gpu"))
from jupyter_cell import run_cell  # noqa: E402 (scripts/gpu, shared with check_kernel.py)
VENV = os.path.join(ROOT, "target", "jupyter-venv")
PINS = ["jupyter_client==8.6.3", "ipykernel==6.29.5"]
CLI = os.path.join(ROOT, "target", "debug", "vramcap")
SHIM = os.path.join(ROOT, "target", "debug", "libvramcap.so")
STANDIN = os.path.join(ROOT, "target", "standin-jupyter")
MIB = 1 << 20

ALLOC = """
import ctypes
cu = ctypes.CDLL("libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0 and cu.cuCtxSetCurrent(ctx) == 0
def fill(size, most):
    p, n, rc = ctypes.c_uint64(), 0, 0
    while n < most:
        rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size))
        if rc:
            break
        n += 1
    return n, rc
"""


fail, step, want = reporters("check-jupyter")


def ensure_venv():
    """The venv with jupyter_client and ipykernel, and vramcap laid out as
    the wheel lays it out (refreshed from this checkout each run)."""
    py = os.path.join(VENV, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    probe = subprocess.run([py, "-c", "import jupyter_client, ipykernel"], capture_output=True)
    if probe.returncode != 0:
        subprocess.run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", *PINS],
                       check=True)
    site = glob.glob(os.path.join(VENV, "lib", "python3*", "site-packages"))[0]
    pkg = os.path.join(site, "vramcap")
    shutil.rmtree(pkg, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "python", "vramcap"), pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "libvramcap.so"))
    shutil.copyfile(SHIM, os.path.join(pkg, "libvramcap.so"))
    shutil.copyfile(os.path.join(ROOT, "python", "vramcap_autostart.pth"),
                    os.path.join(site, "vramcap_autostart.pth"))
    cli = os.path.join(VENV, "bin", "vramcap")
    if os.path.lexists(cli):
        os.unlink(cli)
    os.symlink(CLI, cli)
    return py


def vramcap(*args):
    return subprocess.run([os.path.join(VENV, "bin", "vramcap"), *args], capture_output=True,
                          text=True)


def run_checks(data):
    from jupyter_client.manager import KernelManager

    py3 = os.path.join(VENV, "bin", "python3")
    kdir = os.path.join(data, "kernels", "vramcap-1gib")
    r = vramcap("kernel", "install", "--limit", "1GiB")
    want("kernel install", (r.returncode, r.stdout, r.stderr),
         (0, f"installed kernel vramcap-1gib (Python 3 (vramcap 1 GiB)) in {kdir}\n", ""))
    step("1. vramcap kernel install --limit 1GiB wrote " + kdir)

    km = KernelManager(kernel_name="vramcap-1gib")
    want("the kernelspec's display name", km.kernel_spec.display_name, "Python 3 (vramcap 1 GiB)")
    want("the kernel's python", km.kernel_spec.argv[4], py3)
    km.start_kernel()
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        got = run_cell(kc, "import os, vramcap\nprint(os.getpid(), vramcap.is_active(), "
                           "os.environ['VRAMCAP_LIMIT'])")
        want("the kernel's process", got, (f"{km.provisioner.pid} True 1GiB", []))
        got = run_cell(kc, ALLOC + "print(*fill(256 << 20, 16))")
        want("allocations in the capped kernel", got, ("4 2", []))
        step(f"2. the kernel (pid {km.provisioner.pid}) runs under the shim; "
             "256 MiB allocations stop at 4 (1 GiB)")
        got = run_cell(kc, "vramcap.set_limit(0, '512MiB')\nprint(vramcap.get_limit(0), *fill(1 << 20, 1))")
        want("set_limit from a cell, then 1 MiB more", got, (f"{512 * MIB} 0 2", []))
        got = run_cell(kc, "vramcap.set_limit(0, '2GiB')")
        want("a raise above the start cap", got[1][0].split(":")[0], "PermissionError")
        step("3. a cell lowered the cap to 512 MiB (1 MiB more is refused); a raise to 2 GiB is refused")
        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)

    km = KernelManager(kernel_name="python3")
    km.start_kernel()
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        got = run_cell(kc, "import vramcap\nvramcap.set_limit(0, '2GiB')")
        want("set_limit in a kernel not under the shim", got, ("", [
            "NotActive: set_limit(0, '2GiB'): libvramcap.so is not loaded and a notebook kernel "
            "cannot restart itself without losing its state; install a capped kernel with "
            "`vramcap kernel install --limit 0=2GiB` and switch this notebook to it"]))
        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)
    step("4. in the plain python3 kernel, set_limit raises NotActive naming vramcap kernel install")

    r = vramcap("kernel", "list")
    want("kernel list", r.stdout, f"vramcap-1gib  Python 3 (vramcap 1 GiB)  {kdir}\n")
    r = vramcap("kernel", "remove", "vramcap-1gib")
    want("kernel remove", (r.returncode, r.stdout), (0, f"removed kernel vramcap-1gib from {kdir}\n"))
    want("the kernelspec after remove", os.path.exists(kdir), False)
    step("5. vramcap kernel list shows it; vramcap kernel remove took it away")


def main():
    for p in (CLI, SHIM):
        if not os.path.exists(p):
            fail(f"{p} is missing: run cargo build -p vramcap -p vramcap-shim first")
    py = ensure_venv()
    if os.environ.get("CHECK_JUPYTER_IN_VENV") != "1":
        subprocess.run(["sh", os.path.join(ROOT, "tests", "standin", "build.sh"), STANDIN],
                       check=True, stdout=subprocess.DEVNULL)
        work = tempfile.mkdtemp(prefix="check-jupyter-")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("VRAMCAP_") and k not in ("LD_PRELOAD", "JUPYTER_PATH")}
        env.update(
            CHECK_JUPYTER_IN_VENV="1",
            JUPYTER_DATA_DIR=os.path.join(work, "data"),
            JUPYTER_RUNTIME_DIR=os.path.join(work, "runtime"),
            IPYTHONDIR=os.path.join(work, "ipython"),
            LD_LIBRARY_PATH=os.path.join(STANDIN, "lib"),
            VRAMCAP_STATS_DIR=os.path.join(work, "stats"),
            VRAMCAP_LOG="error",
            PATH=os.path.join(VENV, "bin") + os.pathsep + os.environ.get("PATH", ""),
        )
        try:
            rc = subprocess.run([py, os.path.abspath(__file__)], env=env).returncode
        finally:
            shutil.rmtree(work, ignore_errors=True)
        sys.exit(rc)
    run_checks(os.environ["JUPYTER_DATA_DIR"])
    step("all checks passed")


if __name__ == "__main__":
    main()
