#!/usr/bin/env bash
# gpu-group.sh DIR — two PyTorch processes in one vramcap group of 8 GiB on
# the GPU machine: the holder takes 6 GiB, the second gets OutOfMemoryError
# after what is left, NVML's per-process figures summed stay within the
# budget plus two CUDA contexts, and after SIGKILL of the holder the second
# gets 7 GiB within a few seconds. DIR holds libvramcap.so and vramcap.
set -u
NAME=gpu-group
# shellcheck source-path=SCRIPTDIR source=gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu/lib.sh"
gpu_setup "${1:?usage: gpu-group.sh DIR}"
export VRAMCAP_STATS_DIR=$WORK/stats
run=("$ART/vramcap" run --limit 8GiB --group g --cache off --)
mkfifo "$WORK/a_in" "$WORK/b_in"
exec 7<>"$WORK/a_in" 8<>"$WORK/b_in"
"${run[@]}" "$PYTHON" "$GPU_SRC/check_group.py" hold 6 <"$WORK/a_in" >"$WORK/a.out" 2>>"$LOG" &
A=$!
for _ in $(seq 600); do grep -q '^HELD' "$WORK/a.out" && break; sleep 0.1; done
HELD=$(grep '^HELD' "$WORK/a.out")
"${run[@]}" "$PYTHON" "$GPU_SRC/check_group.py" probe 7 "$A" <"$WORK/b_in" >"$WORK/b.out" 2>>"$LOG" &
B=$!
for _ in $(seq 600); do grep -q '^READY' "$WORK/b.out" && break; sleep 0.1; done
SHARED=$(grep 'phase=shared' "$WORK/b.out")
STAT=$("$ART/vramcap" stat 2>&1)
kill -9 "$A"
wait "$A" 2>/dev/null
echo >&8
wait "$B"
AFTER=$(grep 'phase=after_kill' "$WORK/b.out")
{ echo "== holder"; cat "$WORK/a.out"; echo "== probe"; cat "$WORK/b.out"; echo "== stat while both ran"; echo "$STAT"; } >>"$LOG"
G=$((1 << 30))
got=$(kv got "$SHARED"); sum=$(kv nvml_sum "$SHARED")
r1=FAIL; [ "$(kv oom "$SHARED")" = 1 ] && [ -n "$got" ] && ((got <= 2 * G)) && r1=PASS
r2=FAIL; [[ $sum =~ ^[0-9]+$ ]] && ((sum <= 10 * G)) && r2=PASS
r3=FAIL; [ "$(kv ok "$AFTER")" = 1 ] && r3=PASS
{
    echo "vramcap gpu-group — $(date -u '+%Y-%m-%d %H:%M:%S UTC') — commit $(cat "$ART/COMMIT" 2>/dev/null || echo ?)"
    echo
    table_head
    echo "| second member while the first holds 6 GiB (group of 8 GiB) | torch.OutOfMemoryError after at most 2 GiB | $HELD; $SHARED | $r1 |"
    echo "| NVML per-process device memory, both summed | <= 8 GiB budget + two CUDA contexts (2 GiB allowance) | nvml_sum=$((sum / 1048576)) MiB | $r2 |"
    echo "| after SIGKILL of the holder | the second member allocates 7 GiB within 3 s | $AFTER | $r3 |"
} | tee "$MD"
[ $r1 = PASS ] && [ $r2 = PASS ] && [ $r3 = PASS ]
