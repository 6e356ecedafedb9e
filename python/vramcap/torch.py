"""PyTorch's names for vramcap's calls, without patching PyTorch.

For readers of PyTorch articles: the calls they know from ``torch.cuda``,
answered by vramcap's cap (the shim under the whole process, every
allocator included) instead of PyTorch's caching allocator alone. Nothing
in ``torch`` is changed, and this module imports without PyTorch (devices
may then be given as ints or ``"cuda:N"`` strings)::

    import vramcap.torch as vt
    vt.set_limit(0, 2 * 1024**3)        # what torch.cuda.set_limit(0, 2GiB) would be
    vt.set_per_process_memory_fraction(0.5, 0)
    vt.memory_stats(0)["reserved_bytes.all.current"]

Like :func:`vramcap.set_limit`, the first ``set_limit`` in a script not
started under vramcap restarts it under the shim (docs/python.md).

:func:`memory_stats` has the shape of ``torch.cuda.memory_stats`` (a flat,
sorted dict of dotted keys), filled from vramcap's counters, which see the
driver's allocations, not PyTorch's tensors:

==============================  ===============================================
key                             vramcap's figure
==============================  ===============================================
``allocated_bytes.all.current`` live allocations less vramcap's cached blocks:
                                what the program's allocators hold from the
                                driver (PyTorch's reserved segments, plus any
                                other library's)
``reserved_bytes.all.current``  ``held``: everything the cap counts
                                (allocations with cached blocks, pools' reserve,
                                graph memory, the context)
``reserved_bytes.all.peak``     ``peak``: the highest ``held`` so far
``num_ooms``                    ``refusals``: allocations refused by the cap
``vramcap.<name>``              every other counter of
                                :func:`vramcap.memory_stats` (``limit``,
                                ``own_limit``, ``soft_limit``, ``pools``,
                                ``graphs``, ``context``, ``cached``,
                                ``spilled``, ``total``); None where unknown
==============================  ===============================================

PyTorch's keys that need its allocator (``allocated_bytes.all.peak``,
``active_bytes.*``, the ``small_pool``/``large_pool`` splits, ``num_alloc_retries``)
are absent rather than guessed: ask ``torch.cuda.memory_stats`` for those.
"""

import collections
import sys

import vramcap as _vramcap

__all__ = [
    "set_limit",
    "get_limit",
    "set_per_process_memory_fraction",
    "memory_stats",
    "memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "mem_get_info",
    "empty_cache",
]


def _index(device):
    """The device index of an int, ``"cuda"``/``"cuda:N"``, a
    ``torch.device`` or None (the current device)."""
    if device is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            return torch.cuda.current_device()
        return 0
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    kind, index = None, None
    if isinstance(device, str):
        kind, _, rest = device.partition(":")
        if rest:
            if not rest.isdigit():
                kind = None
            else:
                index = int(rest)
    else:
        kind, index = getattr(device, "type", None), getattr(device, "index", None)
    if kind != "cuda":
        raise ValueError(f"device {device!r}: a CUDA device, e.g. 0, 'cuda:0' or torch.device('cuda', 0)")
    return _index(None) if index is None else index


def set_limit(device, limit):
    """Caps ``device`` at ``limit``: bytes, a size such as ``"2GiB"``, or
    None for no cap (:func:`vramcap.set_limit`)."""
    _vramcap.set_limit(_index(device), limit)


def get_limit(device=None):
    """The cap on ``device`` in bytes, None for none."""
    return _vramcap.get_limit(_index(device))


def set_per_process_memory_fraction(fraction, device=None):
    """Caps ``device`` at ``fraction`` of its memory, as
    ``torch.cuda.set_per_process_memory_fraction`` limits PyTorch's
    allocator, but for everything the process holds there."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ValueError(
            f"fraction {fraction!r}: above 0 and at most 1, e.g. set_per_process_memory_fraction(0.5, 0)")
    percent = ("%.4f" % (fraction * 100)).rstrip("0").rstrip(".")
    _vramcap.set_limit(_index(device), percent + "%")


def memory_stats(device=None):
    """vramcap's counters of ``device`` in the shape of
    ``torch.cuda.memory_stats`` (module docstring: the mapping)."""
    s = _vramcap.memory_stats(_index(device))
    out = {
        "allocated_bytes.all.current": s["allocations"] - (s["cached"] or 0),
        "reserved_bytes.all.current": s["held"],
        "reserved_bytes.all.peak": s["peak"],
        "num_ooms": s["refusals"],
    }
    for name in ("limit", "own_limit", "soft_limit", "pools", "graphs", "context", "cached",
                 "spilled", "total"):
        out["vramcap." + name] = s[name]
    return collections.OrderedDict(sorted(out.items()))


def memory_allocated(device=None):
    """``memory_stats(device)["allocated_bytes.all.current"]``."""
    return memory_stats(device)["allocated_bytes.all.current"]


def memory_reserved(device=None):
    """``memory_stats(device)["reserved_bytes.all.current"]``: what the cap
    counts."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None):
    """``memory_stats(device)["reserved_bytes.all.peak"]``."""
    return memory_stats(device)["reserved_bytes.all.peak"]


def mem_get_info(device=None):
    """``(free, total)`` under the cap, as ``torch.cuda.mem_get_info``
    reports them under the shim: total is the cap (the device's memory
    without one), free what the cap leaves."""
    s = _vramcap.memory_stats(_index(device))
    total = s["limit"] if s["limit"] is not None else s["total"]
    if total is None:
        raise ValueError(f"mem_get_info({device!r}): the device's memory is not known yet")
    return max(0, total - s["held"]), total


def empty_cache():
    """``torch.cuda.empty_cache()`` when PyTorch has CUDA up, then
    :func:`vramcap.empty_cache`; the bytes vramcap released."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    return _vramcap.empty_cache()
