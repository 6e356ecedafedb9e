#!/usr/bin/env bash
# bench.sh DIR — overhead of the vramcap shim, measured side by side (a benchmark, not a test).
#
# DIR holds libvramcap.so (e.g. .gpu/). Builds scripts/gpu/bench_alloc.cu with nvcc and
# runs, interleaved in ABBA order (without, with; with, without; ...):
#   - bench_alloc: cuMemAlloc_v2+cuMemFree_v2 and cudaMalloc+cudaFree pairs at
#     4 KiB, 1 MiB, 64 MiB, 1 GiB ($ROUNDS rounds of each variant, default 5)
#   - bench_torch.py: MLP training step ($TORCH_ROUNDS rounds of each variant, default 3)
# "with shim" is LD_PRELOAD=$(realpath DIR)/libvramcap.so VRAMCAP_LIMIT=16GiB.
# Reports the median over rounds of each run's figure. Prints a markdown table,
# writes it to ${OUT:-/tmp}/bench.md and the raw output to ${OUT:-/tmp}/bench.log.
#
# Environment: ROUNDS, TORCH_ROUNDS, PYTHON (default python3), NVCC, CUDA_ARCH (sm_90),
#   OUT, BENCH_LIMIT (default 16GiB), BUDGET_S (default 420: no new run starts after it),
#   KEEP_WORK=1 keeps the temp folder.
# Exit status: 0 when every figure was measured for both variants, 1 otherwise.

set -u

NAME=bench
# shellcheck source-path=SCRIPTDIR source=gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu/lib.sh"
gpu_args 18 "$@"
gpu_paths "$1"
ROUNDS=${ROUNDS:-6}
TORCH_ROUNDS=${TORCH_ROUNDS:-4}
CUDA_ARCH=${CUDA_ARCH:-sm_90}
BENCH_LIMIT=${BENCH_LIMIT:-16GiB}
BUDGET_S=${BUDGET_S:-420}
RUN_MIN_LEFT=10 # no run starts with less of the budget left

need_whole "" ROUNDS TORCH_ROUNDS BUDGET_S
case "$BENCH_LIMIT" in
    1GiB | 2GiB | 4GiB | 8GiB | 16GiB) ;;
    *)
        echo "bench: BENCH_LIMIT must be one of 1GiB 2GiB 4GiB 8GiB 16GiB (safety rule: <= 16 GiB)" >&2
        exit 2
        ;;
esac
if [ ! -r "$SHIM" ]; then
    echo "bench: $SHIM not found" >&2
    exit 2
fi

gpu_outputs
gpu_workdir

# ---------------------------------------------------------------- header

gpu_commit
gpu_smi
HEADER="vramcap bench — $(date -u '+%Y-%m-%d %H:%M:%S UTC') — commit $COMMIT — GPU $GPU_NAME, driver $GPU_DRIVER — with shim: VRAMCAP_LIMIT=$BENCH_LIMIT"
{
    echo "$HEADER"
    echo "artefacts: $ART"
    ls -l "$ART" 2>&1
    echo "ROUNDS=$ROUNDS TORCH_ROUNDS=$TORCH_ROUNDS PYTHON=$PYTHON"
    if [ -n "$NVSMI" ]; then timeout 30 "$NVSMI" 2>&1; fi
} >>"$LOG"
progress "$HEADER"

UNSET=(-u LD_PRELOAD -u VRAMCAP_LIMIT -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF)
V_BASE=(env "${UNSET[@]}")
V_SHIM=(env "${UNSET[@]}" "LD_PRELOAD=$SHIM" "VRAMCAP_LIMIT=$BENCH_LIMIT")
# The shim with its counters in private memory instead of the shared page.
V_NOSTATS=(env "${UNSET[@]}" "LD_PRELOAD=$SHIM" "VRAMCAP_LIMIT=$BENCH_LIMIT" "VRAMCAP_STATS=off" "VRAMCAP_CACHE=off")
# The shim without its freed-block cache (V_SHIM has the default settings: cache on).
V_NOCACHE=(env "${UNSET[@]}" "LD_PRELOAD=$SHIM" "VRAMCAP_LIMIT=$BENCH_LIMIT" "VRAMCAP_CACHE=off")
# The shim counting allocations only (as before pools, graphs and the context were counted).
V_ALLOCS=(env "${UNSET[@]}" "LD_PRELOAD=$SHIM" "VRAMCAP_LIMIT=$BENCH_LIMIT" "VRAMCAP_COUNT=allocations")

# run_one NAME TIMEOUT CMD... -> RC, OUTF; raw output goes to the log
run_one() {
    run_cmd "$@"
    [ "$RC" = 0 ] || progress "$1 failed: rc=$RC (see $LOG)"
}

# ---------------------------------------------------------------- build

find_nvcc

