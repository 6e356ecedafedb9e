#!/usr/bin/env bash
# gpu-held.sh DIR — issue 12: under VRAMCAP_LIMIT=CAP a process never holds
# more of the GPU than CAP as NVML counts it for the process (its CUDA
# context, stream-ordered pools and graph memory included).
#
# DIR holds libvramcap.so and vramcap (and COMMIT), e.g. .gpu/. Builds
# scripts/gpu/held.cu with nvcc and runs each scenario (held.cu, held.py) as
# a process of its own under `timeout`, most with
#   LD_PRELOAD=DIR/libvramcap.so VRAMCAP_LIMIT=$CAP
# Each scenario stops where it holds what is to be measured, prints
# "HOLDING pid=P what=TAG free=F total=T" (its own cudaMemGetInfo) and blocks
# on stdin; this script then reads the process's figure with
#   nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory
# (from outside, without the shim) and answers with a line. A PID that NVML
# does not list fails its row. Every process sees only the first GPU
# (CUDA_VISIBLE_DEVICES=its UUID). Prints a markdown table last; the full log
# goes to ${OUT:-/tmp}/gpu-held.log, the table also to ${OUT:-/tmp}/gpu-held.md.
# Exits 1 if any row fails; a row that could not run is a FAIL.
#
# Environment:
#   CAP           the cap (default 4GiB, read by `DIR/vramcap size`; 1..16 GiB)
#   MIN_FILL_MIB  what each fill must reach at least (default CAP - 1096 MiB,
#                 i.e. 3000 MiB at 4 GiB), so a row cannot pass by refusing all
#   PYTHON        python with torch/jax/cupy (default python3)
#   NVCC, CUDA_ARCH (default sm_90), OUT, KEEP_WORK=1 as for gpu-check.sh
#   CU_TIMEOUT    per-process timeout of the CUDA scenarios (default 60 s)
#   PY_TIMEOUT    per-process timeout of the Python ones (default 120 s)
#   BUDGET_S      no new process starts after this many seconds (default 240);
#                 the rows not run are FAIL

set -u

NAME=gpu-held
# shellcheck source-path=SCRIPTDIR source=gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu/lib.sh"
gpu_args 29 "$@"
gpu_setup "$1"
CAP=${CAP:-4GiB}
CUDA_ARCH=${CUDA_ARCH:-sm_90}
CU_TIMEOUT=${CU_TIMEOUT:-60}
PY_TIMEOUT=${PY_TIMEOUT:-120}
BUDGET_S=${BUDGET_S:-240}

# ---------------------------------------------------------------- setup

if [ ! -x "$CLI" ]; then
    echo "$NAME: $CLI is missing or not executable (it reads CAP='$CAP')" >&2
    exit 2
fi
CAP_BYTES=$(env -u LD_PRELOAD -u VRAMCAP_LIMIT "$CLI" size "$CAP") || CAP_BYTES=""
if ! isint "$CAP_BYTES"; then
    echo "$NAME: cannot parse CAP='$CAP' with '$CLI size'" >&2
    exit 2
fi
if ((CAP_BYTES < GiB || CAP_BYTES > 16 * GiB)); then
    echo "$NAME: CAP=$CAP ($CAP_BYTES bytes) outside 1 GiB..16 GiB (safety rule)" >&2
    exit 2
fi
CAP_MIB=$((CAP_BYTES / MiB))
MIN_FILL_MIB=${MIN_FILL_MIB:-$((CAP_MIB > 1096 ? CAP_MIB - 1096 : 0))}
need_whole " of seconds" CU_TIMEOUT PY_TIMEOUT BUDGET_S
need_whole " of MiB" MIN_FILL_MIB
need_timeout
MIN_FILL=$((MIN_FILL_MIB * MiB))

