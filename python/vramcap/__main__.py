"""`python -m vramcap ARGS...`: the `vramcap` command of this installation.

Runs the CLI that the wheel installed beside this interpreter (its scripts
directory), with the shim of this package (VRAMCAP_LIBRARY, unless set), e.g.
``python -m vramcap run --limit 8GiB -- python train.py``.
"""

import os
import shutil
import sys
import sysconfig


def _candidates():
    seen = []
    for scheme in (None, "posix_user", "posix_prefix"):
        try:
            d = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        except KeyError:
            continue
        if d and d not in seen:
            seen.append(d)
    # pip install --target DIR: DIR/bin beside DIR/vramcap.
    seen.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bin"))
    out = [os.path.join(d, "vramcap") for d in seen]
    found = shutil.which("vramcap")
    if found:
        out.append(found)
    return out


def main():
    lib = os.path.join(os.path.dirname(os.path.abspath(__file__)), "libvramcap.so")
    tried = _candidates()
    exe = next((p for p in tried if os.path.isfile(p) and os.access(p, os.X_OK)), None)
    if exe is None:
        sys.stderr.write(
            "vramcap: the vramcap command of this installation is missing (looked at %s); "
            "reinstall it, e.g. pip install --force-reinstall vramcap\n" % ", ".join(tried))
        return 2
    env = dict(os.environ)
    if os.path.isfile(lib):
        env.setdefault("VRAMCAP_LIBRARY", lib)
    os.execve(exe, [exe] + sys.argv[1:], env)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
