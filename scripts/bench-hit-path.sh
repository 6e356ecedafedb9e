#!/usr/bin/env bash
# bench-hit-path.sh [BASELINE] [PAIRS] - the instructions the release shim
# spends on one cache-hit pair (cuMemAlloc_v2 and cuMemFree_v2 of 1 MiB,
# the block reused from the cache), counted by valgrind's callgrind over
# PAIRS pairs (default 100) against the stand-in driver, side by side with
# the shim of BASELINE (a commit, default e446e89) in the same run.
#
# It counts what the shim runs itself (its code and the C library's under
# it), not the driver's: the stand-in's instructions are taken out, since
# they say nothing of the real driver's cost. The driver calls a hit makes
# are listed by name and count instead. No GPU is needed; the in-process
# timing of the same pair on the H200 is scripts/gpu_bench.py's.
set -euo pipefail
cd "$(dirname "$0")/.."
baseline=${1:-e446e89}
pairs=${2:-100}
case $pairs in '' | *[!0-9]*) echo "bench-hit-path.sh: PAIRS must be a count, e.g. 100 (got '$pairs')" >&2; exit 2 ;; esac
command -v valgrind >/dev/null || {
    echo "bench-hit-path.sh: needs valgrind (e.g. apt-get install valgrind)" >&2
    exit 1
}

cargo build -q --release --locked -p vramcap-shim
cargo test -q --locked -p vramcap-tests --no-run 2>/dev/null # builds the stand-in and one-alloc
program=$(find target/debug/build -path '*/out/standin/bin/one-alloc' -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
standin=$(dirname "$(dirname "$program")")/lib

# The baseline's shim, built in a worktree of its own under target/.
wt=target/bench-baseline
if [ -d "$wt" ]; then
    git -C "$wt" checkout -q --detach "$baseline"
else
    git worktree add -q --detach "$wt" "$baseline"
fi
(cd "$wt" && cargo build -q --release -p vramcap-shim)

out=$PWD/target/bench-hit-path
mkdir -p "$out"
count() { # count NAME SHIM
    local file="$out/$1.callgrind"
    env -u LD_PRELOAD -u VRAMCAP_STATS_DIR LD_LIBRARY_PATH="$standin" LD_PRELOAD="$2" \
        VRAMCAP_LIMIT=1GiB VRAMCAP_STATS_DIR="$out" \
        valgrind --tool=callgrind --callgrind-out-file="$file" --collect-atstart=no \
        --toggle-collect=one_alloc_hit_pair "$program" hit "$pairs" >"$out/$1.stdout" 2>"$out/$1.stderr"
    grep -qx 'one_alloc hit -> 0' "$out/$1.stdout" || {
        echo "bench-hit-path.sh: the pairs failed under $2: $(cat "$out/$1.stdout")" >&2
        exit 1
    }
    python3 - "$file" "$pairs" "$1" <<'PY'
import re, sys
path, pairs, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
names, ob, fn, skip = {}, "", "", False
shim = driver = 0
calls = {}
def named(kind, v):
    m = re.match(r"\((\d+)\)(?: (.*))?", v.strip())
    if not m:
        return v.strip()
    if m.group(2):
        names[(kind, m.group(1))] = m.group(2)
    return names.get((kind, m.group(1)), "")
cob = cfn = ""
for line in open(path):
    line = line.rstrip("\n")
    head = line.split("=", 1)[0]
    if head in ("ob", "fl", "fi", "fe", "fn", "cob", "cfi", "cfl", "cfn", "calls"):
        v = line.split("=", 1)[1]
        if head == "ob": ob = named("ob", v)
        elif head in ("fl", "fi", "fe", "cfi", "cfl"): named("fl", v)
        elif head == "fn": fn = named("fn", v)
        elif head == "cob": cob = named("ob", v)
        elif head == "cfn":
            cfn = named("fn", v)
        elif head == "calls":
            skip = True  # the next cost line is the call's inclusive cost
            callee = cob or ob  # cob= names the callee's object when it differs
            if "libcuda" in callee and "libcuda" not in ob:
                calls[cfn] = calls.get(cfn, 0) + int(v.split()[0])
            cob = ""
        continue
    if not line or not (line[0].isdigit() or line[0] in "+-*"):
        continue
    if skip:
        skip = False
        continue
    parts = line.split()
    if len(parts) < 2:
        continue
    ir = int(parts[1])
    if "libcuda" in ob or "one-alloc" in ob:
        driver += ir
    else:
        shim += ir
# Call counts cover the 10 warm-up pairs too (callgrind counts calls
# outside the collected function); costs do not.
made = ", ".join(f"{k} {v / (pairs + 10):g}" for k, v in sorted(calls.items()))
print(f"{name}\t{shim / pairs:.0f}\t{made}")
PY
}
base_line=$(count baseline "$PWD/$wt/target/release/libvramcap.so")
head_line=$(count head "$PWD/target/release/libvramcap.so")
printf 'shim\tinstructions per pair\tdriver calls per pair\n%s\n%s\n' "$base_line" "$head_line"
b=$(cut -f2 <<<"$base_line")
h=$(cut -f2 <<<"$head_line")
python3 -c 'import sys; print(f"head / baseline ({sys.argv[3]} against {sys.argv[4]}, {sys.argv[5]} pairs): {int(sys.argv[2]) / int(sys.argv[1]):.3f}")' \
    "$b" "$h" "$(git describe --always --dirty)" "$baseline" "$pairs"
