"""Python programs under the shim without a launcher.

Two ways in, both by re-executing the same interpreter with the same
command line (``sys.orig_argv``) and ``LD_PRELOAD`` naming this package's
``libvramcap.so``: ``exec``, so the PID, stdin, the open descriptors and
the rest of the environment stay.

- At interpreter start: the wheel's ``vramcap_autostart.pth`` calls
  :func:`autostart` when ``VRAMCAP_LIMIT``, ``VRAMCAP_GROUP`` or
  ``NVIDIA_GPU_MEMORY_LIMIT`` (the variables the shim caps by) is set and
  ``LD_PRELOAD`` names no existing file called ``libvramcap.so``. That
  runs before any user code, so nothing is lost. With no such variable set
  the ``.pth`` line only looks up three environment variables. An empty
  ``VRAMCAP_LIMIT`` is refused as the shim refuses it (one line, exit 2).
- From :func:`vramcap.set_limit` in a process not under the shim:
  :func:`restart_for_limit` restarts the program with that cap, where a
  restart loses nothing (no CUDA yet, a script or ``-c``/``-m`` to run
  again), and otherwise raises :class:`vramcap.NotActive` with the command
  that starts it capped.

It cannot loop: the restarted process has the shim in ``LD_PRELOAD``, and
``_VRAMCAP_AUTOSTART`` holds the PID that restarted itself, so a process
whose restart did not load the shim (a loader that drops ``LD_PRELOAD``)
says so and goes on instead of restarting again. A process that has the
shim already (``vramcap run``, ``LD_PRELOAD``, the Kubernetes device
plugin's ``/etc/ld.so.preload``) is left as it is.
"""

import os
import shlex
import sys

GUARD = "_VRAMCAP_AUTOSTART"
SHIM = "libvramcap.so"


