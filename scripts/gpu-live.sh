#!/usr/bin/env bash
# gpu-live.sh DIR — issue 14 on the GPU machine: a cap changed while the
# program runs, from outside (`vramcap limit --pid`) and from inside (the
# Python package over the C ABI), for PyTorch, CuPy and JAX; and what a
# changing cap costs an allocation (scripts/gpu/bench_live.cu, side by side
# in one process).
#
# DIR holds libvramcap.so and vramcap (and COMMIT), e.g. .gpu/. Every
# process runs under LD_PRELOAD=DIR/libvramcap.so VRAMCAP_LIMIT=8GiB and
# sees only the first GPU. Prints a markdown table last; the full log goes to
# ${OUT:-/tmp}/gpu-live.log, the table also to ${OUT:-/tmp}/gpu-live.md.
# Exits 1 if any row fails; a row that could not run is a FAIL.
#
# Environment: PYTHON (torch, cupy, jax), NVCC, CUDA_ARCH (default sm_90),
# OUT, KEEP_WORK=1, BUDGET_S (default 240: no new process after it).

set -u

NAME=gpu-live
# shellcheck source-path=SCRIPTDIR source=gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu/lib.sh"
gpu_args 15 "$@"
gpu_setup "$1"
CUDA_ARCH=${CUDA_ARCH:-sm_90}
BUDGET_S=${BUDGET_S:-240}
need_whole " of seconds" BUDGET_S
need_timeout
gpu_commit
gpu_smi
HEADER="vramcap gpu-live — $(date -u '+%Y-%m-%d %H:%M:%S UTC') — commit $COMMIT — GPU $GPU_NAME, driver $GPU_DRIVER — started at VRAMCAP_LIMIT=8GiB"
export VRAMCAP_STATS_DIR=$WORK/stats
SHIMENV=(env "LD_PRELOAD=$SHIM" VRAMCAP_LIMIT=8GiB "CUDA_VISIBLE_DEVICES=${GPU0_UUID:-0}")
G=$GiB

note_of() {
    local n
    n=$(rc_note)
    [ -n "$n" ] || n="rc=$RC"
    printf '%s' "$n"
}

# py NAME MODE ENV... : check_live.py MODE under the shim; sets line, ok.
py() {
    local name=$1 mode=$2
    shift 2
    run_cmd "$name" 180 "${SHIMENV[@]}" "$@" "$PYTHON" "$GPU_SRC/check_live.py" "$mode" --cli "$CLI" --root "$ROOT"
    line=$(result_line "$OUTF" RESULTKV)
    ok=1
    [ "$RC" = 0 ] && [ -n "$line" ] || ok=0
}

obs() { printf '%s; %s' "$(note_of)" "$(printf '%s' "$line" | cut -c1-700)"; }

# ---- PyTorch, from outside
py torch-outside torch-outside
want_kv lower_ok 1
want_kv total_low $((2 * G))
want_kv refused_low 1
want_kv small_fits 1
want_kv raise_ok 1
want_kv total_back $((8 * G))
want_kv big_fits_back 1
want_kv over_rc 0
want_kv over_over 1
want_kv wait_rc 0
add_row "PyTorch at 8 GiB holding 1 GiB, \`vramcap limit --pid P 2GiB\` from outside" \
    "exit 0; mem_get_info total 2 GiB; 1.5 GiB tensor OutOfMemoryError, 64 MiB fits; back to 8 GiB: 1.5 GiB fits; lowered while holding 2.5 GiB: 'over the new cap'; freed: --wait exits 0" \
    "$(obs)" "$(verdict)"

# ---- PyTorch, from inside
py torch-inside torch-inside
want_kv active 1
want_kv limit_start $((8 * G))
want_kv limit_low $((2 * G))
want_kv stats_limit $((2 * G))
want_kv total_low $((2 * G))
want_kv refused_low 1
want_kv small_fits 1
want_kv total_back $((8 * G))
want_kv big_fits_back 1
want_kv above_refused 1
want_kv in_block $((2 * G))
want_kv after_block $((8 * G))
add_row "PyTorch, vramcap.set_limit(0, '2GiB') from inside (python/vramcap over the C ABI)" \
    "get_limit and memory_stats 2 GiB; 1.5 GiB tensor OutOfMemoryError; back to 8 GiB fits; 9 GiB PermissionError; with vramcap.limit(): 2 GiB inside, 8 GiB after" \
    "$(obs)" "$(verdict)"

# ---- CuPy
py cupy cupy
want_kv lower_ok 1
want_kv total_low $((2 * G))
want_kv refused_low 1
want_kv raise_ok 1
want_kv total_back $((8 * G))
want_kv big_fits_back 1
add_row "CuPy, lowered to 2 GiB from outside" \
    "memGetInfo total 2 GiB; 1.5 GiB array OutOfMemoryError beside 1 GiB; back to 8 GiB: fits" \
    "$(obs)" "$(verdict)"

# ---- JAX
py jax jax XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform
want_kv lower_ok 1
want_kv refused_low 1
want_kv refused_exhausted 1
want_kv raise_ok 1
want_kv big_fits_back 1
add_row "JAX (platform allocator), lowered to 2 GiB from outside while holding 1 GiB" \
    "1.5 GiB array RESOURCE_EXHAUSTED; back to 8 GiB: fits" \
    "$(obs)" "$(verdict)"

# ---- the cost of a changing cap
find_nvcc
BENCH=""
if [ -n "$NVCC_BIN" ] && build_cu "$GPU_SRC/bench_live.cu" "$WORK/bench_live"; then
    BENCH=$WORK/bench_live
fi
for cache in on off; do
    size=1048576
    what="cache hit"
    [ "$cache" = on ] || what="VRAMCAP_CACHE=off: the driver's pair"
    if [ -z "$BENCH" ]; then
        add_row "bench_live $(mib $size), cache $cache" "builds and runs" "nvcc missing or build failed (see log)" FAIL
        continue
    fi
    extra=()
    [ "$cache" = on ] || extra=(VRAMCAP_CACHE=off)
    run_cmd "bench_live_$cache" 180 "${SHIMENV[@]}" "${extra[@]}" "$BENCH" "$size" 20000 6 20
    line=$(result_line "$OUTF" LIVE)
    ok=1
    [ "$RC" = 0 ] && [ -n "$line" ] || ok=0
    r=$(kv ratio "$line")
    [ -n "$r" ] && awk -v r="$r" 'BEGIN { exit !(r <= 1.10) }' || ok=0
    add_row "alloc+free pair $(mib $size) ($what) while another thread changes the cap every 20 µs vs fixed, one process" \
        "changing/fixed median <= 1.10" "$(obs)" "$(verdict)"
done

gpu_report
