#!/usr/bin/env bash
# gpu-tiered.sh DIR — issue 15 on the GPU machine: training whose working set
# is larger than the cap, with tiered spill (VRAMCAP_SPILL=tiered) against
# uncapped and against host spill, side by side in one run
# (scripts/gpu/check_tiered.py: a 271 M-parameter Llama-style model and an
# 8 x Linear(4096) MLP, AdamW, fp32, deterministic).
#
# The cap for an oversubscription R is the context plus the uncapped run's
# reserved peak divided by R (the cap counts what the process holds,
# context included). Each row checks: the same loss at every step, to the
# last bit; NVML's figure for the process never above the cap; and the step
# time against the goal (3x at 1.5, 1.3x at 1.1; reported only at 1.25).
#
# DIR holds libvramcap.so and vramcap (and COMMIT). Prints a markdown table
# last; the full log goes to ${OUT:-/tmp}/gpu-tiered.log, the table also to
# ${OUT:-/tmp}/gpu-tiered.md. Exits 1 if any row fails.
#
# Environment: PYTHON, OUT, KEEP_WORK=1, BUDGET_S (default 500), MODELS
# (default "llama mlp"; " " for none), HOST_STATE (below), RATIOS (default "1.5 1.25 1.1"),
# HOST_SPILL=1 to add host spill at the first ratio (slow), PROGRAMS
# (changed programs, each run uncapped and tiered at PROGRAM_RATIOS, default
# RATIOS, under the unchanged program's caps: save_on_cpu, the program
# keeping its saved activations on the host itself with PyTorch's
# save_on_cpu; fused, AdamW(fused=True); cuda_graph, the whole step
# captured once and replayed as one CUDA graph; expandable, PyTorch's
# expandable_segments:True (its memory made page by page with cuMemCreate,
# which tiered spill moves too); or several, e.g. save_on_cpu+fused; what a
# program that may be changed can do, so no goal applies; SAVE_ON_CPU=1
# adds save_on_cpu), PROFILE=1 (every run profiles two more steps, and
# scripts/gpu/kernel_delta.py says, after each capped row, which kernels
# took the extra time against the uncapped run), CONTEXT_MIB (default 520),
# STEPS (default 30), LAUNCH_COST=0 / BATCH_COPY=0 / GRAPH_HEAT=0 to skip
# the launch-cost, batched-copy and graph-heat rows, NVCC,
# CUDA_ARCH (default sm_90), VARIANTS ("NAME=PATH ...": tiered rows, of the
# changed programs too, also with each of these builds of libvramcap.so,
# side by side, for policy comparisons).
#
# HOST_STATE ("MIB[:sq] ...", e.g. "1185 1185:sq 2170") adds rows that
# run no shim and no cap: after the first step the program itself moves
# MIB MiB of AdamW's state (exp_avg first, or exp_avg_sq first with :sq)
# into pinned host memory the GPU reads over the link (check_tiered.py
# --host-state). What such a step costs is the floor of zero-copy
# placement of those bytes, placed tensor by tensor where a shim sees only
# segments; at R the host must hold the reserved peak times 1 - 1/R.
#
# After each tiered row, scripts/gpu/tier_report.py says where the blocks
# were, by what they hold (parameters, gradients, optimizer state, other):
# in the log and in ${OUT:-/tmp}/gpu-tiered-report.txt.

set -u

NAME=gpu-tiered
# shellcheck source-path=SCRIPTDIR source=gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu/lib.sh"
gpu_args 21 "$@"
gpu_setup "$1"
BUDGET_S=${BUDGET_S:-500}
CONTEXT_MIB=${CONTEXT_MIB:-520}
STEPS=${STEPS:-30}
need_whole " of seconds" BUDGET_S
need_whole " of MiB" CONTEXT_MIB
need_whole "" STEPS
need_timeout
gpu_commit
gpu_smi
HEADER="vramcap gpu-tiered — $(date -u '+%Y-%m-%d %H:%M:%S UTC') — commit $COMMIT — GPU $GPU_NAME, driver $GPU_DRIVER"
export VRAMCAP_STATS_DIR=$WORK/stats
BASE=(env -u LD_PRELOAD -u VRAMCAP_LIMIT -u VRAMCAP_SPILL -u PYTORCH_CUDA_ALLOC_CONF "CUDA_VISIBLE_DEVICES=${GPU0_UUID:-0}")

