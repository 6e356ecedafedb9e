#!/usr/bin/env bash
# Build everything, then show the cap holding on a small example program
# (examples/fill.c): it allocates 256 MiB chunks until refused and prints
# what it saw. Uses the real driver when a GPU is usable, otherwise the
# stand-in driver from tests/standin, and says which.
#
#   scripts/demo.sh            # cap 2GiB
#   VRAMCAP_DEMO_LIMIT=1GiB scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
limit=${VRAMCAP_DEMO_LIMIT:-2GiB}

command -v cargo >/dev/null || { echo "demo: cargo is needed (https://rustup.rs)" >&2; exit 1; }
command -v cc >/dev/null || { echo "demo: a C compiler (cc) is needed for the example program; on Debian/Ubuntu: apt-get install gcc" >&2; exit 1; }

cargo build --release
cc -O2 -Wall -o target/release/vramcap-fill examples/fill.c -ldl
run=(target/release/vramcap run --limit "$limit" -- target/release/vramcap-fill)

echo
echo "== ${run[*]}"
err=$(mktemp)
trap 'rm -f "$err"' EXIT
set +e
"${run[@]}" 2>"$err"
rc=$?
set -e
if [ "$rc" -eq 3 ]; then
    # fill.c exits 3 when it finds no CUDA driver: not a failure of the demo.
    echo "== this machine has no NVIDIA driver ($(sed -n 's/^fill: no CUDA driver: //p' "$err" | head -n 1)):"
    echo "== using the stand-in driver instead (tests/standin, exact accounting, 16 GiB per fake device)"
    bash tests/standin/build.sh target/standin
    LD_LIBRARY_PATH="$PWD/target/standin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "${run[@]}"
    rc=$?
else
    cat "$err" >&2
    echo "== that was the real driver"
fi
exit "$rc"
