"""Per-device caps on a machine with two GPUs (the rows of the former
scripts/gpu-check-2gpu.sh; the nvidia-h200-x2 machine). On a machine with one
GPU these rows error: they are never passed by skipping.

Every process runs with CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA's order =
nvidia-smi's) and the inherited CUDA_VISIBLE_DEVICES (normally unset);
"swapped" is 1,0 (or the first two inherited entries swapped). "Physical 0/1"
are the UUIDs the baseline run reports for its devices 0 and 1 (nvidia-smi's
if it gave none). `capcheck twodev` fills device 0, then device 1, then asks
one more chunk of each; `twodev-thread` fills device 1 from a second thread;
hard stop 4 GiB per device.
"""
import os

import pytest

from harness import GiB, MiB, as_int, mib

pytestmark = pytest.mark.two_gpu

CHUNK = 256 * MiB
CAP0, CAP1 = 2 * GiB, 3 * GiB  # "0=2GiB,1=3GiB"
UCAP, UDEF = 1 * GiB, 2 * GiB  # "GPU-<prefix of physical 1>=1GiB,2GiB"
MAXB = 4 * GiB
CU_TIMEOUT = 120


def inherited_cvd():
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def swapped_cvd():
    cvd = inherited_cvd()
    if cvd:
        parts = (cvd.split(",") + ["0", "1"])[:2]
        return "%s,%s" % (parts[1] or "1", parts[0] or "0")
    return "1,0"


def env2(runner, gpu, shim=True, limit=None, cvd=None, **vars):
    e = runner.env(shim=gpu.shim if shim else None, CUDA_DEVICE_ORDER="PCI_BUS_ID", **vars)
    if limit:
        e["VRAMCAP_LIMIT"] = limit
    if cvd:
        e["CUDA_VISIBLE_DEVICES"] = cvd
    return e


def dev(r, d):
    for x in reversed(r.lines("RESULTDEV")):
        if x.get("dev") == str(d):
            return x
    return {}


def verify_dev(r, d):
    if r.has_line(r"^VERIFYDEV dev=%d ok$" % d):
        return "ok"
    return "bad" if r.has_line(r"^VERIFYDEV dev=%d " % d) else "none"


def dev_obs(r, d):
    x = dev(r, d)
    if not x:
        return "dev%d: no RESULTDEV line" % d
    return "dev%d: bytes=%s err=%s total=%s again_err=%s verify=%s uuid=%s" % (
        d, mib(x.get("bytes")), x.get("err"), mib(x.get("total")), x.get("again_err"), verify_dev(r, d),
        x.get("uuid"))


def capped(check, r, d, cap):
    """Device D stopped within one chunk below CAP, refused with 2, reports CAP
    as its total, refuses one more chunk later, and its vector add is right."""
    x = dev(r, d)
    check.within("dev%d bytes" % d, x.get("bytes"), cap - CHUNK, cap, show=mib, lo_open=True)
    check.eq("dev%d err" % d, x.get("err"), 2)
    check.eq("dev%d stop" % d, x.get("stop"), "refused")
    check.eq("dev%d total" % d, x.get("total"), cap, show=mib)
    check.eq("dev%d again_err (one more chunk refused)" % d, x.get("again_err"), 2)
    check.eq("dev%d VERIFYDEV" % d, verify_dev(r, d), "ok")


@pytest.fixture(scope="session")
def capcheck2(build):
    return build("capcheck")


@pytest.fixture(scope="session")
def baseline2(gpu, runner, capcheck2):
    """capcheck twodev without the shim, once: the physical UUIDs."""
    r = runner.run("twodev-noshim", [capcheck2, "twodev", GiB], env=env2(runner, gpu, shim=False),
                   timeout=CU_TIMEOUT)
    p0, p1 = dev(r, 0).get("uuid", ""), dev(r, 1).get("uuid", "")
    if not p0.startswith("GPU-") and len(gpu.uuids) >= 2:
        p0 = gpu.uuids[0]
    if not p1.startswith("GPU-") and len(gpu.uuids) >= 2:
        p1 = gpu.uuids[1]
    return r, p0, p1


def uuid_key(p0, p1):
    """The first group of physical 1's UUID (GPU-xxxxxxxx), or the whole UUID
    when that would also match physical 0."""
    if not p1.startswith("GPU-"):
        return ""
    key = "GPU-" + p1[4:].split("-")[0]
    return p1 if p0.lower().startswith(key.lower()) else key