BENCH_ALLOC=""
if [ -n "$NVCC_BIN" ] && [ -x "$NVCC_BIN" ] && [ -r "$GPU_SRC/bench_alloc.cu" ]; then
    progress "building bench_alloc with $NVCC_BIN"
    if build_cu "$GPU_SRC/bench_alloc.cu" "$WORK/bench_alloc"; then
        BENCH_ALLOC=$WORK/bench_alloc
    else
        progress "bench_alloc build failed (see $LOG)"
    fi
else
    progress "nvcc ($NVCC_BIN) or bench_alloc.cu not found"
fi

BENCH_AB=""
if [ -n "$NVCC_BIN" ] && [ -x "$NVCC_BIN" ] && [ -r "$GPU_SRC/bench_ab.cu" ]; then
    progress "building bench_ab"
    if timeout 300 "$NVCC_BIN" -O2 -o "$WORK/bench_ab" "$GPU_SRC/bench_ab.cu" -ldl >>"$LOG" 2>&1; then
        BENCH_AB=$WORK/bench_ab
    else
        progress "bench_ab build failed (see $LOG)"
    fi
fi

# ---------------------------------------------------------------- runs

# In-process A/B first: the shim's hooks against the driver's own functions
# in the same process (see bench_ab.cu), with the shim (counters in the
# shared page, and with VRAMCAP_STATS=off) and without it (noise floor).
ABDATA=$WORK/ab.tsv # variant size hooked_median real_median round
: >"$ABDATA"
NFAILRUN=0 # runs that failed, of every part below
if [ -n "$BENCH_AB" ]; then
    for ((r = 1; r <= 3; r++)); do
        for variant in shim nocache nostats base; do
            case $variant in
                base) run_one "bench_ab round $r without shim" 120 "${V_BASE[@]}" "$BENCH_AB" ;;
                shim) run_one "bench_ab round $r with shim (cache on)" 120 "${V_SHIM[@]}" "$BENCH_AB" ;;
                nocache) run_one "bench_ab round $r with shim, VRAMCAP_CACHE=off" 120 "${V_NOCACHE[@]}" "$BENCH_AB" ;;
                nostats) run_one "bench_ab round $r with shim, cache and stats off" 120 "${V_NOSTATS[@]}" "$BENCH_AB" ;;
            esac
            if [ "$RC" = 0 ]; then
                awk -v var="$variant" -v rnd="$r" '/^AB / {
                    for (i = 2; i <= NF; i++) { p = index($i, "="); if (p > 0) m[substr($i, 1, p - 1)] = substr($i, p + 1) }
                    print var "\t" m["size"] "\t" m["hooked_median_us"] "\t" m["real_median_us"] "\t" rnd
                }' "$OUTF" >>"$ABDATA"
            else
                NFAILRUN=$((NFAILRUN + 1))
            fi
        done
    done
fi

DATA=$WORK/data.tsv  # variant  api  size  median_us  mean_us  round
TDATA=$WORK/torch.tsv # variant  ms_per_step  round
INFO=$WORK/info.tsv  # variant  total
: >"$DATA"
: >"$TDATA"
: >"$INFO"

collect_alloc() { # variant round
    awk -v var="$1" -v rnd="$2" '
        /^BENCH api=/ {
            delete m
            for (i = 2; i <= NF; i++) { p = index($i, "="); if (p > 0) m[substr($i, 1, p - 1)] = substr($i, p + 1) }
            if (m["api"] != "" && m["size"] != "" && m["median_us"] != "")
                printf "%s\t%s\t%s\t%s\t%s\t%s\n", var, m["api"], m["size"], m["median_us"], m["mean_us"], rnd
        }' "$OUTF" >>"$DATA"
}
collect_info() { # variant
    awk -v var="$1" '/^INFO total=/ { split($2, a, "="); print var "\t" a[2] }' "$OUTF" >>"$INFO"
}

if [ -n "$BENCH_ALLOC" ]; then
    # ABBA order: odd rounds start without the shim, even rounds with it, so
    # whatever favours the first (or second) process of a pair cancels out.
    for ((r = 1; r <= ROUNDS; r++)); do
        if ((r % 2)); then order=(base nocache allocs shim); else order=(shim allocs nocache base); fi
        for variant in "${order[@]}"; do
            case $variant in
                base) run_one "bench_alloc round $r without shim" 120 "${V_BASE[@]}" "$BENCH_ALLOC" ;;
                shim) run_one "bench_alloc round $r with shim" 120 "${V_SHIM[@]}" "$BENCH_ALLOC" ;;
                allocs) run_one "bench_alloc round $r with shim, VRAMCAP_COUNT=allocations" 120 "${V_ALLOCS[@]}" "$BENCH_ALLOC" ;;
                nocache) run_one "bench_alloc round $r with shim, VRAMCAP_CACHE=off" 120 "${V_NOCACHE[@]}" "$BENCH_ALLOC" ;;
            esac
            if [ "$RC" = 0 ]; then collect_alloc "$variant" "$r"; collect_info "$variant"; else NFAILRUN=$((NFAILRUN + 1)); fi
        done
    done
