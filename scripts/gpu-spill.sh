#!/usr/bin/env bash
# gpu-spill.sh DIR — spill checks and the spill bandwidth benchmark on the GPU
# machine (DIR holds libvramcap.so). Safe sizes: caps around 2 GiB, at most
# 4 GiB spilled. Prints a markdown table; full log in ${OUT:-/tmp}/gpu-spill.log.
set -u
NAME=gpu-spill
# shellcheck source-path=SCRIPTDIR source=gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu/lib.sh"
gpu_setup "${1:?usage: gpu-spill.sh DIR}"
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
ROWS=()
FAILS=0
row() { ROWS+=("| $1 | $2 | $3 | $4 |"); [ "$4" = PASS ] || FAILS=$((FAILS + 1)); }
runlog() { # NAME CMD... -> output in $WORK/NAME.out
    local name=$1
    shift
    { echo "=== $name: $*"; } >>"$LOG"
    timeout 300 "$@" >"$WORK/$name.out" 2>&1
    local rc=$?
    cat "$WORK/$name.out" >>"$LOG"
    echo "rc=$rc" >>"$LOG"
    return $rc
}
base=(env -u LD_PRELOAD -u VRAMCAP_LIMIT -u VRAMCAP_SPILL -u VRAMCAP_SPILL_LIMIT -u PYTORCH_CUDA_ALLOC_CONF)
shim=("${base[@]}" "LD_PRELOAD=$SHIM" VRAMCAP_CACHE=off)

# 1. training with a working set of ~1.44x a 1920 MiB cap (5 x Linear(6144), AdamW: ~2.9 GiB)
runlog train-ref "${base[@]}" "$PYTHON" "$GPU_SRC/check_spill.py"
REF=$(grep '^RESULTKV' "$WORK/train-ref.out" | tail -1)
runlog train-nospill "${shim[@]}" VRAMCAP_LIMIT=1920MiB "$PYTHON" "$GPU_SRC/check_spill.py"
NOSP=$(grep '^RESULTKV' "$WORK/train-nospill.out" | tail -1)
if [ "$(kv oom "$NOSP")" = 1 ]; then r=PASS; else r=FAIL; fi
row "training, cap 1920 MiB, no spill" "torch.OutOfMemoryError" "${NOSP:-no result}" $r
same() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; s = (a < 0 ? -a : a); exit !(a == a && b == b && d <= 1e-5 * (s > 1 ? s : 1)) }'; }
for mode in managed host; do
    for cap in 1920 2304; do
        [ "$mode" = host ] && [ "$cap" = 2304 ] && continue
        name=train-$mode-$cap
        runlog "$name" "${shim[@]}" VRAMCAP_LIMIT=${cap}MiB VRAMCAP_SPILL=$mode VRAMCAP_SPILL_LIMIT=4GiB "$PYTHON" "$GPU_SRC/check_spill.py"
        R=$(grep '^RESULTKV' "$WORK/$name.out" | tail -1)
        ok=1
        [ "$(kv oom "$R")" = 0 ] || ok=0
        same "$(kv loss "$REF")" "$(kv loss "$R")" || ok=0
        same "$(kv checksum "$REF")" "$(kv checksum "$R")" || ok=0
        mp=$(kv max_proc_mib "$R")
        [[ $mp =~ ^[0-9]+$ ]] && ((mp <= cap + 1024)) || ok=0
        slow=$(awk -v a="$(kv ms_per_step "$REF")" -v b="$(kv ms_per_step "$R")" 'BEGIN { if (a > 0) printf "%.2fx", b / a; else print "NA" }')
        if [ $ok = 1 ]; then r=PASS; else r=FAIL; fi
        row "training, cap $cap MiB, VRAMCAP_SPILL=$mode" "same loss and weights as uncapped; process device memory (NVML) <= cap + 1 GiB context" \
            "loss $(kv loss "$R") vs $(kv loss "$REF"); NVML process max ${mp} MiB; step $(kv ms_per_step "$R") ms vs $(kv ms_per_step "$REF") ms uncapped (slowdown $slow)" $r
    done
done

# 2. bandwidth: a kernel reading 1 GiB, by placement, side by side in this run
if "$NVCC" -O2 -arch=sm_90 -o "$WORK/spill_bw" "$GPU_SRC/spill_bw.cu" >>"$LOG" 2>&1; then
    runlog bw-device "${base[@]}" "$WORK/spill_bw" device
    runlog bw-managed "${shim[@]}" VRAMCAP_LIMIT=256MiB VRAMCAP_SPILL=managed VRAMCAP_SPILL_LIMIT=2GiB "$WORK/spill_bw" spilled
    runlog bw-host "${shim[@]}" VRAMCAP_LIMIT=256MiB VRAMCAP_SPILL=host VRAMCAP_SPILL_LIMIT=2GiB "$WORK/spill_bw" spilled
    dev=$(sed -n 's/^BW what=device gbps=\([0-9.]*\).*/\1/p' "$WORK/bw-device.out")
    pin=$(sed -n 's/^BW what=pinned-zero-copy gbps=\([0-9.]*\).*/\1/p' "$WORK/bw-device.out")
    for m in managed host; do
        g=$(sed -n 's/^BW what=spilled gbps=\([0-9.]*\).*/\1/p' "$WORK/bw-$m.out")
        info=$(grep '^SPILLED' "$WORK/bw-$m.out")
        ratio=$(awk -v a="${pin:-0}" -v b="${g:-0}" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "NA" }')
        ok=$(awk -v r="$ratio" 'BEGIN { print (r != "NA" && r >= 0.9) ? "PASS" : "FAIL" }')
        row "kernel reads 1 GiB spilled ($m), cap 256 MiB" ">= 90% of pinned zero-copy bandwidth in this run" \
            "${g:-?} GB/s vs pinned ${pin:-?} GB/s (ratio $ratio), device memory ${dev:-?} GB/s; $info" "$ok"
    done
else
    row "spill_bw.cu" "builds" "nvcc failed (see log)" FAIL
fi

{
    echo "vramcap gpu-spill — $(date -u '+%Y-%m-%d %H:%M:%S UTC') — commit $(cat "$ART/COMMIT" 2>/dev/null || echo ?) — $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
    echo
    table_head
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "$((${#ROWS[@]} - FAILS)) of ${#ROWS[@]} passed"
} | tee "$MD"
[ "$FAILS" = 0 ]