gpu_commit
gpu_smi
HEADER="vramcap gpu-held — $(date -u '+%Y-%m-%d %H:%M:%S UTC') — commit $COMMIT — GPU $GPU_NAME, driver $GPU_DRIVER — CAP=$CAP ($CAP_BYTES bytes), NVML per-process figure <= $CAP_MIB MiB"
{
    echo "$HEADER"
    echo "artefacts: $ART"
    ls -l "$ART" 2>&1
    echo "PYTHON=$PYTHON ($(command -v "$PYTHON" 2>/dev/null || echo 'not found'))"
    echo "GPU0_UUID=${GPU0_UUID:-none} MIN_FILL_MIB=$MIN_FILL_MIB"
    echo "host: $(uname -a)"
    if [ -n "$NVSMI" ]; then timeout 30 "$NVSMI" 2>&1; else echo "nvidia-smi not found"; fi
} >>"$LOG"
progress "$HEADER"

UNSET=(-u LD_PRELOAD -u VRAMCAP_LIMIT -u VRAMCAP_COUNT -u VRAMCAP_CONTEXT
    -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF
    -u XLA_PYTHON_CLIENT_PREALLOCATE -u XLA_PYTHON_CLIENT_MEM_FRACTION -u XLA_PYTHON_CLIENT_ALLOCATOR
    -u XLA_CLIENT_MEM_FRACTION -u CUPY_GPU_MEMORY_LIMIT)
PIN=()
[ -n "$GPU0_UUID" ] && PIN=("CUDA_VISIBLE_DEVICES=$GPU0_UUID")
NOSHIM=(env "${UNSET[@]}" "${PIN[@]}")
WITHSHIM=(env "${UNSET[@]}" "${PIN[@]}" "LD_PRELOAD=$SHIM" "VRAMCAP_LIMIT=$CAP")

HAVE_SHIM=0
[ -f "$SHIM" ] && [ -r "$SHIM" ] && HAVE_SHIM=1
add_row "artefacts present" "libvramcap.so and vramcap in DIR" \
    "libvramcap.so: $([ "$HAVE_SHIM" = 1 ] && echo yes || echo MISSING), vramcap: yes" \
    "$([ "$HAVE_SHIM" = 1 ] && echo PASS || echo FAIL)"

# ---------------------------------------------------------------- NVML from outside

# nvml_of PID : MiB that nvidia-smi (no shim) lists for PID on the first GPU
# (summed if listed more than once), "missing" when not listed, "n/a" when
# the figure is not a number, "error" when nvidia-smi fails.
nvml_of() {
    local pid=$1 q
    if [ -z "$NVSMI" ]; then
        echo error
        return
    fi
    if ! q=$(env "${UNSET[@]}" timeout 20 "$NVSMI" --query-compute-apps=pid,gpu_uuid,used_memory \
        --format=csv,noheader,nounits 2>&1); then
        printf 'nvidia-smi failed: %s\n' "$q" >>"$LOG"
        echo error
        return
    fi
    printf 'nvidia-smi --query-compute-apps (for pid %s):\n%s\n' "$pid" "$q" >>"$LOG"
    printf '%s\n' "$q" | awk -F', *' -v p="$pid" -v u="$GPU0_UUID" '
        $1 == p && (u == "" || $2 == u) { n++; if ($3 ~ /^[0-9]+$/) s += $3; else bad = 1 }
        END { if (!n) print "missing"; else if (bad) print "n/a"; else print s }'
}

