"""A PEP 517 build backend for the pure-Python package `vramcap`.

In the repository so that `pip install .` works on a machine without
network access: it needs nothing but the standard library (setuptools
would have to be downloaded into pip's build environment, with `wheel`).
It builds a `py3-none-any` wheel of `python/vramcap` and an sdist of it.
"""

import base64
import hashlib
import io
import os
import tarfile
import zipfile

NAME = "vramcap"
VERSION = "0.1.0"
SUMMARY = "Read and change a process's GPU memory caps under vramcap"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
ROOT = os.path.dirname(HERE)
DIST = f"{NAME}-{VERSION}"

METADATA = f"""Metadata-Version: 2.1
Name: {NAME}
Version: {VERSION}
Summary: {SUMMARY}
License: MIT OR Apache-2.0
Requires-Python: >=3.8
"""

WHEEL = """Wheel-Version: 1.0
Generator: vramcap_build
Root-Is-Purelib: true
Tag: py3-none-any
"""


def _sources():
    """(path in the archive, bytes) of the package's files, sorted."""
    out = []
    pkg = os.path.join(HERE, NAME)
    for dirpath, dirnames, filenames in os.walk(pkg):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py"):
                full = os.path.join(dirpath, f)
                rel = os.path.relpath(full, HERE).replace(os.sep, "/")
                with open(full, "rb") as fh:
                    out.append((rel, fh.read()))
    return out


def _digest(data):
    d = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={d.decode()},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    info = f"{DIST}.dist-info"
    files = _sources() + [
        (f"{info}/METADATA", METADATA.encode()),
        (f"{info}/WHEEL", WHEEL.encode()),
    ]
    record = "".join(f"{path},{_digest(data)}\n" for path, data in files)
    record += f"{info}/RECORD,,\n"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files + [(f"{info}/RECORD", record.encode())]:
            z.writestr(zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return name


def build_sdist(sdist_directory, config_settings=None):
    name = f"{DIST}.tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        def add(path, data):
            ti = tarfile.TarInfo(f"{DIST}/{path}")
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))

        with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
            add("pyproject.toml", fh.read())
        add("PKG-INFO", METADATA.encode())
        for rel, data in _sources():
            add(f"python/{rel}", data)
        with open(os.path.abspath(__file__), "rb") as fh:
            add("python/build_backend/vramcap_build.py", fh.read())
    return name
