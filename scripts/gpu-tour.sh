#!/usr/bin/env bash
# gpu-tour.sh DIR — the README's tour, from a real run on the GPU machine:
# five CUDA programs under vramcap at once (a PyTorch loop swinging between
# 2 and 6 GiB under an 8 GiB cap; two PyTorch processes in a 6 GiB group,
# the second refused; JAX under 4 GiB; CuPy spilling past 2 GiB to host
# memory), then `vramcap top` recorded in a 120x32 terminal for 12 s,
# `vramcap stat` and an exporter scrape. Writes OUT/tour-top.bin (render it
# with scripts/render-terminal.py), OUT/tour-stat.txt, OUT/tour-metrics.txt
# and OUT/tour.log. DIR holds libvramcap.so and vramcap.
set -u
NAME=tour
# shellcheck source-path=SCRIPTDIR source=gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu/lib.sh"
gpu_setup "${1:?usage: gpu-tour.sh DIR}"
export VRAMCAP_STATS_DIR=$WORK/stats
W=$GPU_SRC/tour_workload.py
pids=()
fds=() # the write ends that keep each workload's input open
n=0
start() { # name, vramcap options…, --, workload args…
    local name=$1
    shift
    local opts=()
    while [ "$1" != -- ]; do opts+=("$1"); shift; done
    shift
    mkfifo "$WORK/$name.in"
    exec {fd}<>"$WORK/$name.in"
    fds+=("$fd")
    "$ART/vramcap" run "${opts[@]}" -- "$PYTHON" "$W" "$@" <"$WORK/$name.in" >"$WORK/$name.out" 2>>"$LOG" &
    pids+=($!)
    n=$((n + 1))
    for _ in $(seq 600); do grep -q '^READY' "$WORK/$name.out" && break; sleep 0.1; done
    echo "$name: $(cat "$WORK/$name.out")" >>"$LOG"
}
start train --limit 8GiB -- train 2 6
start group-a --limit 6GiB --group train -- hold 4
start group-b --limit 6GiB --group train -- greedy 4
start jax --limit 4GiB -- jax
start cupy --limit 2GiB --spill host --spill-limit 4GiB -- cupy 3
{
    "$PYTHON" "$GPU_SRC/pty_capture.py" 120 32 12 "$OUT/tour-top.bin" -- "$ART/vramcap" top --interval 0.5 2>&1
    echo "top exit: $?"
} >>"$LOG"
"$ART/vramcap" stat >"$OUT/tour-stat.txt" 2>>"$LOG"
"$ART/vramcap" exporter --listen 127.0.0.1:0 2>"$WORK/exporter.err" &
EXP=$!
for _ in $(seq 100); do grep -q listening "$WORK/exporter.err" && break; sleep 0.1; done
URL=$(sed -n 's/.*listening on \(http[^ ]*\)$/\1/p' "$WORK/exporter.err")
"$PYTHON" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' "$URL" >"$OUT/tour-metrics.txt" 2>>"$LOG"
kill "$EXP"
for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
wait 2>/dev/null
cat "$OUT/tour-stat.txt"
grep -c '^vramcap_' "$OUT/tour-metrics.txt" | sed 's/^/metric samples: /'
ls -l "$OUT"/tour-top.bin