# held_run NAME TIMEOUT CMD... : CMD under timeout, its stdin and stdout
# through fifos: each "HOLDING pid=P what=TAG ..." line it prints is answered
# (one line on its stdin) after NVML's figure for P was read, recorded in its
# output as "NVML what=TAG pid=P used_mib=U". Sets RC, OUTF, ERRF, NOTRUN as
# run_cmd does (everything goes to the log).
held_run() {
    local name=$1 to left t0 line u fin fout cpid eof=0 rrc
    run_begin "$@" || return 0
    to=$RUN_TO
    t0=$RUN_T0
    shift 2
    rm -f "$WORK/$name.in" "$WORK/$name.pipe"
    if ! mkfifo "$WORK/$name.in" "$WORK/$name.pipe"; then
        RC=126
        echo "mkfifo failed" >>"$ERRF"
        return
    fi
    t0=$SECONDS
    timeout -k 10 "$to" "$@" <"$WORK/$name.in" >"$WORK/$name.pipe" 2>"$ERRF" &
    cpid=$!
    # The child opens its stdin, then its stdout: open them in that order.
    exec {fin}>"$WORK/$name.in"
    exec {fout}<"$WORK/$name.pipe"
    while :; do
        left=$((to + 15 - (SECONDS - t0)))
        ((left > 0)) || break
        line=""
        IFS= read -r -t "$left" -u "$fout" line
        rrc=$?
        if [ "$rrc" != 0 ]; then
            [ -n "$line" ] && printf '%s\n' "$line" >>"$OUTF"
            ((rrc > 128)) || eof=1 # else the reading ran out of time
            break
        fi
        printf '%s\n' "$line" >>"$OUTF"
        case $line in
            "HOLDING "*)
                u=$(nvml_of "$(kv pid "$line")")
                printf 'NVML what=%s pid=%s used_mib=%s\n' "$(kv what "$line")" "$(kv pid "$line")" "$u" >>"$OUTF"
                progress "  $name holds at $(kv what "$line"): NVML $(nvml_text "$u")"
                # The child may be gone: no SIGPIPE for this shell.
                (
                    trap '' PIPE
                    echo go >&"$fin"
                ) 2>/dev/null
                ;;
        esac
    done
    exec {fin}>&-
    if [ "$eof" = 0 ]; then
        echo "gpu-held: no end of output within ${to}+15 s: stopping the process" >>"$ERRF"
        kill "$cpid" 2>/dev/null
    fi
    exec {fout}<&-
    wait "$cpid"
    RC=$?
    rm -f "$WORK/$name.in" "$WORK/$name.pipe"
    run_end "$name" "stdout (with the NVML lines of this script)"
}

# holds_obs : "TAG: NVML U MiB (own view free F / total T); ..." for the last process.
holds_obs() {
    local l what="" view="" out=""
    while IFS= read -r l; do
        case $l in
            "HOLDING "*)
                what=$(kv what "$l")
                view="own view free $(mib "$(kv free "$l")") / total $(mib "$(kv total "$l")")"
                ;;
            "NVML "*)
                out="$out${out:+; }$what: NVML $(nvml_text "$(kv used_mib "$l")") ($view)"
                ;;
        esac
    done <"$OUTF"
    printf '%s' "${out:-no hold reached}"
}

# want_nvml [TAG...] : the last process reached a hold (each TAG among them)
# and every NVML figure is a number <= CAP_MIB; otherwise ok=0.
want_nvml() {
    local l u n=0 tag
    while IFS= read -r l; do
        case $l in
            "NVML "*)
                n=$((n + 1))
                u=$(kv used_mib "$l")
                if ! isint "$u" || ((u > CAP_MIB)); then ok=0; fi
                ;;
        esac
    done <"$OUTF"
    ((n > 0)) || ok=0
    for tag in "$@"; do
        grep -aq "^NVML what=$tag " "$OUTF" || ok=0
    done
}

# nvml_at TAG : the NVML figure recorded at hold TAG (empty if none).
nvml_at() { kv used_mib "$(grep -a "^NVML what=$1 " "$OUTF" | tail -n 1)"; }

# nvml_text U : "U MiB", or U itself when it is not a number (missing, n/a, error)
nvml_text() { if isint "${1:-}"; then printf '%s MiB' "$1"; else printf '%s' "${1:-none}"; fi; }

# note for the observed column: abnormal exit, ERROR line, stderr's first line
run_note() {
    local n e
    n=$(rc_note)
    [ -n "$n" ] || [ "$RC" = 0 ] || n="rc=$RC"
    [ "$RC" = 3 ] && n="$n (module or GPU backend missing)"
    e=$(grep -a '^ERROR' "$OUTF" | head -n 1 | cut -c1-160)
    [ -n "$e" ] && n="${n:+$n; }$e"
    if [ "$RC" != 0 ] && [ -z "$e" ] && [ -s "$ERRF" ]; then
        n="${n:+$n; }stderr: $(grep -av '^\s*$' "$ERRF" | tail -n 1 | cut -c1-160)"
    fi
    printf '%s' "$n"
}

# ---------------------------------------------------------------- build

find_nvcc
HELD=""
if [ -z "$NVCC_BIN" ] || [ ! -x "$NVCC_BIN" ]; then
    add_row "build held.cu" "nvcc builds it" "nvcc not found (set NVCC)" FAIL