fi

if command -v "$PYTHON" >/dev/null 2>&1 && [ -r "$GPU_SRC/bench_torch.py" ]; then
    for ((r = 1; r <= TORCH_ROUNDS; r++)); do
        if ((r % 2)); then order=(base allocs shim); else order=(shim allocs base); fi
        for variant in "${order[@]}"; do
            case $variant in
                base) run_one "bench_torch round $r without shim" 180 "${V_BASE[@]}" "$PYTHON" "$GPU_SRC/bench_torch.py" ;;
                allocs) run_one "bench_torch round $r with shim, VRAMCAP_COUNT=allocations" 180 "${V_ALLOCS[@]}" "$PYTHON" "$GPU_SRC/bench_torch.py" ;;
                *) run_one "bench_torch round $r with shim" 180 "${V_SHIM[@]}" "$PYTHON" "$GPU_SRC/bench_torch.py" ;;
            esac
            if [ "$RC" = 0 ]; then
                awk -v var="$variant" -v rnd="$r" '
                    /^BENCH what=torch_mlp_step/ {
                        for (i = 2; i <= NF; i++) if ($i ~ /^ms_per_step=/) { split($i, a, "="); print var "\t" a[2] "\t" rnd }
                    }' "$OUTF" >>"$TDATA"
                collect_info "torch-$variant"
            else
                NFAILRUN=$((NFAILRUN + 1))
            fi
        done
    done
else
    progress "python ($PYTHON) or bench_torch.py not found: no PyTorch figures"
fi

# ---------------------------------------------------------------- report

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "NA"; else if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
# col VARIANT API SIZE FIELD(4=median,5=mean) -> median over rounds
col() { awk -F'\t' -v v="$1" -v a="$2" -v s="$3" -v f="$4" '$1 == v && $2 == a && $3 == s { print $f }' "$DATA" | median; }
nrounds() { awk -F'\t' -v v="$1" -v a="$2" -v s="$3" '$1 == v && $2 == a && $3 == s' "$DATA" | wc -l | tr -d ' '; }
fmt() { awk -v x="$1" -v p="${2:-1}" 'BEGIN { if (x == "NA" || x == "") print "NA"; else printf "%.*f", p, x }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "NA" || b == "NA" || a + 0 == 0) print "NA"; else printf "%.3f", b / a }'; }
delta() { awk -v a="$1" -v b="$2" -v k="${3:-1}" 'BEGIN { if (a == "NA" || b == "NA") print "NA"; else printf "%+.1f", (b - a) * k }'; }
sizename() {
    case "$1" in
        4096) echo "4 KiB" ;;
        1048576) echo "1 MiB" ;;
        67108864) echo "64 MiB" ;;
        1073741824) echo "1 GiB" ;;
        *) echo "$1 B" ;;
    esac
}

abcol() { awk -F'\t' -v v="$1" -v s="$2" -v f="$3" '$1 == v && $2 == s { print $f }' "$ABDATA" | median; }

