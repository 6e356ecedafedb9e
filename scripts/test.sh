#!/usr/bin/env bash
# The test command: every test (those that need root too, when run as
# root), no GPU needed, then the release packages
# built and inspected. Installs what the tests need (a C compiler for the
# stand-in driver, binutils, tmux for the terminal UI test, dpkg, valgrind
# to trace the allocation path, python3's venv for the manifest validator)
# when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v cc >/dev/null || command -v gcc >/dev/null || missing+=(gcc)
command -v nm >/dev/null || missing+=(binutils)
command -v tmux >/dev/null || missing+=(tmux)
command -v dpkg-deb >/dev/null || missing+=(dpkg)
command -v objdump >/dev/null || missing+=(binutils)
command -v setpriv >/dev/null || missing+=(util-linux)
command -v valgrind >/dev/null || missing+=(valgrind)
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
        echo "test.sh: installing ${missing[*]}" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "test.sh: please install: ${missing[*]} (e.g. sudo apt-get install ${missing[*]})" >&2
        exit 1
    fi
fi

# Tests that need root (other uids, chown, a mount namespace of their own)
# are #[ignore = "needs root"]: as root, as CI runs, they run too; as
# another user they are reported ignored, not passed.
test_args=("$@")
if [ "$(id -u)" = 0 ]; then
    case " ${test_args[*]-} " in
        *" -- "*) test_args+=(--include-ignored) ;;
        *) test_args+=(-- --include-ignored) ;;
    esac
fi
cargo test --workspace --locked "${test_args[@]}"

# The GPU suite's own helpers on fake programs (no GPU): the runner,
# key=value parsing, timeouts, the table (pytest from PyPI, installed into
# target/gpu-venv when missing).
[ -x target/gpu-venv/bin/python ] || { python3 -m venv target/gpu-venv && target/gpu-venv/bin/pip install -q pytest; }
target/gpu-venv/bin/python -m pytest scripts/gpu/tests -q -m harness

# The device plugin against a stand-in kubelet (grpcio, from the official
# proto; installed from PyPI into target/kubelet-venv when missing), then a
# container made from its Allocate answer (needs the debug build above).
python3 scripts/check-device-plugin.py

# Jupyter kernels from `vramcap kernel install`, started by jupyter_client's
# KernelManager (jupyter_client and ipykernel from PyPI into
# target/jupyter-venv when missing; needs the debug build above).
python3 scripts/check-jupyter.py

# Release packages: glibc 2.17 floor, .deb contents, doctor from a staged
# install (installs cargo-zigbuild, zig and cargo-deb when missing).
bash scripts/check-package.sh

# The Kubernetes files: manifests validated offline against the schemas, a
# node, a capped pod and the exporter played out from them (installs
# kubernetes-validate from PyPI into target/k8s-venv when missing).
python3 scripts/check-deploy.py

# The dashboard and alerting rules: the rules checked and unit-tested, the
# dashboard's PromQL parsed, by promtool; metric names held to the table in
# docs/statistics.md (downloads Debian's prometheus package into
# target/tools/prometheus when missing).
bash scripts/check-monitoring.sh
