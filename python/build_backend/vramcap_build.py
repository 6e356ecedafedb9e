"""The PEP 517 build backend of the `vramcap` wheel: maturin, after one step.

maturin (the `build-system.requires` of pyproject.toml) builds the wheel: the
`vramcap` CLI (a Rust binary, maturin's "bin" bindings) goes into the
wheel's scripts, the Python package `python/vramcap` beside it, with
manylinux tags and checks. maturin builds one Cargo package per wheel, and
the shim `libvramcap.so` is a second one (a C library, not a Python
extension), so this backend builds it first and puts it into the package
(`python/vramcap/libvramcap.so`, which pyproject.toml's `include` adds and
git ignores); then it hands over to maturin.

`VRAMCAP_WHEEL_SHIM=/path/libvramcap.so` uses a library built already (the
release script's, linked against glibc 2.17) instead of building one.

The start hook `vramcap_autostart.pth` (python/vramcap/_autostart.py) goes
into site-packages: pyproject.toml's `include` puts it into the wheel, but
maturin's editable wheel (`pip install -e .`) leaves `include` out, so it is
added to that wheel here.
"""

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile

import maturin

# The hooks with nothing to add are maturin's own (PEP 517 and 660 look them
# up by name).
from maturin import (  # noqa: F401
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
ROOT = os.path.dirname(HERE)
PLACED = os.path.join(HERE, "vramcap", "libvramcap.so")


def _place_shim():
    given = os.environ.get("VRAMCAP_WHEEL_SHIM")
    if given:
        if not os.path.isfile(given):
            sys.exit(f"vramcap_build: VRAMCAP_WHEEL_SHIM={given!r} is not a file; "
                     "give the path of a built libvramcap.so, e.g. target/release/libvramcap.so")
        built = given
    else:
        if shutil.which("cargo") is None:
            sys.exit("vramcap_build: cargo not found: the wheel holds the Rust CLI and shim; "
                     "install Rust (https://rustup.rs) or install a released wheel")
        target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
        subprocess.run(["cargo", "build", "--release", "--locked", "-p", "vramcap-shim"],
                       cwd=ROOT, check=True)
        built = os.path.join(target, "release", "libvramcap.so")
    if os.path.abspath(built) != os.path.abspath(PLACED):
        shutil.copyfile(built, PLACED)


AUTOSTART = "vramcap_autostart.pth"


def _add_autostart(wheel_directory, filename):
    """Adds the start hook to the wheel, with its RECORD line, when missing."""
    path = os.path.join(wheel_directory, filename)
    with open(os.path.join(HERE, AUTOSTART), "rb") as f:
        data = f.read()
    with zipfile.ZipFile(path) as zin:
        names = zin.namelist()
        if AUTOSTART in names:
            return
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines = zin.read(record).decode().splitlines()
        lines.insert(0, f"{AUTOSTART},sha256={digest},{len(data)}")
        tmp = path + ".tmp"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
            for n in names:
                if n != record:
                    zout.writestr(zin.getinfo(n), zin.read(n))
            zout.writestr(AUTOSTART, data)
            zout.writestr(zin.getinfo(record), "\n".join(lines) + "\n")
    os.replace(tmp, path)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _place_shim()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


# `pip install -e .` (PEP 660): the same, as maturin's editable wheel.
def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _place_shim()
    filename = maturin.build_editable(wheel_directory, config_settings, metadata_directory)
    _add_autostart(wheel_directory, filename)
    return filename
