"""Ways around the preload on the real driver (issue 32): a library linked
with -lcuda loaded with RTLD_DEEPBIND or dlmopen, and a driver function
looked up above the CUDA versions the hooks were written for. The programs
are tests/clients/escape.c and escape_lib.c, built with gcc against nvcc's
headers and the machine's libcuda.so.1.

Under a 2 GiB cap (the ~518 MiB context counted inside) eight 256 MiB
allocations must stop short: five fit at most. Without the shim all eight
fit, which shows each row can fail.
"""
import os
import subprocess

import pytest

pytestmark = pytest.mark.full

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
CLIENTS = os.path.join(ROOT, "tests", "clients")
CUDA_INCLUDE = "/usr/local/cuda/include"
DRIVER_DIR = "/usr/local/nvidia/lib64"
CAP = "2GiB"
N, MIB = 8, 256
FIT_AT_MOST = (2048 - 500) // MIB


@pytest.fixture(scope="session")
def escape(work):
    """(program, library), built once per run; a failed build errors the rows
    with gcc's words."""
    out = os.path.join(work, "escape")
    os.makedirs(out, exist_ok=True)
    lib = os.path.join(out, "libescape.so")
    exe = os.path.join(out, "escape")
    for argv in (
        ["gcc", "-std=c11", "-O1", "-fPIC", "-shared", "-DREAL_CUDA", "-I", CUDA_INCLUDE, "-I",
         os.path.join(ROOT, "tests", "standin"), "-o", lib, os.path.join(CLIENTS, "escape_lib.c"),
         "-L", DRIVER_DIR, "-l:libcuda.so.1"],
        ["gcc", "-std=c11", "-O1", "-DREAL_CUDA", "-I", CUDA_INCLUDE, "-I",
         os.path.join(ROOT, "tests", "standin"), "-o", exe, os.path.join(CLIENTS, "escape.c"), "-ldl"],
    ):
        p = subprocess.run(argv, capture_output=True, text=True)
        if p.returncode != 0:
            pytest.fail("building %s failed: %s" % (argv[-1], p.stderr.strip()[:400]))
    return exe, lib


def rcs(r):
    return [int(l.rsplit(" ", 1)[1]) for l in r.stdout.splitlines() if l.startswith("alloc ")]


@pytest.mark.parametrize("how", ["plain", "deepbind"])
def test_library_is_capped(how, escape, gpu, runner, check):
    exe, lib = escape
    check.title = "libescape.so loaded %s, %d x %d MiB under %s" % (how, N, MIB, CAP)
    env = runner.env(shim=gpu.shim, VRAMCAP_LIMIT=CAP)
    r = runner.run("escape-" + how, [exe, how, lib, str(N), str(MIB)], env=env, timeout=120)
    check.ran(r)
    got = rcs(r)
    check.eq("allocations answered", len(got), N)
    check.at_most("allocations that fit", got.count(0), FIT_AT_MOST)
    check.that(got.count(2) >= N - FIT_AT_MOST, "the rest CUDA_ERROR_OUT_OF_MEMORY (2)", "rcs %s" % got)
    if how == "deepbind":
        check.that("is loaded without RTLD_DEEPBIND" in r.stderr, "stderr: the line naming the library",
                   "stderr: " + r.first_line("stderr", 160))


def test_deepbind_without_the_shim_is_uncapped(escape, runner, check):
    exe, lib = escape
    check.title = "libescape.so loaded deepbind, no shim (the row above can fail)"
    r = runner.run("escape-deepbind-bare", [exe, "deepbind", lib, str(N), str(MIB)], env=runner.env(),
                   timeout=120)
    check.ran(r)
    check.eq("allocations that fit", rcs(r).count(0), N)


def test_dlmopen_is_refused(escape, gpu, runner, check):
    exe, lib = escape
    check.title = "libescape.so through dlmopen(LM_ID_NEWLM) under %s" % CAP
    env = runner.env(shim=gpu.shim, VRAMCAP_LIMIT=CAP)
    r = runner.run("escape-dlmopen", [exe, "dlmopen", lib, str(N), str(MIB)], env=env, timeout=120)
    check.ran(r)
    check.eq("stdout", r.stdout.strip(), "open -> null")
    check.that("into another link namespace is refused" in r.stderr, "stderr: the refusal line",
               "stderr: " + r.first_line("stderr", 160))


@pytest.mark.parametrize("version", [13000, 14000])
def test_lookup_at_a_version(version, escape, gpu, runner, check):
    exe, _ = escape
    check.title = "cuGetProcAddress(cuMemAlloc, %d), %d x %d MiB under %s" % (version, N, MIB, CAP)
    env = runner.env(shim=gpu.shim, VRAMCAP_LIMIT=CAP)
    r = runner.run("escape-procaddr-%d" % version, [exe, "procaddr", "cuMemAlloc", str(version), str(N), str(MIB)],
                   env=env, timeout=120)
    check.ran(r)
    look = [l for l in r.stdout.splitlines() if l.startswith("lookup ")]
    check.note(look[0] if look else "no lookup line")
    got = rcs(r)
    # Either the lookup failed (a function the hooks were not written for)
    # or every allocation through it was capped.
    check.at_most("allocations that fit", got.count(0), FIT_AT_MOST)
