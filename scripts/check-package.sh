#!/usr/bin/env bash
# check-package.sh — builds the release packages (scripts/package.sh) and
# inspects them: the .deb holds exactly the CLI in /usr/bin and the library
# in /usr/lib/x86_64-linux-gnu/vramcap/, both need at most glibc 2.17, and
# `vramcap doctor` run from a staged install prefix finds the staged library
# and proves interposition against the stand-in driver.
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
echo "check-package: ok"
