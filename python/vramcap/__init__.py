"""Read and change this process's GPU memory caps while it runs.

The functions call the C ABI of ``libvramcap.so`` (``include/vramcap.h``)
through ctypes. They work when the library is preloaded, that is when the
program was started with ``vramcap run --limit 8GiB -- python train.py``
(or ``LD_PRELOAD=/path/to/libvramcap.so``, or with ``VRAMCAP_LIMIT`` set
where the wheel's start hook puts the shim in, docs/python.md); otherwise
:func:`is_active` is False and the others raise :class:`NotActive`, but
:func:`set_limit` restarts a script under the shim where that loses nothing.

Devices are the indices the process sees (after ``CUDA_VISIBLE_DEVICES``).
A cap is a number of bytes, or a string as ``VRAMCAP_LIMIT`` takes an
amount: ``"2GiB"``, ``"512MB"``, ``"50%"`` (of the device's memory);
``None`` means no cap.

With PyTorch: its caching allocator keeps freed memory reserved, which the
cap counts. After lowering a cap below what PyTorch holds, call
``torch.cuda.empty_cache()`` to give back what it keeps, then
:func:`empty_cache` for what vramcap keeps.
"""

import ctypes
import contextlib
import errno
import os
import re

__all__ = [
    "NotActive",
    "is_active",
    "set_limit",
    "get_limit",
    "memory_stats",
    "empty_cache",
    "limit",
    "parse_amount",
]

NO_CAP = (1 << 64) - 1
ABI_VERSION = 1

_HOW = (
    "libvramcap.so is not loaded in this process: start it under vramcap, "
    "e.g. `vramcap run --limit 8GiB -- python train.py`, or with "
    "LD_PRELOAD=/path/to/libvramcap.so"
)


class NotActive(RuntimeError):
    """The process does not run under vramcap."""

    def __init__(self, how=_HOW):
        super().__init__(how)


class _Stats(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "size",
            "limit",
            "soft_limit",
            "held",
            "allocations",
            "pools",
            "graphs",
            "context",
            "peak",
            "cached",
            "spilled",
            "refusals",
            "total",
            "own_limit",
        )
    ]


def _lib():
    """The preloaded library's functions, or None."""
    try:
        here = ctypes.CDLL(None)
        version = here.vramcap_version
    except (OSError, AttributeError):
        return None
    version.restype = ctypes.c_int
    version.argtypes = []
    if version() < ABI_VERSION:
        return None
    here.vramcap_set_limit.restype = ctypes.c_int
    here.vramcap_set_limit.argtypes = [ctypes.c_int, ctypes.c_uint64]
    here.vramcap_get_limit.restype = ctypes.c_uint64
    here.vramcap_get_limit.argtypes = [ctypes.c_int]
    here.vramcap_memory_stats.restype = ctypes.c_int
    here.vramcap_memory_stats.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_Stats),
        ctypes.c_size_t,
    ]
    here.vramcap_empty_cache.restype = ctypes.c_int64
    here.vramcap_empty_cache.argtypes = []
    return here


def _need():
    lib = _lib()
    if lib is None:
        raise NotActive()
    return lib


def _check(rc, what):
    if rc < 0:
        code = -rc
        if code == errno.EPERM:
            raise PermissionError(
                f"{what}: above the cap this process started with "
                "(VRAMCAP_LIMIT); a program may lower its cap and raise it "
                "back, never above that"
            )
        if code == errno.ENODEV:
            raise ValueError(f"{what}: no such device in this process (or none used yet)")
        if code == errno.ENOSYS:
            raise NotActive()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return rc


def is_active():
    """True when this process runs under vramcap."""
    return _lib() is not None


_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
    "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}


def parse_amount(text, total=None):
    """Bytes of an amount as ``VRAMCAP_LIMIT`` takes it: ``"2GiB"`` (units
    powers of 1024, any case) or ``"50%"`` of ``total`` bytes."""
    t = str(text).strip()
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*%", t, re.ASCII)
    if m:
        p = float(m.group(1))
        if not 0 < p <= 100:
            raise ValueError(f"{text!r}: a percentage is above 0 and at most 100, e.g. '50%'")
        if not total:
            raise ValueError(
                f"{text!r}: a percentage needs the device's memory, which is not known here; "
                "give a size, e.g. '2GiB'"
            )
        return max(1, int(total * p / 100))
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)", t, re.ASCII)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"{text!r} is not a size; e.g. '2GiB', '512MiB' or '50%'")
    if re.match(r"0[0-9]", m.group(1)):
        raise ValueError(f"{text!r}: a leading zero is refused (it looks octal); e.g. '8GiB'")
    # Exact for whole numbers; decimals round down to a byte.
    whole, _, frac = m.group(1).partition(".")
    unit = _UNITS[m.group(2).lower()]
    n = int(whole) * unit + (int(frac) * unit) // (10 ** len(frac)) if frac else int(whole) * unit
    if n < 1:
        raise ValueError(f"{text!r}: a cap is at least one byte, e.g. '2GiB'")
    return n