TRAIN_ARGS=()
# train NAME MODEL STEPS ENV... : check_tiered.py (with TRAIN_ARGS); sets line.
train() {
    local name=$1 model=$2 steps=$3
    shift 3
    local prof=()
    [ "${PROFILE:-0}" = 1 ] && prof=(--profile "$WORK/kernels-$name.txt")
    run_cmd "$name" 300 "${BASE[@]}" "$@" "$PYTHON" "$GPU_SRC/check_tiered.py" "$model" --steps "$steps" --timed $((steps / 3)) --map "${prof[@]}" "${TRAIN_ARGS[@]}"
    line=$(result_line "$OUTF" RESULTKV)
    grep -a "tiered spill" "$ERRF" | grep -av "block 0x" | tail -n 3 >>"$LOG"
}

REPORT=${OUT:-/tmp}/gpu-tiered-report.txt
: >"$REPORT"
# report NAME STEPS: where the last run's blocks were.
report() {
    { echo "## $1"; "$PYTHON" "$GPU_SRC/tier_report.py" "$ERRF" "$OUTF" "$2" | sed 's/^REPORT //'; } | tee -a "$REPORT" >>"$LOG"
}

# cap_for R: the cap (MiB) that oversubscribes the uncapped run's reserved
# peak ($peak) R times, the context counted.
cap_for() { awk -v c="$CONTEXT_MIB" -v p="$peak" -v r="$1" 'BEGIN { printf "%d", c + p / r }'; }

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", b / a; else print "NA" }'; }

# What the launch hook costs a launch-bound program (scripts/gpu/launch_cost.cu:
# an empty kernel with four pointers into tiered blocks, launched 200000
# times a round): without the shim, with the shim and spill off (the hooks
# are not handed out), and tiered; side by side, each the median of 5 rounds.
CUDA_ARCH=${CUDA_ARCH:-sm_90}
find_nvcc
if [ "${LAUNCH_COST:-1}" = 1 ]; then
    if [ -n "$NVCC_BIN" ] && build_cu "$GPU_SRC/launch_cost.cu" "$WORK/launch_cost"; then
        declare -A per
        for m in none off tiered; do
            case $m in
            none) run_cmd "launch-$m" 120 "${BASE[@]}" "$WORK/launch_cost" ;;
            *) run_cmd "launch-$m" 120 "${BASE[@]}" "LD_PRELOAD=$SHIM" VRAMCAP_LIMIT=8GiB "VRAMCAP_SPILL=$m" "$WORK/launch_cost" ;;
            esac
            per[$m]=$(kv median_ns_per_launch "$(result_line "$OUTF" RESULT)")
        done
        extra=$(awk -v a="${per[none]}" -v b="${per[tiered]}" 'BEGIN { if (a > 0 && b > 0) printf "%.0f", b - a; else print "NA" }')
        ok=1
        awk -v e="$extra" 'BEGIN { exit !(e != "NA" && e < 1000) }' || ok=0
        add_row "launch cost: an empty kernel with 4 pointers into tiered blocks, 200000 launches, median of 5 rounds" \
            "tiered adds < 1000 ns a launch (goal); spill off reported" \
            "no shim ${per[none]} ns; shim, spill off ${per[off]} ns ($(ratio "${per[none]}" "${per[off]}")x); tiered ${per[tiered]} ns ($(ratio "${per[none]}" "${per[tiered]}")x, +$extra ns)" \
            "$(verdict)"
    else
        add_row "launch cost" "launch_cost.cu builds" "nvcc ${NVCC_BIN:-not found}; see the log" FAIL
    fi
fi

