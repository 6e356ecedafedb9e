#!/usr/bin/env bash
# gpu-cache.sh DIR — issue 15's cache part on the GPU machine: the
# freed-block cache reuses a block without waiting for the GPU while every
# stream is one the legacy stream orders, and waits once a non-blocking
# stream exists; what that is worth.
#
# DIR holds libvramcap.so and vramcap (and COMMIT), e.g. .gpu/. Rows:
#   - cache_safety.cu (a kernel still writing a freed block on stream s1,
#     the block reused on s2): the controls (the program itself reuses
#     without waiting) must clobber, with non-blocking and with blocking
#     streams; under the shim with the cache on, nothing is clobbered with
#     either, and the shim's log says it waited only for non-blocking ones
#   - churn.cu 5000 iterations, ROUNDS rounds interleaved: without the shim,
#     cache off, cache on with an unused non-blocking stream (the cache
#     waits), cache on (ordered, no wait), and without the shim its kernels
#     alone with the buffers allocated once (the floor); identical
#     checksums; speed-ups
#   - bench_torch.py (MLP step): PyTorch's caching allocator without the
#     shim, PYTORCH_NO_CUDA_MEMORY_CACHING=1 without and with the shim,
#     ROUNDS rounds interleaved; ratios
# Every process sees only the first GPU; the shim runs at VRAMCAP_LIMIT=CAP
# (default 8GiB). Table last; log in ${OUT:-/tmp}/gpu-cache.log, table in
# ${OUT:-/tmp}/gpu-cache.md. Exits 1 if a safety or checksum row fails (the
# speed rows report their goal and are PASS when it is met).
#
# Environment: PYTHON, NVCC, CUDA_ARCH (default sm_90), OUT, KEEP_WORK=1,
# ROUNDS (default 3), BUDGET_S (default 300).

set -u

NAME=gpu-cache
# shellcheck source-path=SCRIPTDIR source=gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu/lib.sh"
gpu_args 27 "$@"
gpu_setup "$1"
CUDA_ARCH=${CUDA_ARCH:-sm_90}
BUDGET_S=${BUDGET_S:-300}
ROUNDS=${ROUNDS:-3}
CAP=${CAP:-8GiB}
need_whole " of seconds" BUDGET_S
need_whole "" ROUNDS
need_timeout
gpu_commit
gpu_smi
HEADER="vramcap gpu-cache — $(date -u '+%Y-%m-%d %H:%M:%S UTC') — commit $COMMIT — GPU $GPU_NAME, driver $GPU_DRIVER — VRAMCAP_LIMIT=$CAP, $ROUNDS rounds"
export VRAMCAP_STATS_DIR=$WORK/stats
VIS="CUDA_VISIBLE_DEVICES=${GPU0_UUID:-0}"
NOSHIM=(env -u LD_PRELOAD "$VIS")
SHIM=(env "LD_PRELOAD=$SHIM" "VRAMCAP_LIMIT=$CAP" VRAMCAP_LOG=info "$VIS")
NB_NOTE="asked for a non-blocking stream"

find_nvcc
CS=""
CH=""
if [ -n "$NVCC_BIN" ]; then
    build_cu "$GPU_SRC/cache_safety.cu" "$WORK/cache_safety" && CS=$WORK/cache_safety
    build_cu "$GPU_SRC/churn.cu" "$WORK/churn" && CH=$WORK/churn
fi

# ---- stream safety
if [ -n "$CS" ]; then
    for streams in nonblocking blocking; do
        run_cmd "naive-$streams" 60 "${NOSHIM[@]}" "$CS" naive "$streams"
        line=$(result_line "$OUTF" RESULT)
        ok=1
        [ "$RC" = 0 ] || ok=0
        want_in clobbered 1
        add_row "control: the program reuses a block a kernel still writes, $streams streams, no shim" \
            "clobbered > 0 (the check can see a reuse that does not wait)" "${line:-no RESULT line} rc=$RC" "$(verdict)"
    done
    for streams in nonblocking blocking; do
        run_cmd "shim-$streams" 60 "${SHIM[@]}" "$CS" cuda "$streams"
        line=$(result_line "$OUTF" RESULT)
        ok=1
        [ "$RC" = 0 ] || ok=0
        want_in clobbered 0 0
        want_kv reused 1
        waited=no
        grep -q "$NB_NOTE" "$ERRF" && waited=yes
        if [ "$streams" = nonblocking ]; then
            exp="reused=1 clobbered=0; the shim says it waits (non-blocking stream)"
            [ $waited = yes ] || ok=0
        else
            exp="reused=1 clobbered=0 without waiting (ordered on the legacy stream)"
            [ $waited = no ] || ok=0
        fi
        add_row "cache on: cudaFree while a kernel writes, cudaMalloc + copy on another stream, $streams streams" \
            "$exp" "${line:-no RESULT line} rc=$RC; waits: $waited" "$(verdict)"
    done
    # The non-blocking stream created after an ordering (see cache_safety.cu's "late").
    run_cmd shim-late 60 "${SHIM[@]}" "$CS" late
    line=$(result_line "$OUTF" RESULT)
    ok=1
    [ "$RC" = 0 ] || ok=0
    want_in clobbered 0 0
    want_kv reused 1
    add_row "cache on: a non-blocking stream created after an ordered reuse, copies on it into a block a kernel still writes" \
        "reused=1 clobbered=0 (the shim waits for its orderings when the stream is asked for)" "${line:-no RESULT line} rc=$RC" "$(verdict)"