else
    progress "building held with $NVCC_BIN"
    if build_cu "$GPU_SRC/held.cu" "$WORK/held"; then
        HELD=$WORK/held
        add_row "build held.cu" "nvcc builds it" "ok ($CUDA_ARCH)" PASS
    else
        add_row "build held.cu" "nvcc builds it" "build failed (see log)" FAIL
    fi
fi

# cu_held NAME MODE ENV... : held.cu MODE under ENV (NOSHIM or WITHSHIM
# words); sets line (its RESULT line), note, and ok (0 already when the
# program did not run to its end). Returns 1 (row to be written as not run)
# when held.cu did not build.
cu_held() {
    local name=$1 mode=$2
    shift 2
    line=""
    note="held.cu did not build"
    ok=0
    [ -n "$HELD" ] || return 1
    held_run "$name" "$CU_TIMEOUT" "$@" "$HELD" "$mode" "$CAP_BYTES"
    line=$(result_line "$OUTF" RESULT)
    note=$(run_note)
    ok=1
    [ "$RC" = 0 ] && [ -n "$line" ] || ok=0
}

# py_held NAME MODE ENV... : held.py MODE the same way (its RESULTKV line).
py_held() {
    local name=$1 mode=$2
    shift 2
    line=""
    ok=0
    if ! command -v "$PYTHON" >/dev/null 2>&1; then
        note="python ($PYTHON) not found"
        return 1
    fi
    held_run "$name" "$PY_TIMEOUT" "$@" "$PYTHON" "$GPU_SRC/held.py" "$mode" --cap "$CAP_BYTES"
    line=$(result_line "$OUTF" RESULTKV)
    note=$(run_note)
    [ -n "$line" ] || note="${note:+$note; }no RESULTKV line"
    ok=1
    [ "$RC" = 0 ] && [ -n "$line" ] || ok=0
}

row() { add_row "$1" "$2" "${note:+$note; }$3" "$(verdict)"; }

# view_used LINE : total - free of LINE, in MiB ("?" when not both numbers)
view_used() {
    local t f
    t=$(kv total "$1")
    f=$(kv free "$1")
    if isint "$t" && isint "$f" && ((t >= f)); then mib $((t - f)); else printf '?'; fi
}

# ---------------------------------------------------------------- 11. footprints, uncapped

exp="ran; NVML lists the process (figures recorded, not judged)"
if cu_held footprint-cuda footprint "${NOSHIM[@]}"; then
    u=$(nvml_at context)
    isint "$u" || ok=0
    obs="bare context after cudaFree(0): NVML $(nvml_text "$u"), own view total-free $(view_used "$line"); default pool granule (1-byte cudaMallocAsync, ReservedMemCurrent grows by) $(mib "$(kv pool_granule "$line")"); graph granule (1-byte alloc node, cudaGraphMemAttrReservedMemCurrent grows by) $(mib "$(kv graph_granule "$line")")"
else
    obs="not run"
fi
row "footprint, nvcc program, no shim (measurement)" "$exp" "$obs"

# ---------------------------------------------------------------- 5. start

START_TOTAL=""
exp="cudaMemGetInfo after the context: total = $CAP_MIB MiB exactly, free < total (context counted); NVML <= $CAP_MIB MiB"
if cu_held start start "${WITHSHIM[@]}"; then
    t=$(kv total "$line")
    f=$(kv free "$line")
    START_TOTAL=$t
    want_kv total "$CAP_BYTES"
    if ! isint "$f" || ! isint "$t" || ((f >= t)); then ok=0; fi
    want_nvml context
    obs="total=$t ($(mib "$t")) free=$f ($(mib "$f")), counted before any allocation $(view_used "$line"); NVML $(nvml_text "$(nvml_at context)")"
else
    obs="not run"
fi
row "start: cudaMemGetInfo under the cap" "$exp" "$obs"

# ---------------------------------------------------------------- 1/2. fills