def test_artefacts_present(gpu, check):
    check.title = "artefacts present (two GPUs)"
    check.that(os.access(gpu.shim, os.R_OK), "libvramcap.so readable in DIR", "libvramcap.so: %s" % gpu.shim)


def test_two_gpus(gpu, check):
    check.title = "two GPUs (nvidia-smi --query-gpu=uuid)"
    check.within("GPUs listed", len(gpu.uuids), 2, None)
    check.note(" ".join(gpu.uuids) or ("nvidia-smi not found" if not gpu.smi else "none"))


def test_build_capcheck(builds, check):
    check.title = "build capcheck.cu (two GPUs)"
    path, err = builds.try_build("capcheck")
    check.that(path, "nvcc builds it (%s)" % builds.arch, "ok" if path else err[:300])


def test_baseline(gpu, baseline2, check):
    check.title = "twodev, no shim, stop 1 GiB per device"
    r, p0, p1 = baseline2
    check.ran(r)
    for d in (0, 1):
        check.eq("dev%d bytes" % d, dev(r, d).get("bytes"), GiB, show=mib)
        check.eq("dev%d stop" % d, dev(r, d).get("stop"), "limit")
        check.eq("dev%d VERIFYDEV" % d, verify_dev(r, d), "ok")
    if len(gpu.uuids) >= 2 and inherited_cvd() is None:
        same = p0.lower() == gpu.uuids[0].lower() and p1.lower() == gpu.uuids[1].lower()
        check.note("CUDA order %s nvidia-smi order" % ("=" if same else "differs from"))


@pytest.mark.parametrize("mode", ["twodev", "twodev-thread"])
def test_ordinal_limits(gpu, runner, capcheck2, check, mode):
    check.title = "%s, VRAMCAP_LIMIT=0=2GiB,1=3GiB" % mode
    r = runner.run(mode + "-ordinal", [capcheck2, mode, MAXB], env=env2(runner, gpu, limit="0=2GiB,1=3GiB"),
                   timeout=CU_TIMEOUT)
    check.ran(r)
    capped(check, r, 0, CAP0)
    capped(check, r, 1, CAP1)


def test_ordinal_limits_swapped(gpu, runner, capcheck2, baseline2, check):
    """The caps follow the order the process sees: its device 0 is physical 1
    and gets 2 GiB."""
    cvd = swapped_cvd()
    check.title = "twodev, VRAMCAP_LIMIT=0=2GiB,1=3GiB, CUDA_VISIBLE_DEVICES=%s" % cvd
    _, p0, p1 = baseline2
    r = runner.run("twodev-ordinal-swapped", [capcheck2, "twodev", MAXB],
                   env=env2(runner, gpu, limit="0=2GiB,1=3GiB", cvd=cvd), timeout=CU_TIMEOUT)
    check.ran(r)
    u0 = dev(r, 0).get("uuid", "")
    check.that(p1.startswith("GPU-") and u0.lower() == p1.lower(), "visible dev0 is physical 1",
               "dev0 uuid %s, physical 1 %s" % (u0 or "none", p1 or "none"))
    capped(check, r, 0, CAP0)
    capped(check, r, 1, CAP1)


@pytest.mark.parametrize("swap", [False, True], ids=["inherited", "swapped"])
def test_uuid_key(gpu, runner, capcheck2, baseline2, check, swap):
    """Physical GPU 1 gets 1 GiB whatever its visible index; the other the
    default 2 GiB."""
    cvd = swapped_cvd() if swap else None
    check.title = "twodev, VRAMCAP_LIMIT=<uuid prefix of physical 1>=1GiB,2GiB" + (
        ", CUDA_VISIBLE_DEVICES=%s" % cvd if cvd else "")
    _, p0, p1 = baseline2
    key = uuid_key(p0, p1)
    if not key:
        pytest.fail("no UUID for physical GPU 1 (baseline and nvidia-smi gave none)", pytrace=False)
    r = runner.run("twodev-uuid" + ("-swapped" if swap else ""), [capcheck2, "twodev", MAXB],
                   env=env2(runner, gpu, limit="%s=1GiB,2GiB" % key, cvd=cvd), timeout=CU_TIMEOUT)
    check.ran(r)
    seen = None
    for d in (0, 1):
        is_p1 = dev(r, d).get("uuid", "").lower() == p1.lower()
        if is_p1:
            seen = d
        capped(check, r, d, UCAP if is_p1 else UDEF)
    check.that(seen is not None, "one device is physical 1", "key %s; physical 1 is %s" % (
        key, "dev%d" % seen if seen is not None else "none"))