else
    add_row "cache_safety.cu" "builds" "nvcc missing or build failed (see log)" FAIL
fi

# median of the numbers in a space-separated list
median() { printf '%s\n' "$1" | tr -s ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print ""; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "NA" }'; }

# ---- churn
if [ -n "$CH" ]; then
    declare -A MS SUMS
    for v in base off wait ordered once; do MS[$v]=""; SUMS[$v]=""; done
    for ((r = 1; r <= ROUNDS; r++)); do
        for v in base off wait ordered once; do
            case $v in
                base) run_cmd "churn-$v-$r" 60 "${NOSHIM[@]}" "$CH" 5000 ;;
                once) run_cmd "churn-$v-$r" 60 "${NOSHIM[@]}" "$CH" 5000 once ;;
                off) run_cmd "churn-$v-$r" 60 "${SHIM[@]}" VRAMCAP_CACHE=off "$CH" 5000 ;;
                wait) run_cmd "churn-$v-$r" 60 "${SHIM[@]}" "$CH" 5000 nbstream ;;
                ordered) run_cmd "churn-$v-$r" 60 "${SHIM[@]}" "$CH" 5000 ;;
            esac
            line=$(result_line "$OUTF" RESULT)
            MS[$v]="${MS[$v]} $(printf '%s\n' "$line" | sed -n 's/.*ms=\([0-9.]*\).*/\1/p')"
            SUMS[$v]="${SUMS[$v]} $(kv checksum "$line")"
        done
    done
    ok=1
    all=$(printf '%s\n' "${SUMS[base]} ${SUMS[off]} ${SUMS[wait]} ${SUMS[ordered]} ${SUMS[once]}" | tr -s ' ' '\n' | grep . | sort -u)
    [ "$(printf '%s\n' "$all" | grep -c .)" = 1 ] && isint "$all" || ok=0
    mb=$(median "${MS[base]}")
    mo=$(median "${MS[off]}")
    mw=$(median "${MS[wait]}")
    mr=$(median "${MS[ordered]}")
    m1=$(median "${MS[once]}")
    add_row "churn.cu 5000 iterations: identical results" "one checksum over every run" "checksums: $(printf '%s ' "$all")" "$(verdict)"
    ok=1
    awk -v a="$mb" -v b="$mr" 'BEGIN { exit !(a > 0 && b > 0 && a / b >= 10) }' || ok=0
    add_row "churn.cu speed-up over no shim (median ms of $ROUNDS)" "cache on, ordered: >= 10x (goal)" \
        "no shim $mb ms; cache off $mo ms; cache waits $mw ms ($(ratio "$mb" "$mw")x); cache ordered $mr ms ($(ratio "$mb" "$mr")x); the kernels alone, buffers allocated once, no shim: $m1 ms ($(ratio "$mb" "$m1")x, the floor)" "$(verdict)"
else
    add_row "churn.cu" "builds" "nvcc missing or build failed (see log)" FAIL
fi

# ---- PyTorch without its caching allocator
if command -v "$PYTHON" >/dev/null 2>&1; then
    declare -A TS
    for v in caching nocache shim; do TS[$v]=""; done
    for ((r = 1; r <= ROUNDS; r++)); do
        for v in caching nocache shim; do
            case $v in
                caching) run_cmd "torch-$v-$r" 180 "${NOSHIM[@]}" "$PYTHON" "$GPU_SRC/bench_torch.py" ;;
                nocache) run_cmd "torch-$v-$r" 180 "${NOSHIM[@]}" PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$PYTHON" "$GPU_SRC/bench_torch.py" ;;
                shim) run_cmd "torch-$v-$r" 180 "${SHIM[@]}" PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$PYTHON" "$GPU_SRC/bench_torch.py" ;;
            esac
            line=$(result_line "$OUTF" BENCH)
            TS[$v]="${TS[$v]} $(kv ms_per_step "$line")"
            if [ "$v" = shim ] && grep -q "$NB_NOTE" "$ERRF"; then TS_WAITED=yes; fi
        done
    done
    tc=$(median "${TS[caching]}")
    tn=$(median "${TS[nocache]}")
    ts=$(median "${TS[shim]}")
    ok=1
    awk -v a="$ts" -v b="$tc" 'BEGIN { exit !(a > 0 && b > 0 && a / b <= 1.2) }' || ok=0
    add_row "PyTorch MLP step, PYTORCH_NO_CUDA_MEMORY_CACHING=1 under the shim vs PyTorch's own caching allocator (median ms of $ROUNDS)" \
        "<= 1.2x (goal)" \
        "caching allocator $tc ms; no caching, no shim $tn ms ($(ratio "$tn" "$tc")x); no caching, shim $ts ms ($(ratio "$ts" "$tc")x); the shim waited: ${TS_WAITED:-no}" "$(verdict)"
else
    add_row "bench_torch.py" "runs" "python ($PYTHON) not found" FAIL
fi

gpu_report