fill_row() { # ROWNAME NAME MODE TAG
    local rowname=$1 name=$2 mode=$3 tag=$4 exp obs extra=""
    exp="refused (err=2) at the end, got >= $MIN_FILL_MIB MiB, NVML <= $CAP_MIB MiB while holding"
    if cu_held "$name" "$mode" "${WITHSHIM[@]}"; then
        want_kv stop refused
        want_kv err 2
        want_in bytes "$MIN_FILL"
        want_nvml "$tag"
        [ "$mode" = fill-async ] && extra=" pool_reserved=$(mib "$(kv pool_reserved "$line")")"
        obs="got $(mib "$(kv bytes "$line")") in $(kv chunks "$line") chunks, refusals=$(kv refusals "$line") err=$(kv err "$line")($(kv errname "$line")) stop=$(kv stop "$line")$extra; $(holds_obs)"
    else
        obs="not run"
    fi
    row "$rowname" "$exp" "$obs"
}
fill_row "cudaMalloc fill (1 GiB chunks halving to 2 MiB)" fill-malloc fill-malloc filled
fill_row "cudaMallocAsync fill (default pool, release threshold UINT64_MAX)" fill-async fill-async filled-async

# ---------------------------------------------------------------- 3. pool

exp="cudaMallocAsync 70% of free-at-start ok; after cudaFreeAsync+sync (pool retains) cudaMalloc 90% of free-at-start refused (err=2); after cudaMemPoolTrimTo(0) the same cudaMalloc ok; NVML <= $CAP_MIB MiB at both holds"
if cu_held pool pool "${WITHSHIM[@]}"; then
    want_kv async_err 0
    want_kv sync cudaSuccess
    want_kv before_trim_err 2
    want_kv trim cudaSuccess
    want_kv after_trim_err 0
    want_nvml retained after-trim
    obs="free at start $(mib "$(kv free0 "$line")"); async $(mib "$(kv async_bytes "$line")") err=$(kv async_err "$line"); pool retained $(mib "$(kv retained "$line")"), own view free then $(mib "$(kv free_retained "$line")"); cudaMalloc $(mib "$(kv malloc_bytes "$line")") before trim err=$(kv before_trim_err "$line")($(kv before_trim_errname "$line")); trim $(kv trim "$line"), pool reserved after $(mib "$(kv reserved_after_trim "$line")"), free $(mib "$(kv free_after_trim "$line")"); after trim err=$(kv after_trim_err "$line")($(kv after_trim_errname "$line")); $(holds_obs)"
else
    obs="not run"
fi
row "pool retains, trim gives back" "$exp" "$obs"

# ---------------------------------------------------------------- 4. halves

exp="total T: cudaMalloc(T/2) ok, a second cudaMalloc(T/2) refused (err=2); NVML <= $CAP_MIB MiB"
if cu_held halves halves "${WITHSHIM[@]}"; then
    want_kv first_err 0
    want_kv second_err 2
    want_nvml halves
    obs="T=$(mib "$(kv total "$line")"); first err=$(kv first_err "$line")($(kv first_errname "$line")), free after $(mib "$(kv free_after_first "$line")"); second err=$(kv second_err "$line")($(kv second_errname "$line")); $(holds_obs)"
else
    obs="not run"
fi
row "two halves of the reported total" "$exp" "$obs"

# ---------------------------------------------------------------- 6/7. graphs

graph_row() { # ROWNAME NAME MODE
    local rowname=$1 name=$2 mode=$3 exp obs at
    exp="with 3/8 CAP held, a graph allocating 3/4 CAP refused at instantiate or launch (err=2); NVML <= $CAP_MIB MiB; after freeing it and cudaDeviceGraphMemTrim the launch succeeds, NVML <= $CAP_MIB MiB"
    if cu_held "$name" "$mode" "${WITHSHIM[@]}"; then
        at=$(kv run1_at "$line")
        want_kv build_at none
        [ "$at" = instantiate ] || [ "$at" = launch ] || ok=0
        want_kv run1_err 2
        want_kv run2_at none
        want_kv run2_err 0
        want_nvml graph-refused graph-ran
        obs="held $(mib "$(kv first_bytes "$line")"), graph $(mib "$(kv graph_bytes "$line")"); build at=$(kv build_at "$line") err=$(kv build_errname "$line"); first run failed at=$at err=$(kv run1_err "$line")($(kv run1_errname "$line")), graph reserved $(mib "$(kv graph_reserved1 "$line")"); trim $(kv trim "$line"); second run at=$(kv run2_at "$line") err=$(kv run2_err "$line")($(kv run2_errname "$line")), graph reserved $(mib "$(kv graph_reserved2 "$line")"); $(holds_obs)"
    else
        obs="not run"
    fi
    row "$rowname" "$exp" "$obs"
}
graph_row "graph by stream capture (cudaMallocAsync, kernel, cudaFreeAsync)" graph-capture graph-capture
graph_row "explicit graph (mem alloc node, kernel node, mem free node)" graph-explicit graph-explicit