def test_key_naming_no_gpu(gpu, runner, capcheck2, baseline2, check):
    """It must stop: exit status 0 would mean it ran without the cap it asked
    for; 124 or a signal, that it hung."""
    check.title = "twodev, VRAMCAP_LIMIT=GPU-ffffffff=1GiB,2GiB (names no GPU)"
    _, p0, p1 = baseline2
    r = runner.run("twodev-unmatched", [capcheck2, "twodev", MAXB],
                   env=env2(runner, gpu, limit="GPU-ffffffff=1GiB,2GiB"), timeout=CU_TIMEOUT)
    check.that(r.rc not in (0, None) and not r.timed_out and r.rc > 0,
               "the process stops before allocating (rc != 0, not a timeout)", r.describe())
    line = next((l for l in r.stderr.splitlines() if "GPU-ffffffff" in l), "")
    for name, u in (("physical 0", p0), ("physical 1", p1)):
        check.that(u.startswith("GPU-") and u.lower() in line.lower(), "its one line lists %s's UUID" % name,
                   line[:300] or "no line naming GPU-ffffffff")


def py2(gpu, runner, name, mode):
    return runner.run(name, [gpu.python, gpu.script("check_2gpu.py"), mode, "--cli", gpu.cli],
                      env=env2(runner, gpu, limit="8GiB"), timeout=180)


def test_torch_contexts(gpu, runner, check):
    """Each device's context (>= 100 MiB) is charged there; held within 64 MiB
    of NVML's figure for the process on that GPU."""
    check.title = "PyTorch, 256 MiB on cuda:0 and 512 MiB on cuda:1: the contexts"
    r = py2(gpu, runner, "torch-context", "context")
    d = r.kv()
    check.ran(r)
    for i in (0, 1):
        c, u, n = (as_int(d.get(k % i)) for k in ("ctx%d_mib", "used%d_mib", "nvml%d_mib"))
        check.within("dev%d context MiB" % i, c, 100, None)
        check.that(c is not None and u is not None and u >= c, "dev%d held >= context" % i,
                   "used%d_mib=%s ctx%d_mib=%s" % (i, u, i, c))
        check.that(u is not None and n is not None and abs(u - n) <= 64, "dev%d held within 64 MiB of NVML" % i,
                   "used%d_mib=%s nvml%d_mib=%s" % (i, u, i, n))


def test_torch_live_on_one_device(gpu, runner, check):
    check.title = "PyTorch on both devices, `vramcap limit -i <uuid of 1> 2GiB` from inside"
    r = py2(gpu, runner, "torch-live", "live")
    d = r.kv()
    check.ran(r)
    check.kv(d, "limit_rc", 0)
    check.eq("device 0's total", d.get("total0"), 8 * GiB, show=mib)
    check.eq("device 1's total", d.get("total1"), 2 * GiB, show=mib)
    check.eq("1.5 GiB more on device 0", d.get("extra0"), "fits")
    check.eq("1.5 GiB more on device 1", d.get("extra1"), "refused")


def test_peer_access_to_parking_blocks(gpu, runner, check):
    check.title = ("PyTorch with VRAMCAP_PARK=manual (allocations are the shim's VMM blocks): kernels on each GPU "
                   "read the other's memory by peer access (the shim grants its blocks to the peer GPU), twice")
    r = runner.run("torch-peer", [gpu.python, gpu.script("check_2gpu.py"), "peer", "--cli", gpu.cli],
                   env=env2(runner, gpu, limit="8GiB", VRAMCAP_PARK="manual"), timeout=300)
    d = r.kv()
    check.ran(r)
    check.kv(d, "p2p", 1)
    check.kv(d, "before", 1)
    check.kv(d, "after", 1)
    # PyTorch maps NCCL, so a park of a process on two GPUs is refused
    # (docs/parking.md); the reads after it are the second look.
    check.note("vramcap park's exit status: %s (1: refused, NCCL and two GPUs)" % d.get("park_rc"))