MISSING=0
{
    echo "$HEADER"
    echo
    echo "In one process, alternating pair by pair: cuMemAlloc_v2+cuMemFree_v2 through the shim's hooks vs the driver's own functions (median µs, median of 3 runs). Without the shim both columns are the driver's (noise floor)."
    echo
    echo "| variant | size | driver's own | through the hooks | ratio | delta µs |"
    echo "|---|---|---|---|---|---|"
    for variant in shim nocache nostats base; do
        case $variant in
            shim) vlabel="shim, defaults (cache on: hooked pairs are cache hits)" ;;
            nocache) vlabel="shim, VRAMCAP_CACHE=off (counters in the shared page)" ;;
            nostats) vlabel="shim, VRAMCAP_CACHE=off VRAMCAP_STATS=off" ;;
            base) vlabel="no shim (A/A)" ;;
        esac
        for size in 4096 1048576 67108864 1073741824; do
            rl=$(abcol "$variant" "$size" 4)
            hk=$(abcol "$variant" "$size" 3)
            [ "$variant" = shim ] && { [ "$rl" = NA ] || [ "$hk" = NA ]; } && MISSING=$((MISSING + 1))
            echo "| $vlabel | $(sizename "$size") | $(fmt "$rl" 2) | $(fmt "$hk" 2) | $(ratio "$rl" "$hk") | $(delta "$rl" "$hk") |"
        done
    done
    echo
    echo "Separate processes (each figure the median over rounds of one process's median; this machine's per-process variation is large, see the A/B table for the shim's own cost):"
    echo
    echo "| what | size | without shim | shim, cache off | shim, cache on | cache off / without | cache on / without |"
    echo "|---|---|---|---|---|---|---|"
    for api in cuMemAlloc cudaMalloc; do
        if [ "$api" = cuMemAlloc ]; then label="cuMemAlloc_v2+cuMemFree_v2 pair, median µs"; else label="cudaMalloc+cudaFree pair, median µs"; fi
        for size in 4096 1048576 67108864 1073741824; do
            a=$(col base "$api" "$size" 4)
            n=$(col nocache "$api" "$size" 4)
            b=$(col shim "$api" "$size" 4)
            { [ "$a" = NA ] || [ "$b" = NA ] || [ "$n" = NA ]; } && MISSING=$((MISSING + 1))
            echo "| $label | $(sizename "$size") | $(fmt "$a" 1) | $(fmt "$n" 1) | $(fmt "$b" 1) | $(ratio "$a" "$n") | $(ratio "$a" "$b") |"
        done
    done
    ta=$(awk -F'\t' '$1 == "base" { print $2 }' "$TDATA" | median)
    tb=$(awk -F'\t' '$1 == "shim" { print $2 }' "$TDATA" | median)
    { [ "$ta" = NA ] || [ "$tb" = NA ]; } && MISSING=$((MISSING + 1))
    echo
    echo "| what | without shim | with shim (defaults) | ratio | delta µs |"
    echo "|---|---|---|---|---|"
    echo "| PyTorch MLP training step (8×Linear(4096), batch 256, AdamW, fp32), ms | $(fmt "$ta" 3) | $(fmt "$tb" 3) | $(ratio "$ta" "$tb") | $(delta "$ta" "$tb" 1000) |"
    tc=$(awk -F'\t' '$1 == "allocs" { print $2 }' "$TDATA" | median)
    echo
    echo "What counting everything held costs: the shim with VRAMCAP_COUNT=held (the default) against VRAMCAP_COUNT=allocations, same runs (medians; ratio held/allocations):"
    echo
    echo "| what | size | allocations only | held (default) | ratio | delta µs |"
    echo "|---|---|---|---|---|---|"
    echo "| PyTorch MLP training step, ms | — | $(fmt "$tc" 3) | $(fmt "$tb" 3) | $(ratio "$tc" "$tb") | $(delta "$tc" "$tb" 1000) |"
    for api in cuMemAlloc cudaMalloc; do
        for size in 4096 1048576 67108864 1073741824; do
            a=$(col allocs "$api" "$size" 4)
            b=$(col shim "$api" "$size" 4)
            echo "| $api pair (cache hit), median µs | $(sizename "$size") | $(fmt "$a" 2) | $(fmt "$b" 2) | $(ratio "$a" "$b") | $(delta "$a" "$b") |"
        done
    done
    echo
    echo "Means (median over rounds of each run's mean, µs):"
    echo
    echo "| what | size | without shim | with shim | ratio (with/without) | delta µs |"
    echo "|---|---|---|---|---|---|"
    for api in cuMemAlloc cudaMalloc; do
        for size in 4096 1048576 67108864 1073741824; do
            a=$(col base "$api" "$size" 5)
            b=$(col shim "$api" "$size" 5)
            echo "| $api pair, mean µs | $(sizename "$size") | $(fmt "$a" 1) | $(fmt "$b" 1) | $(ratio "$a" "$b") | $(delta "$a" "$b") |"
        done
    done
    echo
    echo "Rounds: bench_alloc $(nrounds base cuMemAlloc 4096) without / $(nrounds shim cuMemAlloc 4096) with shim (interleaved);" \
        "PyTorch (ABBA order) $(awk -F'\t' '$1 == "base"' "$TDATA" | wc -l | tr -d ' ') without / $(awk -F'\t' '$1 == "shim"' "$TDATA" | wc -l | tr -d ' ') with."
    for v in base nocache shim torch-base torch-shim; do
        t=$(awk -F'\t' -v v="$v" '$1 == v { print $2 }' "$INFO" | sort -u | tr '\n' ' ')
        echo "cudaMemGetInfo total seen by $v runs: ${t:-none}"
    done
    echo "Failed runs: $NFAILRUN. Elapsed: ${SECONDS}s. Raw data: $LOG"
} >"$WORK/table.md"

# The per-run data, in the log before the table.
# shellcheck disable=SC2317  # called by gpu_table_out
raw_data() {
    echo "=== per-run data (variant api size median_us mean_us round) ==="
    cat "$DATA"
    echo "=== in-process A/B (variant size hooked_median_us real_median_us round) ==="
    cat "$ABDATA"
    echo "=== torch (variant ms_per_step round) ==="
    cat "$TDATA"
}
gpu_table_out raw_data

if [ "$MISSING" = 0 ] && [ "$NFAILRUN" = 0 ]; then exit 0; fi
exit 1