# ---------------------------------------------------------------- 11b. PyTorch footprint, uncapped

exp="ran; NVML lists the process (figures recorded, not judged)"
if py_held footprint-torch torch-footprint "${NOSHIM[@]}"; then
    u=$(nvml_at context)
    isint "$u" || ok=0
    r=$(kv reserved "$line")
    ctx="?"
    isint "$u" && isint "$r" && ctx=$(mib $((u * MiB - r)))
    obs="after torch.zeros(1): NVML $(nvml_text "$u"), torch reserved $(mib "$r"), so context ~ $ctx; own view total-free $(view_used "$line")"
else
    obs="not run"
fi
row "footprint, PyTorch, no shim (measurement)" "$exp" "$obs"

# ---------------------------------------------------------------- 8/9/10. frameworks

# fw_row ROWNAME NAME MODE MINBYTES [VAR=VALUE...] : a held.py fill under the
# shim: exit 0, ended on the framework's out-of-memory error, >= MINBYTES,
# NVML <= CAP while holding.
fw_row() {
    local rowname=$1 name=$2 mode=$3 minb=$4 exp obs extra=""
    shift 4
    exp="out-of-memory error at the end, got >= $(mib "$minb"), NVML <= $CAP_MIB MiB while holding"
    case "$*" in *backend:cudaMallocAsync*) exp="$exp, allocator backend cudaMallocAsync" ;; esac
    if py_held "$name" "$mode" "${WITHSHIM[@]}" "$@"; then
        want_kv oom 1
        want_in bytes "$minb"
        want_nvml filled
        case "$*" in *backend:cudaMallocAsync*) want_kv alloc_backend_async 1 ;; esac
        case $mode in
            torch) extra=" allocated=$(mib "$(kv allocated "$line")") reserved=$(mib "$(kv reserved "$line")") backend_async=$(kv alloc_backend_async "$line")" ;;
            jax) extra=" bytes_limit=$(mib "$(kv bytes_limit "$line")") bytes_in_use=$(mib "$(kv bytes_in_use "$line")")" ;;
            cupy) extra=" pool_total=$(mib "$(kv pool_total_bytes "$line")")" ;;
        esac
        obs="got $(mib "$(kv bytes "$line")") ($(kv chunks "$line") x 64 MiB) oom=$(kv oom "$line")$extra; $(holds_obs)"
    else
        obs="not run"
    fi
    row "$rowname" "$exp" "$obs"
}

fw_row "PyTorch default allocator, 64 MiB tensors" torch torch "$MIN_FILL"
fw_row "PyTorch expandable_segments:True" torch-expandable torch "$MIN_FILL" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
fw_row "PyTorch backend:cudaMallocAsync" torch-async torch "$MIN_FILL" PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync

# JAX preallocates 75% of what it is told is there as soon as it starts:
# only under a cap the start row saw in force.
rowname="JAX default (preallocation), 64 MiB jnp.zeros until RESOURCE_EXHAUSTED"
if isint "$START_TOTAL" && ((START_TOTAL > 0 && START_TOTAL <= CAP_BYTES)); then
    fw_row "$rowname" jax jax $((CAP_BYTES / 2))
else
    add_row "$rowname" "RESOURCE_EXHAUSTED at the end, NVML <= $CAP_MIB MiB" \
        "not run: the start row did not see the cap in force (total=${START_TOTAL:-none}), and JAX would preallocate 75% of the real GPU" FAIL
fi

fw_row "CuPy default pool, 64 MiB arrays" cupy cupy "$MIN_FILL"
fw_row "CuPy MemoryAsyncPool" cupy-async cupy-async "$MIN_FILL"

# ---------------------------------------------------------------- report

gpu_report
