#!/usr/bin/env bash
# check-package.sh — builds the release packages (scripts/package.sh) and
# inspects them: the .deb holds exactly the CLI in /usr/bin and the library
# in /usr/lib/x86_64-linux-gnu/vramcap/, both need at most glibc 2.17, and
# `vramcap doctor` run from a staged install prefix finds the staged library
# and proves interposition against the stand-in driver. Then the README's
# install steps for the tarball and the wheel, each in a clean directory:
# doctor, and `vramcap run --limit 1GiB` capping the stand-in's client
# (for the wheel also `python -m vramcap run`, `import vramcap`, and
# `VRAMCAP_LIMIT=1GiB python` capped with no launcher).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/package.sh
deb=$(ls target/package/vramcap_*_amd64.deb)
contents=$(dpkg-deb -c "$deb" | awk '{print $6}' | grep -v '/$' | sort)
want=$(printf '%s\n' ./usr/bin/vramcap ./usr/lib/x86_64-linux-gnu/vramcap/libvramcap.so \
    ./usr/share/doc/vramcap/README.md ./usr/share/doc/vramcap/copyright ./usr/share/doc/vramcap/gpu-results.md | sort)
if [ "$contents" != "$want" ]; then
    echo "check-package: unexpected .deb contents:" >&2
    diff <(echo "$want") <(echo "$contents") >&2 || true
    exit 1
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
dpkg-deb -x "$deb" "$stage"
bash scripts/check-glibc.sh 2.17 "$stage/usr/bin/vramcap" "$stage/usr/lib/x86_64-linux-gnu/vramcap/libvramcap.so"
bash tests/standin/build.sh target/standin-package
out=$(env -u VRAMCAP_LIBRARY LD_LIBRARY_PATH="$PWD/target/standin-package/lib" VRAMCAP_STATS_DIR="$stage/stats" \
    "$stage/usr/bin/vramcap" doctor) || { echo "$out" >&2; echo "check-package: doctor failed" >&2; exit 1; }
echo "$out"
grep -qx "ok    shim: $stage/usr/lib/x86_64-linux-gnu/vramcap/libvramcap.so" <<<"$out" || {
    echo "check-package: doctor did not find the staged library" >&2
    exit 1
}
grep -q '^ok    interposition: ' <<<"$out" || { echo "check-package: interposition not proven" >&2; exit 1; }
tar -tzf target/package/vramcap-*-x86_64-linux-gnu.tar.gz | sort

# The README's install steps, each in a clean directory, then doctor and a
# capped run against the stand-in driver.
SI=$PWD/target/standin-package
client=$SI/bin/client
capped_fill() { # CMD...: runs CMD run --limit 1GiB -- client procaddr init fill 256M
    local got
    got=$(env -u VRAMCAP_LIBRARY LD_LIBRARY_PATH="$SI/lib" VRAMCAP_STATS_DIR="$stage/stats" \
        "$@" run --limit 1GiB -- "$client" procaddr init fill 256M) || true
    if [ "$got" != "$(printf 'init -> 0\nfill 268435456 -> 4 allocs 1073741824 bytes rc=2')" ]; then
        echo "check-package: '$*' run did not cap the stand-in client at 1 GiB:" >&2
        echo "$got" >&2
        exit 1
    fi
}
doctor_finds() { # LIB CMD...: doctor of CMD finds LIB and proves interposition
    local lib=$1 out
    shift
    out=$(env -u VRAMCAP_LIBRARY LD_LIBRARY_PATH="$SI/lib" VRAMCAP_STATS_DIR="$stage/stats" "$@" doctor) ||
        { echo "$out" >&2; echo "check-package: '$*' doctor failed" >&2; exit 1; }
    grep -qx "ok    shim: $lib" <<<"$out" || { echo "$out" >&2; echo "check-package: '$*' doctor did not find $lib" >&2; exit 1; }
    grep -q '^ok    interposition: ' <<<"$out" || { echo "check-package: '$*' interposition not proven" >&2; exit 1; }
}

capped_fill "$stage/usr/bin/vramcap"

# Tarball: tar -xzf … -C DIR, then DIR/vramcap-…/bin/vramcap.
tdir=$stage/tarball
mkdir -p "$tdir"
tar -xzf target/package/vramcap-*-x86_64-linux-gnu.tar.gz -C "$tdir"
tbin=$(echo "$tdir"/vramcap-*/bin/vramcap)
doctor_finds "$(realpath "$(dirname "$tbin")/../lib/vramcap/libvramcap.so")" "$tbin"
capped_fill "$tbin"