def _say(line):
    try:
        sys.stderr.write("vramcap: " + line + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - no stderr: nothing to tell
        pass


def _maps():
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _loaded(maps, prefix):
    """Whether a file whose name starts with ``prefix`` is mapped."""
    for line in maps.splitlines():
        fields = line.split(None, 5)  # address perms offset dev inode path
        if len(fields) == 6 and os.path.basename(fields[5]).startswith(prefix):
            return True
    return False


def shim_loaded():
    """Whether libvramcap.so is in this process, however it got there."""
    return _loaded(_maps(), SHIM)


def cuda_loaded():
    """Whether the CUDA driver library (libcuda.so*) is in this process."""
    return _loaded(_maps(), "libcuda.so")


def shim_path():
    """This package's shim, else ``VRAMCAP_LIBRARY``; None when neither is
    a file."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), SHIM)
    for p in (here, os.environ.get("VRAMCAP_LIBRARY")):
        if p and os.path.isfile(p):
            return p
    return None


def orig_argv():
    """The interpreter's own command line, as it was started."""
    argv = getattr(sys, "orig_argv", None)  # Python 3.10+
    if argv:
        return list(argv)
    try:
        with open("/proc/self/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return [os.fsdecode(a) for a in raw.split(b"\0")[:-1]] or None


def _same_interpreter():
    """Whether this process is the interpreter ``sys.executable`` names
    (not a program that embeds Python, whose command line is its own)."""
    try:
        return bool(sys.executable) and os.path.realpath(sys.executable) == os.path.realpath(
            "/proc/self/exe")
    except OSError:
        return False


# The variables the shim caps by: any one set starts the shim.
CAP_VARS = ("VRAMCAP_LIMIT", "VRAMCAP_GROUP", "NVIDIA_GPU_MEMORY_LIMIT")
# What the shim shows after a bad VRAMCAP_LIMIT (LIMIT_EXAMPLE in
# crates/core/src/limit).
LIMIT_EXAMPLE = "8GiB, 50%, 0=8GiB,1=4GiB or 4GiB,GPU-5ca1ab1e=2GiB"


def _preloads(value):
    """The entries of an ``LD_PRELOAD`` value, split as the loader splits
    it (on ':' and ' ')."""
    return [p for p in value.replace(" ", ":").split(":") if p]


def _named_shims():
    """The ``LD_PRELOAD`` entries whose file name is exactly ``libvramcap.so``."""
    return [p for p in _preloads(os.environ.get("LD_PRELOAD", "")) if os.path.basename(p) == SHIM]


def _escaped(value):
    """``value`` as the shim shows it between quotes (Rust's
    ``escape_debug``, for the characters an empty-looking value holds)."""
    import unicodedata

    out = []
    for c in value:
        if c in "\\\"'":
            out.append("\\" + c)
        elif c in "\t\r\n":
            out.append({"\t": "\\t", "\r": "\\r", "\n": "\\n"}[c])
        elif unicodedata.category(c) in ("Cc", "Zl", "Zp"):
            out.append("\\u{%x}" % ord(c))
        else:
            out.append(c)
    return "".join(out)


def empty_limit():
    """The shim's line for a ``VRAMCAP_LIMIT`` that is set but empty (or
    only white space), which the shim and ``vramcap run`` refuse; None for
    any other value (the shim checks those itself)."""
    from . import _WHITE

    value = os.environ.get("VRAMCAP_LIMIT")
    if value is None or value.strip(_WHITE):
        return None
    return (f'VRAMCAP_LIMIT="{_escaped(value)}" is not a valid limit: the value is empty '
            f"(unset the variable to run without a cap); expected a size or percentage per GPU, "
            f"e.g. {LIMIT_EXAMPLE}")


def _exec(lib, env_extra):
    argv = orig_argv()
    if not argv:
        raise OSError("the interpreter's command line is not known")
    env = dict(os.environ)
    env.update(env_extra)
    # Another libvramcap.so named there is not in this process (a missing
    # file, or one that did not load): the restart names only this one.
    others = [p for p in _preloads(env.get("LD_PRELOAD", ""))
              if p != lib and os.path.basename(p) != SHIM]
    env["LD_PRELOAD"] = ":".join([lib] + others)
    env[GUARD] = str(os.getpid())
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os.execve(sys.executable, argv, env)


def autostart():
    """At interpreter start with a vramcap variable set: the same program
    again under the shim, or a line saying why not (never an exception:
    the interpreter starts either way). An empty ``VRAMCAP_LIMIT`` ends the
    process as the shim ends it: one line, exit status 2."""
    try:
        bad = empty_limit()
        if bad is not None:
            _say(bad)
            os._exit(2)
        if shim_loaded():
            return
        which = next((v for v in CAP_VARS if os.environ.get(v)), CAP_VARS[0])
        if os.environ.get(GUARD) == str(os.getpid()):
            _say(f"{which} is set and this interpreter was restarted under {SHIM}, "
                 "but it is not loaded (LD_PRELOAD dropped?): running without the cap")
            return
        lib = shim_path()
        named = _named_shims()
        if lib is None:
            _say(f"{which} is set but this package's {SHIM} is missing: running without "
                 "the cap; reinstall it, e.g. pip install --force-reinstall vramcap")
            return
        if not _same_interpreter():
            _say(f"{which} is set but this Python is embedded in another program, which "
                 "cannot be restarted: start that program under vramcap run")
            return
        if named:
            why = "is not there" if not os.path.exists(named[0]) else "did not load"
            _say(f"{which} is set and LD_PRELOAD names {named[0]}, which {why}: "
                 f"restarting this interpreter under {lib}")
        _exec(lib, {})
    except Exception as e:  # noqa: BLE001 - a .pth must never stop the interpreter
        _say(f"cannot restart this interpreter under {SHIM}: {e}; running without the cap")


def _cli():
    """How to name the vramcap command in a line for the user."""
    import shutil

    return "vramcap" if shutil.which("vramcap") else shlex.quote(sys.executable) + " -m vramcap"


def _lost():
    """What a restart would lose here, or None when it loses nothing."""
    if "ipykernel" in sys.modules:
        return "kernel", "a notebook kernel cannot restart itself without losing its state"
    if sys.flags.interactive or sys.flags.inspect or hasattr(sys, "ps1") or "IPython" in sys.modules:
        return "interactive", "an interactive session cannot restart without losing its state"
    if cuda_loaded():
        return "cuda", "CUDA is initialised in this process already, and the shim must be there first"
    if "__mp_main__" in sys.modules:
        return "child", "a multiprocessing child cannot restart itself"
    if not sys.argv or sys.argv[0] in ("", "-"):
        return "stdin", "the program came from standard input, which a restart cannot read again"
    if not _same_interpreter() or not orig_argv():
        return "embedded", "this Python is embedded in another program"
    return None


def limit_spec(device, limit):
    """``VRAMCAP_LIMIT`` for ``set_limit(device, limit)``, checked as
    set_limit checks it (ValueError), e.g. ``0=2GiB``; None for no cap."""
    from . import parse_amount

    if limit is None:
        return None
    if isinstance(limit, str):
        text = limit.strip()
        if text.endswith("%"):
            if device == -1:
                raise ValueError(
                    f"set_limit(-1, {limit!r}): a percentage is of one device's memory; "
                    "set each device, e.g. set_limit(0, '50%')"
                )
            parse_amount(text, 1 << 40)
        else:
            parse_amount(text)
    elif isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
        text = str(limit)
    else:
        raise ValueError(f"limit {limit!r}: bytes above 0, a size such as '2GiB', or None")
    return text if device == -1 else f"{device}={text}"


def init_driver():
    """``cuInit(0)`` (the driver's first call; more calls do nothing);
    whether it succeeded."""
    import ctypes

    try:
        return ctypes.CDLL("libcuda.so.1").cuInit(0) == 0
    except (OSError, AttributeError):
        return False


def restarted_for(device, limit):
    """Whether :func:`restart_for_limit` restarted this process for
    ``set_limit(device, limit)``: its ``VRAMCAP_LIMIT`` is that cap."""
    try:
        spec = limit_spec(device, limit)
    except ValueError:
        return False
    return (os.environ.get(GUARD) == str(os.getpid()) and spec is not None
            and os.environ.get("VRAMCAP_LIMIT") == spec)


# The operator's cap (OPERATOR_LIMIT_PATH in crates/core/src/settings),
# under which the shim ignores VRAMCAP_DISABLE.
OPERATOR_LIMIT_PATH = "/run/vramcap/operator-limit"


def switched_off():
    """Whether the shim would pass every call through here:
    ``VRAMCAP_DISABLE=1`` (as the shim reads it) and no operator's cap."""
    from . import _WHITE

    value = os.environ.get("VRAMCAP_DISABLE")
    return (value is not None and value.strip(_WHITE) == "1"
            and not os.path.exists(OPERATOR_LIMIT_PATH))


def restart_for_limit(call, spec):
    """``vramcap.set_limit`` without the shim: restarts the program with
    ``VRAMCAP_LIMIT=spec`` (one line on stderr), or raises NotActive with
    the command to use instead. ``call`` names the call for the messages."""
    from . import NotActive

    lost = _lost()
    argv = orig_argv() or [os.path.basename(sys.executable or "python3")]
    if switched_off():
        # Under the shim or not, it would pass every call through: not
        # restarted for nothing, and told why rather than "not loaded".
        raise NotActive(f"{call}: VRAMCAP_DISABLE=1 in the environment turns vramcap off in "
                        "this process, so it cannot be capped; unset VRAMCAP_DISABLE to cap it, "
                        f"e.g. env -u VRAMCAP_DISABLE {shlex.join(argv)}")
    command = f"{_cli()} run --limit {shlex.quote(spec)} -- {shlex.join(argv)}"
    if lost is not None:
        kind, why = lost
        if kind == "kernel":
            how = (f"install a capped kernel with `{_cli()} kernel install --limit {shlex.quote(spec)}` "
                   "and switch this notebook to it")
        else:
            how = f"start it as: {command}"
        raise NotActive(f"{call}: libvramcap.so is not loaded and {why}; {how}")
    if os.environ.get(GUARD) == str(os.getpid()):
        raise NotActive(f"{call}: this program was restarted under {SHIM} but it is not loaded "
                        f"(LD_PRELOAD dropped?); start it as: {command}")
    lib = shim_path()
    if lib is None:
        raise NotActive(f"{call}: this package's {SHIM} is missing; reinstall it "
                        "(pip install --force-reinstall vramcap) or start it as: " + command)
    _say(f"{call}: restarting this program under {SHIM} with VRAMCAP_LIMIT={spec}")
    _exec(lib, {"VRAMCAP_LIMIT": spec})
