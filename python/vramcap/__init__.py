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
import operator
import os

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


# The size grammar of ``VRAMCAP_LIMIT`` amounts, as the Rust core reads it
# (crates/core/src/size.rs, ``parse_amount`` in crates/core/src/limit):
# ASCII digits only, no leading zero, units powers of 1024 in any case,
# percentages above 0 and at most 100 with at most four decimals. A
# property test (tests/python.rs) holds the two equal on generated text.
_UNITS = {
    "": 0, "b": 0,
    "k": 10, "kb": 10, "kib": 10,
    "m": 20, "mb": 20, "mib": 20,
    "g": 30, "gb": 30, "gib": 30,
    "t": 40, "tb": 40, "tib": 40,
}
# What Rust's ``str::trim`` removes (Unicode White_Space), which is not
# quite what ``str.strip()`` removes (that also takes U+001C..U+001F).
_WHITE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_DIGITS = "0123456789"
_EXAMPLE = "e.g. '2GiB', '512MiB' or '50%'"


class _Bad(Exception):
    pass


def _digits(s):
    n = 0
    while n < len(s) and s[n] in _DIGITS:
        n += 1
    return s[:n], s[n:]


def _decimal(s):
    """``DIGITS[.DIGITS]`` at the start of ``s``: (int, frac, rest)."""
    whole, after = _digits(s)
    if not whole:
        raise _Bad("it does not start with a decimal number")
    if len(whole) > 1 and whole[0] == "0":
        raise _Bad("it has a leading zero (numbers are decimal, write it without)")
    frac, rest = "", after
    if after.startswith("."):
        frac, rest = _digits(after[1:])
        if not frac:
            raise _Bad("it does not start with a decimal number")
    return whole, frac, rest


def _scale(whole, frac, multiplier):
    if len(whole) + len(frac) > 30:
        raise _Bad("the size does not fit in 64 bits")
    return int(whole + frac) * multiplier // 10 ** len(frac)


def _size(t):
    if not t:
        raise _Bad("the size is empty")
    whole, frac, rest = _decimal(t)
    unit = rest.lstrip(_WHITE)
    if unit.lower() not in _UNITS or not unit.isascii():
        raise _Bad(
            f"unknown unit {unit!r} (use B, K/KB/KiB, M/MB/MiB, G/GB/GiB or T/TB/TiB; "
            "all are powers of 1024)"
        )
    n = _scale(whole, frac, 1 << _UNITS[unit.lower()])
    if n > NO_CAP:
        raise _Bad("the size does not fit in 64 bits")
    if n == 0:
        raise _Bad("the size must be greater than zero")
    return n


def _percent_ppm(number):
    s = number.strip(_WHITE)
    if not s:
        raise _Bad("the percentage has no number before '%'")
    try:
        whole, frac, rest = _decimal(s)
    except _Bad:
        raise _Bad("the percentage is not a decimal number") from None
    if rest:
        raise _Bad("the percentage is not a decimal number")
    if len(frac) > 4:
        raise _Bad("the percentage has more than four decimals")
    ppm = _scale(whole, frac, 10_000) if len(whole) + len(frac) <= 30 else 0
    if not 0 < ppm <= 1_000_000:
        raise _Bad("the percentage is out of range (greater than 0 and at most 100)")
    return ppm


def parse_amount(text, total=None):
    """Bytes of an amount as ``VRAMCAP_LIMIT`` takes it: ``"2GiB"`` (units
    powers of 1024, any case; ``"1.5GiB"`` rounds down to a byte) or
    ``"50%"`` of ``total`` bytes (at most four decimals; at least one
    byte). Exactly the grammar of ``vramcap size`` and ``--limit``."""
    t = str(text).strip(_WHITE)
    try:
        if t.endswith("%"):
            ppm = _percent_ppm(t[:-1])
            if not total:
                raise ValueError(
                    f"{text!r}: a percentage needs the device's memory, which is not known here; "
                    "give a size, e.g. '2GiB'"
                )
            return max(1, total * ppm // 1_000_000)
        if not t:
            raise _Bad("the amount is empty")
        return _size(t)
    except _Bad as e:
        raise ValueError(f"{text!r} is not a valid amount: {e}; {_EXAMPLE}") from None


# The largest index a C ``int`` holds: past it, ctypes would wrap the
# number onto another device (2**32 onto device 0).
_INT_MAX = (1 << 31) - 1


def _devices(device, what, every=True):
    """``device`` as an index the C ABI takes; -1 (every device) when
    ``every``. A bool is not an index; an index no ``int`` holds names no
    device."""
    example = "e.g. set_limit(0, '2GiB')" + (", or -1 for every device" if every else "")
    if isinstance(device, bool):
        raise ValueError(f"{what}: {device!r} is not a device index; {example}")
    try:
        index = operator.index(device)
    except TypeError:
        raise ValueError(f"{what}: {device!r} is not a device index; {example}") from None
    if index < (-1 if every else 0):
        raise ValueError(f"{what}: {index} is not a device index; {example}")
    if index > _INT_MAX:
        raise ValueError(f"{what}: no such device in this process (device {index}); {example}")
    return index


def set_limit(device, limit):
    """Sets the cap of ``device`` (-1: every device in use) to ``limit``:
    bytes, an amount string, or None for no cap.

    In a process not under vramcap that has not loaded CUDA yet (the top of
    a script), restarts the program under the shim with that cap (one line
    on stderr); where a restart would lose state, raises NotActive with the
    command to use (see ``vramcap._autostart``)."""
    lib = _lib()
    device = _devices(device, f"set_limit({device!r}, {limit!r})")
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
        if limit.strip(_WHITE).endswith("%"):
            if device == -1:
                raise ValueError(
                    f"set_limit(-1, {limit!r}): a percentage is of one device's memory; "
                    "set each device, e.g. set_limit(0, '50%')"
                )
            rc, s = _read_stats(lib, device)
            if rc == -errno.ENODEV:
                # As below: the device is not known before the first CUDA
                # call. After a restart for this very cap it is the start
                # cap already; else the driver is initialised and asked again.
                from . import _autostart

                if _autostart.restarted_for(device, limit):
                    return
                if _autostart.init_driver():
                    rc, s = _read_stats(lib, device)
            _check(rc, f"set_limit({device}, {limit!r})")
            total = _as_dict(s)["total"]
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
    value = lib.vramcap_get_limit(_devices(device, f"get_limit({device!r})", every=False))
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
    rc, s = _read_stats(lib, _devices(device, f"memory_stats({device!r})", every=False))
    _check(rc, f"memory_stats({device})")
    return _as_dict(s)


def _read_stats(lib, device):
    """``vramcap_memory_stats`` of ``device``: its return code and the
    struct it filled."""
    s = _Stats()
    return lib.vramcap_memory_stats(device, ctypes.byref(s), ctypes.sizeof(s)), s


def _as_dict(s):
    """The filled struct as :func:`memory_stats` returns it."""
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
    device = _devices(device, f"limit({device!r}, {value!r})", every=False)
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