# The batched copies tiered spill gates (scripts/gpu/batch_copy.cu): the
# runtime's cudaMemcpyBatchAsync, and the driver's cuMemcpyBatchAsync as
# resolved for CUDA 12.8 and for 13.0, on tiered blocks; each answered by
# the shim and every byte copied.
if [ "${BATCH_COPY:-1}" = 1 ]; then
    if [ -n "$NVCC_BIN" ] && build_cu "$GPU_SRC/batch_copy.cu" "$WORK/batch_copy"; then
        run_cmd batch-copy 120 "${BASE[@]}" "LD_PRELOAD=$SHIM" VRAMCAP_LIMIT=8GiB VRAMCAP_SPILL=tiered "$WORK/batch_copy"
        line=$(result_line "$OUTF" RESULT)
        ok=1
        [ "$RC" = 0 ] && [ "$(kv lib12080 "$line")" = libvramcap.so ] && [ "$(kv lib13000 "$line")" = libvramcap.so ] || ok=0
        [ "$(kv libarray "$line")" = libvramcap.so,libvramcap.so ] && [ "$(kv liblaunch "$line")" = libvramcap.so,libvramcap.so,libvramcap.so ] || ok=0
        add_row "batched copies on tiered blocks: cudaMemcpyBatchAsync, cuMemcpyBatchAsync for 12.8 and 13.0; cuMemcpyDtoA and cuMemcpyAtoD through an array; who answers cuLaunch, cuLaunchGrid, cuLaunchGridAsync" \
            "every byte copied by each; the driver's forms answered by the shim (libvramcap.so)" \
            "rc=$RC; ${line:-no result}" "$(verdict)"
    else
        add_row "batched copies" "batch_copy.cu builds" "nvcc ${NVCC_BIN:-not found}; see the log" FAIL
    fi
fi

# A block only a CUDA graph's kernel uses (scripts/gpu/graph_heat.cu): it
# starts on the host past a cap of the context plus 512 MiB, and is
# promoted only if the graph's launches count as its uses; its data must
# survive the moves under the running graph.
if [ "${GRAPH_HEAT:-1}" = 1 ]; then
    if [ -n "$NVCC_BIN" ] && build_cu "$GPU_SRC/graph_heat.cu" "$WORK/graph_heat"; then
        for how in instantiated updated; do
            args=(8)
            [ $how = updated ] && args+=(update)
            run_cmd "graph-heat-$how" 120 "${BASE[@]}" "LD_PRELOAD=$SHIM" "VRAMCAP_LIMIT=$((CONTEXT_MIB + 512))MiB" VRAMCAP_SPILL=tiered VRAMCAP_LOG=debug "$WORK/graph_heat" "${args[@]}"
            line=$(result_line "$OUTF" RESULT)
            moves=$(grep -a "tiered spill, device" "$ERRF" | grep -c "promoted")
            ok=1
            [ "$RC" = 0 ] && [ "$(kv verify "$line")" = ok ] || ok=0
            awk -v f="$(kv first_ms "$line")" -v l="$(kv last_ms "$line")" 'BEGIN { exit !(f > 0 && l > 0 && l * 4 < f) }' || ok=0
            ((moves > 0)) || ok=0
            what="the executable graph instantiated from it"
            [ $how = updated ] && what="the executable graph updated to it (cudaGraphExecUpdate) from one whose kernel used another block"
            add_row "graph heat: a 192 MiB block on the host that only a CUDA graph's kernel uses, $what; cap $((CONTEXT_MIB + 512)) MiB" \
                "promoted (a launch of the graph 4x faster at the end than at the start); every element right" \
                "rc=$RC; ${line:-no result}; rounds that moved: $moves" "$(verdict)"
        done
    else
        add_row "graph heat" "graph_heat.cu builds" "nvcc ${NVCC_BIN:-not found}; see the log" FAIL
    fi
fi