def _devices(device):
    if not isinstance(device, int) or device < -1:
        raise ValueError(f"device {device!r}: an index the process sees, or -1 for all")
    return device


def set_limit(device, limit):
    """Sets the cap of ``device`` (-1: every device in use) to ``limit``:
    bytes, an amount string, or None for no cap.

    In a process not under vramcap that has not loaded CUDA yet (the top of
    a script), restarts the program under the shim with that cap (one line
    on stderr); where a restart would lose state, raises NotActive with the
    command to use (see ``vramcap._autostart``)."""
    lib = _lib()
    device = _devices(device)
    if lib is None:
        from . import _autostart

        spec = _autostart.limit_spec(device, limit)
        if spec is None:
            raise NotActive()
        _autostart.restart_for_limit(f"set_limit({device}, {limit!r})", spec)
    if limit is None:
        bytes_ = NO_CAP
    elif isinstance(limit, str):
        total = None
        if limit.strip().endswith("%"):
            if device == -1:
                raise ValueError(
                    f"set_limit(-1, {limit!r}): a percentage is of one device's memory; "
                    "set each device, e.g. set_limit(0, '50%')"
                )
            total = memory_stats(device)["total"]
        bytes_ = parse_amount(limit, total)
    elif isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
        bytes_ = min(limit, NO_CAP)
    else:
        raise ValueError(f"limit {limit!r}: bytes above 0, a size such as '2GiB', or None")
    rc = lib.vramcap_set_limit(device, bytes_)
    if rc == -errno.ENODEV:
        # Before the first CUDA call the library knows no device: after a
        # restart for this very cap, it is the start cap already; else the
        # driver is initialised (cuInit, as the first CUDA call would) and
        # the call made again.
        from . import _autostart

        if _autostart.restarted_for(device, limit):
            return
        if _autostart.init_driver():
            rc = lib.vramcap_set_limit(device, bytes_)
    _check(rc, f"set_limit({device}, {limit!r})")


def get_limit(device):
    """The cap in force on ``device`` in bytes, or None for no cap."""
    lib = _need()
    value = lib.vramcap_get_limit(_devices(device))
    if value == 0:
        raise ValueError(f"get_limit({device}): no such device in this process")
    return None if value == NO_CAP else value


def memory_stats(device):
    """What vramcap counts on ``device``, in bytes: limit (the cap in
    force; None: no cap), own_limit (the process's own, before a group's),
    soft_limit, held and its parts (allocations, pools, graphs, context),
    peak, cached, spilled, refusals (a count) and total (the device's
    memory without the cap). A figure the library does not give is None."""
    lib = _need()
    s = _Stats()
    _check(
        lib.vramcap_memory_stats(_devices(device), ctypes.byref(s), ctypes.sizeof(s)),
        f"memory_stats({device})",
    )
    # Fields past what this library fills are unknown (an older library).
    filled = s.size // 8
    out = {}
    for i, (name, _) in enumerate(_Stats._fields_):
        if name != "size":
            out[name] = getattr(s, name) if i < filled else None
    for k in ("limit", "soft_limit", "own_limit"):
        if out[k] == NO_CAP:
            out[k] = None
    if out["total"] == 0:
        out["total"] = None
    return out


def empty_cache():
    """Gives the blocks vramcap keeps cached back to the driver; the bytes
    released."""
    return _check(_need().vramcap_empty_cache(), "empty_cache()")


@contextlib.contextmanager
def limit(device, value):
    """Sets a cap on one device for the ``with`` block and restores the
    process's own cap from before it (a group's stricter one stays the
    group's)::

        with vramcap.limit(0, "2GiB"):
            evaluate(model)
    """
    if not isinstance(device, int) or device < 0:
        raise ValueError(f"limit({device!r}, ...): one device index, e.g. limit(0, '2GiB')")
    before = memory_stats(device)["own_limit"]
    set_limit(device, value)
    try:
        yield
    except BaseException:
        # The block's error is the one to see; restore as best we can.
        try:
            set_limit(device, before)
        except Exception:  # noqa: BLE001
            pass
        raise
    set_limit(device, before)
