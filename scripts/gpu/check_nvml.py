#!/usr/bin/env python3
"""NVML check for vramcap (run under LD_PRELOAD=libvramcap.so VRAMCAP_LIMIT=...).

Initialises CUDA with PyTorch and holds a 1 GiB tensor (written, so it is
really there), then asks NVML for the memory of device index 0:
nvmlDeviceGetMemoryInfo (v1: total/free/used) and, where the library has it,
nvmlDeviceGetMemoryInfo_v2 (total/reserved/free/used). Also reports
torch.cuda.mem_get_info() so the caller can compare the two totals.

NVML comes from pynvml (nvidia-ml-py) when it imports, else from ctypes on
libnvidia-ml.so.1 (nvmlInit_v2, nvmlDeviceGetHandleByIndex_v2,
nvmlDeviceGetMemoryInfo[_v2]). nvml_via says which.

Prints `RESULT {json}` and a flat `RESULTKV total=… used=… free=… …` line on
stdout (total/used/free are NVML v1's). Exit status: 0 when it ran to the end
(whatever it measured), 1 on an unexpected error, 3 when torch/CUDA or NVML
is not available.

Usage: check_nvml.py [--hold-bytes N]
"""
import argparse
import ctypes
import sys

import result


class _MemV1(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class _MemV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong),
                ("reserved", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def nvml_pynvml(res):
    """Fill res from pynvml; returns False if pynvml is not importable."""
    try:
        import pynvml
    except Exception as e:  # noqa: BLE001
        res["pynvml_import_error"] = repr(e)[:200]
        return False
    res["nvml_via"] = "pynvml"
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        try:
            uuid = pynvml.nvmlDeviceGetUUID(h)
            res["nvml_uuid"] = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        except Exception:  # noqa: BLE001
            pass
        m = pynvml.nvmlDeviceGetMemoryInfo(h)
        res["total"], res["free"], res["used"] = int(m.total), int(m.free), int(m.used)
        v2 = getattr(pynvml, "nvmlMemory_v2", None)
        if v2 is not None:
            try:
                m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=v2)
                res["total_v2"], res["free_v2"] = int(m2.total), int(m2.free)
                res["used_v2"], res["reserved_v2"] = int(m2.used), int(m2.reserved)
            except Exception as e:  # noqa: BLE001
                res["v2_error"] = repr(e)[:300]
        else:
            res["v2_error"] = "pynvml has no nvmlMemory_v2"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return True


def nvml_ctypes(res):
    res["nvml_via"] = "ctypes"
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    init = getattr(lib, "nvmlInit_v2", None) or lib.nvmlInit
    r = init()
    if r != 0:
        raise RuntimeError("nvmlInit failed: %d" % r)
    try:
        h = ctypes.c_void_p()
        get = getattr(lib, "nvmlDeviceGetHandleByIndex_v2", None) or lib.nvmlDeviceGetHandleByIndex
        r = get(ctypes.c_uint(0), ctypes.byref(h))
        if r != 0:
            raise RuntimeError("nvmlDeviceGetHandleByIndex failed: %d" % r)
        buf = ctypes.create_string_buffer(96)
        try:
            if lib.nvmlDeviceGetUUID(h, buf, ctypes.c_uint(len(buf))) == 0:
                res["nvml_uuid"] = buf.value.decode(errors="replace")
        except Exception:  # noqa: BLE001
            pass
        m = _MemV1()
        r = lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))
        if r != 0:
            raise RuntimeError("nvmlDeviceGetMemoryInfo failed: %d" % r)
        res["total"], res["free"], res["used"] = int(m.total), int(m.free), int(m.used)
        try:
            f2 = lib.nvmlDeviceGetMemoryInfo_v2
        except AttributeError:
            res["v2_error"] = "libnvidia-ml has no nvmlDeviceGetMemoryInfo_v2"
            return True
        m2 = _MemV2()
        m2.version = ctypes.sizeof(_MemV2) | (2 << 24)  # NVML_STRUCT_VERSION(Memory, 2)
        r = f2(h, ctypes.byref(m2))
        if r == 0:
            res["total_v2"], res["free_v2"] = int(m2.total), int(m2.free)
            res["used_v2"], res["reserved_v2"] = int(m2.used), int(m2.reserved)
        else:
            res["v2_error"] = "nvmlDeviceGetMemoryInfo_v2 returned %d" % r
    finally:
        try:
            lib.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return True


def check(res, args):
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        raise result.Missing("import torch failed: %r" % (e,))
    if not torch.cuda.is_available():
        raise result.Missing("torch.cuda.is_available() is False")
    dev = torch.device("cuda", 0)
    held = torch.empty(args.hold_bytes, dtype=torch.uint8, device=dev)
    held.fill_(1)
    torch.cuda.synchronize()
    res["held_sum_ok"] = bool(int(held[:4096].sum().item()) == 4096)
    try:
        res["torch_uuid"] = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
    except Exception:  # noqa: BLE001
        pass
    f, t = torch.cuda.mem_get_info(0)
    res["torch_total"], res["torch_free"] = int(t), int(f)
    res["torch_allocated"] = int(torch.cuda.memory_allocated(0))

    try:
        if not nvml_pynvml(res):
            nvml_ctypes(res)
    except OSError as e:
        raise result.Missing("NVML not loadable: %r" % (e,))
    res["totals_match"] = res.get("total") is not None and res.get("total") == res.get("torch_total")
    del held
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hold-bytes", type=int, default=1 << 30,
                    help="bytes of device memory held (a torch tensor) while NVML is asked")
    args = ap.parse_args()

    res = {"check": "nvml", "hold_bytes": args.hold_bytes, "completed": False,
           "total": None, "used": None, "free": None}
    return result.run(res, lambda res: check(res, args))


if __name__ == "__main__":
    sys.exit(main())