# capped MODEL R CAP MODE LABEL RUN SHIM REF_LINE GOAL [ARGS...]: one capped
# run of check_tiered.py (with ARGS) and its row, against REF_LINE (an
# uncapped run of the same program); GOAL: the step-time goal or none.
capped() {
    local model=$1 r=$2 cap=$3 mode=$4 label=$5 run=$6 shim=$7 ref=$8 goal=$9
    shift 9
    local steps=$STEPS ok want got mp slow ref_ms moves
    ref_ms=$(kv ms_per_step "$ref")
    [ "$mode" = host ] && steps=6
    TRAIN_ARGS=("$@")
    train "$run" "$model" "$steps" "LD_PRELOAD=$shim" "VRAMCAP_LIMIT=${cap}MiB" "VRAMCAP_SPILL=$mode" VRAMCAP_SPILL_LIMIT=12GiB VRAMCAP_LOG=debug
    TRAIN_ARGS=()
    [ "$mode" = tiered ] && report "$model at ${r}x, $label" "$steps"
    if [ "${PROFILE:-0}" = 1 ]; then
        { echo "## kernels: $model at ${r}x, $label"; "$PYTHON" "$GPU_SRC/kernel_delta.py" "$WORK/kernels-$REF_RUN.txt" "$WORK/kernels-$run.txt" | sed 's/^REPORT //'; } | tee -a "$REPORT" >>"$LOG"
    fi
    ok=1
    [ -n "$line" ] && [ "$(kv oom "$line")" = 0 ] || ok=0
    want=$(kv losses "$ref")
    got=$(kv losses "$line")
    [ "$mode" = host ] && want=$(printf '%s' "$want" | cut -d, -f1-"$steps")
    [ -n "$got" ] && [ "$got" = "$want" ] || ok=0
    mp=$(kv max_proc_mib "$line")
    isint "$mp" && ((mp <= cap)) || ok=0
    slow=$(ratio "$ref_ms" "$(kv ms_per_step "$line")")
    if [ "$mode" = tiered ] && [ "$goal" != none ]; then
        awk -v s="$slow" -v g="$goal" 'BEGIN { exit !(s != "NA" && s <= g) }' || ok=0
    fi
    # Against the unchanged program uncapped too, when this one is changed.
    local also=""
    if [ $# -gt 0 ]; then
        also=" = $(ratio "$ORIG_MS" "$(kv ms_per_step "$line")")x of the unchanged program uncapped ($ORIG_MS ms)"
    fi
    moves=$(grep -a "tiered spill, device" "$ERRF" | grep -c "promoted")
    add_row "$model at ${r}x: cap ${cap} MiB, VRAMCAP_SPILL=$label" \
        "losses identical at every step; NVML process max <= cap$([ "$mode" = tiered ] && [ "$goal" != none ] && echo "; step <= ${goal}x uncapped")" \
        "rc=$RC; $(kv ms_per_step "$line") ms/step (${slow}x of $ref_ms$also), first timed step $(kv first_ms "$line") ms; losses $([ "$got" = "$want" ] && echo identical || echo "DIFFER: $(printf '%s' "$got" | cut -c1-80)"); NVML process max ${mp:-?} MiB; GPU used max $(kv max_dev_used_mib "$line") MiB; torch reserved peak $(kv peak_reserved_mib "$line") MiB; rounds that moved: $moves" \
        "$(verdict)"
}

# The program changes PROGRAMS names, as check_tiered.py arguments.
program_args() {
    local p=$1 part
    local -a args=()
    for part in ${p//+/ }; do
        case $part in
        save_on_cpu) args+=(--save-on-cpu) ;;
        fused) args+=(--fused-adamw) ;;
        cuda_graph) args+=(--cuda-graph) ;;
        expandable) args+=(--expandable-segments) ;;
        *) return 1 ;;
        esac
    done
    printf '%s\n' "${args[@]}"
}
PROGRAMS=${PROGRAMS:-}
[ "${SAVE_ON_CPU:-0}" = 1 ] && PROGRAMS="save_on_cpu $PROGRAMS"
for p in $PROGRAMS; do
    program_args "$p" >/dev/null || {
        echo "gpu-tiered.sh: PROGRAMS=\"$PROGRAMS\": \"$p\" is not a program change (use save_on_cpu, fused, cuda_graph or expandable, or several joined by +, e.g. PROGRAMS=\"save_on_cpu fused save_on_cpu+fused cuda_graph expandable\")" >&2
        exit 2
    }
done