# Wheel: exactly the CLI, the shim and the package; both binaries on the
# glibc floor; installed into a fresh virtual environment, the CLI finds
# the shim inside the package, `python -m vramcap run` caps, the package
# imports.
whl=$(ls target/package/vramcap-*manylinux_2_17_x86_64*.whl)
names=$(python3 -c 'import sys, zipfile; print("\n".join(sorted(zipfile.ZipFile(sys.argv[1]).namelist())))' "$whl")
want=$(printf '%s\n' vramcap/__init__.py vramcap/__main__.py vramcap/_autostart.py vramcap/torch.py vramcap/libvramcap.so \
    vramcap_autostart.pth vramcap-0.1.0.data/scripts/vramcap \
    vramcap-0.1.0.dist-info/METADATA vramcap-0.1.0.dist-info/RECORD vramcap-0.1.0.dist-info/WHEEL \
    vramcap-0.1.0.dist-info/sboms/vramcap.cyclonedx.json | sort)
if [ "$names" != "$want" ]; then
    echo "check-package: unexpected wheel contents:" >&2
    diff <(echo "$want") <(echo "$names") >&2 || true
    exit 1
fi
wdir=$stage/wheel
mkdir -p "$wdir"
(cd "$wdir" && python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall()' "$OLDPWD/$whl")
bash scripts/check-glibc.sh 2.17 "$wdir/vramcap-0.1.0.data/scripts/vramcap" "$wdir/vramcap/libvramcap.so"
venv=$stage/venv
python3 -m venv "$venv"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/pip" install --quiet --no-index --no-deps --no-cache-dir "$whl"
vlib=$(echo "$venv"/lib/python3*/site-packages/vramcap/libvramcap.so)
doctor_finds "$(realpath "$vlib")" "$venv/bin/vramcap"
capped_fill "$venv/bin/vramcap"
capped_fill "$venv/bin/python" -m vramcap
got=$("$venv/bin/python" -c 'import vramcap; print(vramcap.is_active(), vramcap.parse_amount("2GiB"))')
[ "$got" = "False 2147483648" ] || { echo "check-package: import vramcap gave '$got'" >&2; exit 1; }
# No launcher (issue 35): VRAMCAP_LIMIT alone caps python through the
# wheel's start hook, and `vramcap.set_limit` at the top of a script
# restarts it capped. The program allocates 256 MiB blocks on the stand-in
# driver through ctypes, up to 16.
alloc=$(cat tests/clients/alloc_256m.py)
py_capped() { # WANT [VAR=VALUE…] PYTHON ARGS…: stdout must be WANT, stderr kept in $stage/py-err
    local want=$1 got
    shift
    got=$(env -u VRAMCAP_LIBRARY -u LD_PRELOAD -u VRAMCAP_LIMIT -u VRAMCAP_GROUP LD_LIBRARY_PATH="$SI/lib" \
        VRAMCAP_STATS_DIR="$stage/stats" VRAMCAP_LOG=error "$@" 2>"$stage/py-err") || true
    if [ "$got" != "$want" ]; then
        echo "check-package: '$*' printed '$got', not '$want':" >&2
        cat "$stage/py-err" >&2
        exit 1
    fi
}
py_capped "allocs 4 rc 2" VRAMCAP_LIMIT=1GiB "$venv/bin/python" -c "$alloc"
py_capped "allocs 16 rc 0" "$venv/bin/python" -c "$alloc"
printf 'import vramcap; vramcap.set_limit(0, "2GiB")\n%s\n' "$alloc" >"$stage/train.py"
py_capped "allocs 8 rc 2" "$venv/bin/python" "$stage/train.py"
want="vramcap: set_limit(0, '2GiB'): restarting this program under libvramcap.so with VRAMCAP_LIMIT=0=2GiB"
[ "$(cat "$stage/py-err")" = "$want" ] || { cat "$stage/py-err" >&2; echo "check-package: set_limit did not say it restarts" >&2; exit 1; }
# `pip install .` from this checkout does the same (pip fetches maturin
# into its temporary build environment, without a cache; the backend builds
# the shim with cargo, maturin the CLI).
venv=$stage/venv-checkout
python3 -m venv "$venv"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/pip" install --quiet --no-cache-dir --no-deps "$PWD"
vlib=$(echo "$venv"/lib/python3*/site-packages/vramcap/libvramcap.so)
doctor_finds "$(realpath "$vlib")" "$venv/bin/vramcap"
capped_fill "$venv/bin/python" -m vramcap
py_capped "allocs 4 rc 2" VRAMCAP_LIMIT=1GiB "$venv/bin/python" -c "$alloc"

# `pip install -e .`: the package stays in python/, where the backend put
# the shim; the CLI finds it through the environment's vramcap.pth, and the
# backend adds the start hook that maturin's editable wheel leaves out.
venv=$stage/venv-editable
python3 -m venv "$venv"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/pip" install --quiet --no-cache-dir --no-deps -e "$PWD"
doctor_finds "$PWD/python/vramcap/libvramcap.so" "$venv/bin/vramcap"
capped_fill "$venv/bin/vramcap"
py_capped "allocs 4 rc 2" VRAMCAP_LIMIT=1GiB "$venv/bin/python" -c "$alloc"
echo "check-package: ok"