for model in ${MODELS:-llama mlp}; do
    train "$model-ref" "$model" "$STEPS"
    ref=$line
    REF_RUN=$model-ref
    peak=$(kv peak_reserved_mib "$ref")
    ref_ms=$(kv ms_per_step "$ref")
    ORIG_MS=$ref_ms
    if ! isint "$peak" || [ "$(kv oom "$ref")" != 0 ]; then
        add_row "$model, uncapped" "runs" "rc=$RC; ${ref:-no result}" FAIL
        continue
    fi
    add_row "$model, uncapped (the reference)" "runs; reserved peak and step time" \
        "reserved peak $peak MiB, allocated peak $(kv peak_allocated_mib "$ref") MiB; $ref_ms ms/step; NVML process max $(kv max_proc_mib "$ref") MiB" PASS
    first=1
    for r in ${RATIOS:-1.5 1.25 1.1}; do
        cap=$(cap_for "$r")
        goal=none
        case $r in 1.5) goal=3 ;; 1.1) goal=1.3 ;; esac
        capped "$model" "$r" "$cap" tiered tiered "$model-tiered-$r" "$SHIM" "$ref" "$goal"
        for v in ${VARIANTS:-}; do
            shim=${v#*=}
            if [ -f "$shim" ]; then
                capped "$model" "$r" "$cap" tiered "tiered, build ${v%%=*}" "$model-tiered-$r-${v%%=*}" "$shim" "$ref" "$goal"
            else
                add_row "$model at ${r}x, tiered, build ${v%%=*}" "the build is there" "no file $shim" FAIL
            fi
        done
        if [ "${HOST_SPILL:-0}" = 1 ] && [ $first = 1 ]; then
            capped "$model" "$r" "$cap" host host "$model-host-$r" "$SHIM" "$ref" none
        fi
        first=0
    done
    # Placement by hand (HOST_STATE): no shim, no cap, the same losses.
    for h in ${HOST_STATE:-}; do
        mib=${h%%:*}
        order=avg
        [ "$h" != "$mib" ] && order=${h#*:}
        if ! isint "$mib" || { [ "$order" != avg ] && [ "$order" != sq ]; }; then
            add_row "$model, AdamW state on the host by hand: HOST_STATE entry \"$h\"" "MIB or MIB:sq, e.g. HOST_STATE=\"1185 1185:sq\"" "not run" FAIL
            continue
        fi
        TRAIN_ARGS=(--host-state "$mib" --host-order "$order")
        train "$model-hand-$mib-$order" "$model" "$STEPS"
        TRAIN_ARGS=()
        ok=1
        [ -n "$line" ] && [ "$(kv oom "$line")" = 0 ] && [ "$(kv losses "$line")" = "$(kv losses "$ref")" ] || ok=0
        moved=$(kv host_state_mib "$line")
        isint "$moved" && ((moved > 0)) || ok=0
        add_row "$model, no shim, no cap: ${mib} MiB of AdamW state ($([ "$order" = avg ] && echo "exp_avg first" || echo "exp_avg_sq first")) moved into pinned host memory by the program after its first step" \
            "losses identical; the step against uncapped reported (the floor of zero-copy placement of these bytes; at R the host holds $peak x (1 - 1/R) MiB)" \
            "rc=$RC; ${moved:-?} MiB moved; $(kv ms_per_step "$line") ms/step ($(ratio "$ref_ms" "$(kv ms_per_step "$line")")x of $ref_ms); losses $([ "$(kv losses "$line")" = "$(kv losses "$ref")" ] && echo identical || echo DIFFER); NVML process max $(kv max_proc_mib "$line") MiB" \
            "$(verdict)"
    done
    # Changed programs (PROGRAMS): each against an uncapped run of its own
    # (its losses) and the unchanged program's uncapped time, under the
    # same caps as the unchanged program. The goals are for programs as
    # they are, so none applies.
    for p in $PROGRAMS; do
        mapfile -t pargs < <(program_args "$p")
        TRAIN_ARGS=("${pargs[@]}")
        train "$model-$p-ref" "$model" "$STEPS"
        TRAIN_ARGS=()
        pref=$line
        REF_RUN=$model-$p-ref
        if [ -z "$pref" ] || [ "$(kv oom "$pref")" != 0 ]; then
            add_row "$model, program $p, uncapped" "runs" "rc=$RC; ${pref:-no result}" FAIL
            continue
        fi
        add_row "$model, program $p, uncapped" "runs; reserved peak and step time" \
            "reserved peak $(kv peak_reserved_mib "$pref") MiB; $(kv ms_per_step "$pref") ms/step ($(ratio "$ORIG_MS" "$(kv ms_per_step "$pref")")x of the unchanged program); NVML process max $(kv max_proc_mib "$pref") MiB" PASS
        for r in ${PROGRAM_RATIOS:-${RATIOS:-1.5 1.25 1.1}}; do
            cap=$(cap_for "$r")
            capped "$model" "$r" "$cap" tiered "tiered, program $p" "$model-$p-$r" "$SHIM" "$pref" none "${pargs[@]}"
            for v in ${VARIANTS:-}; do
                shim=${v#*=}
                if [ -f "$shim" ]; then
                    capped "$model" "$r" "$cap" tiered "tiered, program $p, build ${v%%=*}" "$model-$p-$r-${v%%=*}" "$shim" "$pref" none "${pargs[@]}"
                else
                    add_row "$model at ${r}x, program $p, build ${v%%=*}" "the build is there" "no file $shim" FAIL
                fi
            done
        done
    done
done
gpu_report
