#!/usr/bin/env bash
# gpu-check.sh DIR — real-GPU checks for vramcap.
#
# DIR holds the built artefacts libvramcap.so and vramcap (e.g. .gpu/).
# Builds the CUDA test programs from scripts/gpu/ with nvcc into a temp dir and
# runs every check as a fresh process under a timeout, mostly with
#   LD_PRELOAD=$(realpath DIR)/libvramcap.so VRAMCAP_LIMIT=$CAP
# Prints a markdown table at the end; the full log goes to ${OUT:-/tmp}/gpu-check.log
# (the table also to ${OUT:-/tmp}/gpu-check.md). Exits 1 if any check fails; a
# check that could not run counts as a failure.
#
# Environment:
#   CAP         cap to test (default 4GiB), read by `DIR/vramcap size`; 1..16 GiB
#   PYTHON      python with torch/jax/cupy (default python3)
#   NVCC        nvcc to use (default /usr/local/cuda/bin/nvcc, else nvcc on PATH)
#   CUDA_ARCH   default sm_90
#   OUT         output folder (default /tmp)
#   CU_TIMEOUT  per-process timeout for CUDA test programs (default 120 s)
#   PY_TIMEOUT  per-process timeout for Python checks (default 180 s)
#   BUDGET_S    stop starting new checks after this many seconds (default 540);
#               checks not started are reported as FAIL
#   KEEP_WORK=1 keep the temp build/output folder

set -u

NAME=gpu-check
# shellcheck source-path=SCRIPTDIR source=gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu/lib.sh"
gpu_args 24 "$@"
gpu_setup "$1"
CAP=${CAP:-4GiB}
CUDA_ARCH=${CUDA_ARCH:-sm_90}
CU_TIMEOUT=${CU_TIMEOUT:-120}
PY_TIMEOUT=${PY_TIMEOUT:-180}
BUDGET_S=${BUDGET_S:-540}

CHUNK=$((256 * MiB))
# What the counted context may take of the cap (VRAMCAP_COUNT=held, the
# default): a bare context is 518 MiB in NVML on the H200, PyTorch's 610.
CTX_ALLOW=$((768 * MiB))

# ---------------------------------------------------------------- setup

# CAP in bytes, read by vramcap itself (the grammar of VRAMCAP_LIMIT's sizes).
if [ ! -x "$CLI" ]; then
    echo "gpu-check: $CLI is missing or not executable (it reads CAP='$CAP')" >&2
    exit 2
fi
CAP_BYTES=$(env -u LD_PRELOAD -u VRAMCAP_LIMIT "$CLI" size "$CAP") || CAP_BYTES=""
if ! isint "$CAP_BYTES"; then
    echo "gpu-check: cannot parse CAP='$CAP' with '$CLI size' (use whole bytes or N KiB/MiB/GiB)" >&2
    exit 2
fi
if ((CAP_BYTES < GiB || CAP_BYTES > 16 * GiB)); then
    echo "gpu-check: CAP=$CAP ($CAP_BYTES bytes) outside 1 GiB..16 GiB (safety rule)" >&2
    exit 2
fi
need_whole " of seconds" CU_TIMEOUT PY_TIMEOUT BUDGET_S

gpu_commit
gpu_smi
DATE_UTC=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
HEADER="vramcap gpu-check — $DATE_UTC — commit $COMMIT — GPU $GPU_NAME, driver $GPU_DRIVER — CAP=$CAP ($CAP_BYTES bytes)"

{
    echo "$HEADER"
    echo "artefacts: $ART"
    ls -l "$ART" 2>&1
    echo "PYTHON=$PYTHON ($(command -v "$PYTHON" 2>/dev/null || echo 'not found'))"
    echo "host: $(uname -a)"
    if [ -n "$NVSMI" ]; then timeout 30 "$NVSMI" 2>&1; else echo "nvidia-smi not found"; fi
} >>"$LOG"
progress "$HEADER"

UNSET=(-u LD_PRELOAD -u VRAMCAP_LIMIT -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF
    -u XLA_PYTHON_CLIENT_PREALLOCATE -u XLA_PYTHON_CLIENT_MEM_FRACTION -u XLA_PYTHON_CLIENT_ALLOCATOR
    -u XLA_CLIENT_MEM_FRACTION -u CUPY_GPU_MEMORY_LIMIT)
NOSHIM=(env "${UNSET[@]}")
WITHSHIM=(env "${UNSET[@]}" "LD_PRELOAD=$SHIM" "VRAMCAP_LIMIT=$CAP")
NOLIMIT=(env "${UNSET[@]}" "LD_PRELOAD=$SHIM")

HAVE_SHIM=0
[ -f "$SHIM" ] && [ -r "$SHIM" ] && HAVE_SHIM=1
need_timeout

# ---------------------------------------------------------------- e. CLI and limit parsing

add_row "artefacts present" "libvramcap.so and vramcap in DIR" \
    "libvramcap.so: $([ "$HAVE_SHIM" = 1 ] && echo yes || echo MISSING), vramcap: $([ -x "$CLI" ] && echo yes || echo MISSING)" \
    "$([ "$HAVE_SHIM" = 1 ] && [ -x "$CLI" ] && echo PASS || echo FAIL)"

if [ -x "$CLI" ]; then
    run_cmd cli-version 30 "${NOSHIM[@]}" "$CLI" --version
    note=$(rc_note)
    if [ "$RC" = 0 ]; then res=PASS; else res=FAIL; fi
    add_row "vramcap --version" "exit 0" "rc=$RC ${note:+($note) }$(first_line "$OUTF" 60)" "$res"
else
    add_row "vramcap --version" "exit 0" "vramcap missing or not executable" FAIL
fi

run_cmd shim-bad-limit 30 env "${UNSET[@]}" "LD_PRELOAD=$SHIM" VRAMCAP_LIMIT=8XB true
note=$(rc_note)
if [ "$RC" = 2 ] && grep -aq VRAMCAP_LIMIT "$ERRF"; then res=PASS; else res=FAIL; fi
add_row "VRAMCAP_LIMIT=8XB true" "exit 2, stderr names VRAMCAP_LIMIT" \
    "rc=$RC ${note:+($note) }stderr: $(first_line "$ERRF" 100)" "$res"

run_cmd shim-good-limit 30 "${WITHSHIM[@]}" true
note=$(rc_note)
if [ "$RC" = 0 ]; then res=PASS; else res=FAIL; fi
add_row "VRAMCAP_LIMIT=$CAP true" "exit 0 (non-CUDA program unaffected)" \
    "rc=$RC ${note:+($note) }stderr: $(first_line "$ERRF" 80 || true)$([ -s "$ERRF" ] || echo '(empty)')" "$res"

# ---------------------------------------------------------------- build

find_nvcc
build_capcheck

# cu_run NAME CMD... : a CUDA test program; sets line (its RESULT line), note,
# and ok (0 already when the exit status is not 0).
cu_run() {
    local name=$1
    shift
    run_cmd "$name" "$CU_TIMEOUT" "$@"
    line=$(result_line "$OUTF" RESULT)
    note=$(rc_note)
    ok=1
    [ "$RC" = 0 ] || ok=0
}

# ---------------------------------------------------------------- a/f. info rows

REAL_TOTAL=""
REAL_PROPS=""
info_obs() {
    local line=$1
    echo "total=$(mib "$(kv total "$line")") props=$(mib "$(kv props_total "$line")") cu_total=$(mib "$(kv cu_total "$line")") cu_devtotal=$(mib "$(kv cu_devtotal "$line")") free=$(mib "$(kv free "$line")")"
}
info_row() { add_row "$1" "$2" "${note:+$note; }${line:+$(info_obs "$line") }rc=$RC" "$res"; }

if [ -n "$CAPCHECK" ]; then
    cu_run capcheck-info-noshim "${NOSHIM[@]}" "$CAPCHECK" info
    t=$(kv total "$line")
    p=$(kv props_total "$line")
    if [ "$RC" = 0 ] && isint "$t" && isint "$p" && ((t > CAP_BYTES && p > CAP_BYTES)); then
        res=PASS
        REAL_TOTAL=$t
        REAL_PROPS=$p
    else
        res=FAIL
    fi
    info_row "capcheck info, no shim (baseline)" "rc=0, real totals > CAP"
    if [ "$GPU_NAME" = unknown ]; then
        n=$(grep -a '^INFO device_name=' "$OUTF" 2>/dev/null | head -n 1 | sed 's/^INFO device_name="\([^"]*\)".*/\1/')
        [ -n "$n" ] && GPU_NAME="$n (from CUDA)"
        HEADER="vramcap gpu-check — $DATE_UTC — commit $COMMIT — GPU $GPU_NAME, driver $GPU_DRIVER — CAP=$CAP ($CAP_BYTES bytes)"
    fi

    cu_run capcheck-info-cap "${WITHSHIM[@]}" "$CAPCHECK" info
    want_kv total "$CAP_BYTES"
    want_kv props_total "$CAP_BYTES"
    res=$(verdict)
    info_row "capcheck info, CAP" "cudaMemGetInfo total = totalGlobalMem = CAP ($(mib "$CAP_BYTES"))"

    cu_run capcheck-info-nolimit "${NOLIMIT[@]}" "$CAPCHECK" info
    want_kv total "$REAL_TOTAL"
    want_kv props_total "$REAL_PROPS"
    res=$(verdict)
    if [ -z "$REAL_TOTAL" ]; then
        res=FAIL
        note="${note:+$note; }no baseline to compare with"
    fi
    info_row "capcheck info, shim without VRAMCAP_LIMIT" "totals = baseline ($(mib "$REAL_TOTAL"))"
else
    add_row "capcheck info, no shim (baseline)" "rc=0, real totals > CAP" "not built" FAIL
    add_row "capcheck info, CAP" "totals = CAP" "not built" FAIL
    add_row "capcheck info, shim without VRAMCAP_LIMIT" "totals = baseline" "not built" FAIL
fi

# ---------------------------------------------------------------- a. allocation loops

alloc_obs() {
    local line=$1
    printf 'bytes=%s err=%s(%s) stop=%s total=%s free=%s' \
        "$(mib "$(kv bytes "$line")")" "$(kv err "$line")" "$(kv errname "$line")" \
        "$(kv stop "$line")" "$(mib "$(kv total "$line")")" "$(mib "$(kv free "$line")")"
}

# VERIFY state of the last process: ok, bad or none.
verify_state() { grep_state '^VERIFY ok$' ok '^VERIFY' bad; }

if [ -n "$CAPCHECK" ]; then
    # Baseline without the shim: the program itself must reach its 6 GiB hard stop.
    cu_run capcheck-cudaMalloc-noshim "${NOSHIM[@]}" "$CAPCHECK" cudaMalloc $((6 * GiB))
    vs=$(verify_state)
    want_kv bytes $((6 * GiB))
    want_kv stop limit
    [ "$vs" = ok ] || ok=0
    add_row "capcheck cudaMalloc, no shim, stop 6 GiB" "bytes=6144 MiB (hard stop), VERIFY ok, rc=0" \
        "${note:+$note; }${line:+$(alloc_obs "$line") }verify=$vs rc=$RC" "$(verdict)"
else
    add_row "capcheck cudaMalloc, no shim, stop 6 GiB" "bytes=6144 MiB (hard stop), VERIFY ok, rc=0" "not built" FAIL
fi

MANAGED_LOOP_MAX=$((6 * GiB - 256 * MiB)) # what capcheck clamps managed memory to
for mode in cudaMalloc cuMemAlloc cudaMallocPitch cudaMallocManaged; do
    rowname="capcheck $mode, CAP"
    exp="$(mib $((CAP_BYTES - CHUNK - CTX_ALLOW))) < bytes <= $(mib "$CAP_BYTES") (the context counted), err=2"
    [ "$mode" = cudaMalloc ] && exp="$exp, total=CAP"
    exp="$exp, VERIFY ok, rc=0"
    if [ -z "$CAPCHECK" ]; then
        add_row "$rowname" "$exp" "not built" FAIL
        continue
    fi
    maxb=$((CAP_BYTES + GiB))
    extra=""
    if [ "$mode" = cudaMallocManaged ]; then
        ((maxb > 6 * GiB)) && maxb=$((6 * GiB))
    fi
    cu_run "capcheck-$mode-cap" "${WITHSHIM[@]}" "$CAPCHECK" "$mode" "$maxb"
    vs=$(verify_state)
    want_in bytes $((CAP_BYTES - CHUNK - CTX_ALLOW + 1)) "$CAP_BYTES"
    want_kv err 2
    if [ "$mode" = cudaMalloc ]; then want_kv total "$CAP_BYTES"; fi
    [ "$vs" = ok ] || ok=0
    [ -n "$line" ] || ok=0
    if [ "$mode" = cudaMallocManaged ] && (((CAP_BYTES / CHUNK + 1) * CHUNK > MANAGED_LOOP_MAX)); then
        extra="CAP too large for the managed 6 GiB safety stop; "
    fi
    if [ "$mode" = cudaMallocPitch ] && [ -n "$line" ]; then
        extra="${extra}pitch=$(kv pitch "$line") "
    fi
    add_row "$rowname" "$exp" "${note:+$note; }${extra}${line:+$(alloc_obs "$line") }verify=$vs rc=$RC" "$(verdict)"
done

# ---------------------------------------------------------------- a2. more allocation paths

# TOUCH state of the last process: ok, bad (a bad or error line) or none.
touch_state() { grep_state '^TOUCH \(bad\|error\)' bad '^TOUCH ok' ok; }
# Modes that also write and read back the memory they got (TOUCH line).
has_touch() { case $1 in cuMemCreate | cudaMallocArray | cudaMalloc3DArray) return 0 ;; esac; return 1; }
is_array() { case $1 in cudaMallocArray | cudaMalloc3DArray) return 0 ;; esac; return 1; }
# Mode-specific figures for the observed column.
mode_extra() {
    local mode=$1 line=$2
    case $mode in
        cudaMallocAsync | cudaMemPool) printf 'pool_reserved=%s errat=%s ' "$(mib "$(kv pool_reserved "$line")")" "$(kv errat "$line")" ;;
        cuMemCreate) printf 'granularity=%s mapped=%s ' "$(mib "$(kv granularity "$line")")" "$(kv mapped "$line")" ;;
        cudaMallocArray | cudaMalloc3DArray) printf 'first_delta=%s ' "$(mib "$(kv first_delta "$line")")" ;;
    esac
}

NEW_MODES=(cudaMallocAsync cudaMemPool cuMemCreate cudaMallocArray cudaMalloc3DArray)

# new_mode_row MODE noshim|cap : one run of capcheck MODE and its row.
# Without the shim each new path must reach a 1 GiB hard stop: shows that the
# program itself works, so a failure with the shim is the shim's. For arrays,
# first_delta is the driver's real size of one array (drop of free memory).
# With the cap: stop within one chunk below CAP (arrays: two chunks, as the
# driver's real array size may be a bit more than the 256 MiB counted), refused
# with err 2, and the process still healthy.
new_mode_row() {
    local mode=$1 with=$2 row exp lo vs ts tobs=""
    if [ "$with" = noshim ]; then
        row="capcheck $mode, no shim, stop 1 GiB"
        exp="bytes=1024 MiB (hard stop)"
    else
        lo=$((CAP_BYTES - CHUNK - CTX_ALLOW))
        is_array "$mode" && lo=$((CAP_BYTES - 2 * CHUNK - CTX_ALLOW))
        row="capcheck $mode, CAP"
        exp="$(mib "$lo") < bytes <= $(mib "$CAP_BYTES"), err=2 (stop=refused)"
    fi
    has_touch "$mode" && exp="$exp, TOUCH ok"
    exp="$exp, VERIFY ok, rc=0"
    if [ -z "$CAPCHECK" ]; then
        add_row "$row" "$exp" "not built" FAIL
        return
    fi
    if [ "$with" = noshim ]; then
        cu_run "capcheck-$mode-noshim" "${NOSHIM[@]}" "$CAPCHECK" "$mode" "$GiB"
        want_kv bytes "$GiB"
        want_kv stop limit
    else
        cu_run "capcheck-$mode-cap" "${WITHSHIM[@]}" "$CAPCHECK" "$mode" $((CAP_BYTES + GiB))
        want_in bytes $((lo + 1)) "$CAP_BYTES"
        want_kv err 2
        want_kv stop refused
    fi
    vs=$(verify_state)
    ts=$(touch_state)
    [ -n "$line" ] || ok=0
    [ "$vs" = ok ] || ok=0
    if has_touch "$mode" && [ "$ts" != ok ]; then ok=0; fi
    has_touch "$mode" && tobs="touch=$ts "
    add_row "$row" "$exp" "${note:+$note; }${line:+$(mode_extra "$mode" "$line")$(alloc_obs "$line") }${tobs}verify=$vs rc=$RC" "$(verdict)"
}
for mode in "${NEW_MODES[@]}"; do new_mode_row "$mode" noshim; done
for mode in "${NEW_MODES[@]}"; do new_mode_row "$mode" cap; done

# ---------------------------------------------------------------- b/c/d. Python frameworks

PY_OK=1
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    PY_OK=0
fi

# py_obs LINE KEYS... : common observed text for a Python check
py_obs() {
    local line=$1 k v out=""
    shift
    for k in "$@"; do
        v=$(kv "$k" "$line")
        case "$k" in
            total | bytes | allocated | reserved | bytes_limit | bytes_reserved | pool_used_bytes | pool_total_bytes | total_at_oom | free_at_oom | used | free | torch_total | total_v2 | used_v2)
                v=$(mib "$v")
                ;;
        esac
        out="$out$k=${v:-?} "
    done
    printf '%s' "$out"
}

py_note() {
    # Extra words when a Python check did not complete.
    local n
    n=$(rc_note)
    if [ -z "$n" ] && [ "$RC" = 3 ]; then n="module missing or no GPU backend (rc=3)"; fi
    if [ -z "$n" ] && [ "$RC" != 0 ]; then n="rc=$RC, see log"; fi
    if [ -z "$(result_line "$OUTF" RESULTKV)" ]; then n="${n:+$n; }no RESULT line"; fi
    printf '%s' "$n"
}

# py_run ROW EXPECTED NAME SCRIPT [VAR=VALUE...] [-- ARGS...] : runs
# PYTHON scripts/gpu/SCRIPT ARGS under the shim with CAP and the VARs; sets
# line (its RESULTKV line), note, and ok (0 already when the exit status is
# not 0). Without python or SCRIPT the row is FAIL and it returns 1.
py_run() {
    local row=$1 exp=$2 name=$3 script=$4
    local -a vars=()
    shift 4
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        vars+=("$1")
        shift
    done
    [ $# -gt 0 ] && shift
    if [ "$PY_OK" != 1 ] || [ ! -r "$GPU_SRC/$script" ]; then
        add_row "$row" "$exp" "python ($PYTHON) or $script not found" FAIL
        return 1
    fi
    run_cmd "$name" "$PY_TIMEOUT" "${WITHSHIM[@]}" "${vars[@]}" "$PYTHON" "$GPU_SRC/$script" "$@"
    line=$(result_line "$OUTF" RESULTKV)
    note=$(py_note)
    ok=1
    [ "$RC" = 0 ] || ok=0
}

# py_row ROW EXPECTED KEYS... : the row of the last py_run, KEYS observed
py_row() { add_row "$1" "$2" "${note:+$note; }$(py_obs "$line" "${@:3}")" "$(verdict)"; }

LOW=$((CAP_BYTES - GiB))
MAXB=$((CAP_BYTES + GiB)) # the hard stop of the allocation loops

# b. PyTorch, and (b3) with another allocator configuration (PYTORCH_CUDA_ALLOC_CONF):
# same pass criteria, plus a sign that the setting took effect.
torch_row() { # ROW NAME [CONF]
    local row=$1 name=$2 conf=${3:-} exp
    local -a vars=() keys=(total oom allocated reserved matmul_ok)
    exp="total=CAP, OutOfMemoryError, CAP-1GiB <= allocated <= CAP, matmul ok"
    case $conf in
        *expandable_segments*) exp="$exp, segments expandable (expandable_seen != 0)" ;;
        *cudaMallocAsync*) exp="$exp, allocator backend cudaMallocAsync" ;;
    esac
    if [ -n "$conf" ]; then
        vars=("PYTORCH_CUDA_ALLOC_CONF=$conf")
        keys+=(alloc_backend_async expandable_seen expandable_segments)
    fi
    py_run "$row" "$exp" "$name" check_torch.py "${vars[@]}" -- --max-bytes "$MAXB" || return
    want_kv total "$CAP_BYTES"
    want_kv oom 1
    want_in allocated "$LOW" "$CAP_BYTES"
    want_kv matmul_ok 1
    case $conf in
        *expandable_segments*) [ "$(kv expandable_seen "$line")" != 0 ] || ok=0 ;;
        *cudaMallocAsync*) want_kv alloc_backend_async 1 ;;
    esac
    py_row "$row" "$exp" "${keys[@]}"
}
torch_row torch torch

# b2. PyTorch under `vramcap run`, counters read with `vramcap stat --json` while it runs
exp="stat USED >= torch.cuda.memory_reserved(), extra (USED - context - reserved) <= 256 MiB, limit=CAP"
if [ "$PY_OK" = 1 ] && [ -r "$GPU_SRC/check_torch_stat.py" ]; then
    run_cmd torch-stat "$PY_TIMEOUT" env -u LD_PRELOAD -u VRAMCAP_LIMIT -u PYTORCH_CUDA_ALLOC_CONF -u PYTORCH_ALLOC_CONF \
        "VRAMCAP_STATS_DIR=$WORK/stats" "$CLI" run --limit "$CAP" -- "$PYTHON" "$GPU_SRC/check_torch_stat.py" "$CLI"
    line=$(result_line "$OUTF" RESULTKV)
    note=$(py_note)
    u=$(kv used "$line")
    rv=$(kv reserved "$line")
    x=$(kv extra "$line")
    ok=1
    [ "$RC" = 0 ] || ok=0
    isint "$u" && isint "$rv" && ((u >= rv)) || ok=0
    want_in extra 0 $((256 * MiB))
    want_kv limit "$CAP_BYTES"
    want_kv cmd_ok 1
    add_row "torch under vramcap run + vramcap stat" "$exp" "${note:+$note; }used=$(mib "$u") reserved=$(mib "$rv") allocated=$(mib "$(kv allocated "$line")") context=$(mib "$(kv context "$line")") extra=$((${x:-0} / 1024)) KiB allocs=$(kv allocs "$line")" "$(verdict)"
else
    add_row "torch under vramcap run + vramcap stat" "$exp" "python ($PYTHON) or check_torch_stat.py not found" FAIL
fi

# d. CuPy, with its default pool and (d2) the stream-ordered allocator (MemoryAsyncPool)
cupy_row() { # ROW NAME MODE KEYS...
    local row=$1 name=$2 mode=$3
    shift 3
    exp="memGetInfo total=CAP, OutOfMemoryError, CAP-1GiB <= bytes <= CAP, compute ok"
    if [ "$mode" = async ]; then
        py_run "$row" "$exp" "$name" check_cupy.py -- --mode async --max-bytes "$MAXB" || return
        want_kv async_pool 1
    else
        py_run "$row" "$exp" "$name" check_cupy.py -- --max-bytes "$MAXB" || return
    fi
    want_kv total "$CAP_BYTES"
    want_kv oom 1
    want_in bytes "$LOW" "$CAP_BYTES"
    want_kv compute_ok 1
    py_row "$row" "$exp" "$@"
}
cupy_row cupy cupy default total oom bytes pool_total_bytes roundtrip_ok kernel_ok compute_ok

# c. JAX, default allocator and preallocation
JLO=$((CAP_BYTES / 2))
JHI=$((CAP_BYTES * 3 / 4 + 64 * MiB))
exp="$(mib "$JLO") <= bytes_limit <= $(mib "$JHI"), compute ok"
if py_run "jax default (preallocate)" "$exp" jax-default check_jax.py -- default; then
    want_in bytes_limit "$JLO" "$JHI"
    want_kv compute_ok 1
    py_row "jax default (preallocate)" "$exp" bytes_limit bytes_reserved compute_ok
fi

# jax_loop ROW NAME MODE SEEN VAR=VALUE... : JAX's allocation loop (platform or
# growth) with the VARs set, which the script must see (SEEN=1): an exception
# that says out of memory, CAP-1GiB <= bytes <= CAP, the computation right after.
jax_loop() {
    local row=$1 name=$2 mode=$3 seen=$4
    shift 4
    py_run "$row" "$exp" "$name" check_jax.py "$@" -- "$mode" --max-bytes "$MAXB" || return
    want_kv "$seen" 1
    want_kv exception_raised 1
    want_kv exception_resource_exhausted 1
    want_in bytes "$LOW" "$CAP_BYTES"
    want_kv compute_ok 1
    return 0
}

# c. JAX, platform allocator
exp="exception with RESOURCE_EXHAUSTED/out of memory, CAP-1GiB <= bytes <= CAP, compute ok"
row="jax XLA_PYTHON_CLIENT_ALLOCATOR=platform"
jax_loop "$row" jax-platform platform env_allocator_is_platform XLA_PYTHON_CLIENT_ALLOCATOR=platform &&
    py_row "$row" "$exp" exception_raised exception_resource_exhausted bytes compute_ok

# ---------------------------------------------------------------- b2/c2/d2. more framework allocators

torch_row "torch PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" torch-expandable "expandable_segments:True"
torch_row "torch PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync" torch-async "backend:cudaMallocAsync"

cupy_row "cupy MemoryAsyncPool" cupy-async async total oom bytes pool_total_bytes other_error_status roundtrip_ok kernel_ok compute_ok

# c2. JAX, default BFC allocator without preallocation (grows on demand).
# MEM_FRACTION=1.0 makes the BFC limit the whole (capped) total: with the
# default 0.75 XLA itself would stop at 0.75*CAP, below CAP-1GiB.
exp="XLA_PYTHON_CLIENT_PREALLOCATE=false seen, exception with RESOURCE_EXHAUSTED/out of memory, CAP-1GiB <= bytes <= CAP, compute ok"
row="jax XLA_PYTHON_CLIENT_PREALLOCATE=false (BFC grows, MEM_FRACTION=1.0)"
jax_loop "$row" jax-growth growth env_preallocate_is_false XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=1.0 &&
    py_row "$row" "$exp" exception_raised exception_resource_exhausted bytes bytes_limit compute_ok

# e2. numba-cuda device arrays
exp="exception with CUDA_ERROR_OUT_OF_MEMORY (2), CAP-1GiB <= bytes <= CAP, round trip and @cuda.jit kernel ok (a device-to-device copy where numba's JIT cannot load)"
if py_run "numba-cuda device_array" "$exp" numba check_numba.py -- --max-bytes "$MAXB"; then
    want_kv exception_raised 1
    want_kv oom_error 1
    want_in bytes "$LOW" "$CAP_BYTES"
    want_kv compute_ok 1
    py_row "numba-cuda device_array" "$exp" total exception_raised exception_code oom_error bytes roundtrip_ok kernel_ok jit_unavailable d2d_ok compute_ok
fi

# f2. NVML memory info of a capped process (CUDA initialised by torch, 1 GiB held)
exp="nvmlDeviceGetMemoryInfo(0): total=CAP, 1 GiB <= used <= CAP; torch mem_get_info total = NVML total"
if py_run "NVML nvmlDeviceGetMemoryInfo" "$exp" nvml check_nvml.py -- --hold-bytes "$GiB"; then
    t=$(kv total "$line")
    want_kv total "$CAP_BYTES"
    want_in used "$GiB" "$CAP_BYTES"
    [ -n "$t" ] && [ "$(kv torch_total "$line")" = "$t" ] || ok=0
    add_row "NVML nvmlDeviceGetMemoryInfo" "$exp" \
        "${note:+$note; }nvml_via=$(grep -a '^RESULT ' "$OUTF" | tail -n 1 | sed -n 's/.*"nvml_via": "\([a-z]*\)".*/\1/p') $(py_obs "$line" total used free torch_total total_v2 used_v2)" "$(verdict)"
fi

# ---------------------------------------------------------------- cache (freed-block cache)

CACHE_SAFETY=""
CHURN=""
if [ -n "$NVCC_BIN" ] && [ -x "$NVCC_BIN" ]; then
    build_cu "$GPU_SRC/cache_safety.cu" "$WORK/cache_safety" && CACHE_SAFETY=$WORK/cache_safety
    build_cu "$GPU_SRC/churn.cu" "$WORK/churn" && CHURN=$WORK/churn
fi

# The control: a program that itself reuses a block still being written, with
# no wait, must see clobbering, or this check could not detect anything.
exp="clobbered > 0 (the check detects a reuse without waiting)"
if [ -n "$CACHE_SAFETY" ]; then
    cu_run cache-safety-naive "${NOSHIM[@]}" "$CACHE_SAFETY" naive
    want_in clobbered 1
    add_row "cache safety control (program reuses without waiting, no shim)" "$exp" "${line:-no RESULT line} rc=$RC" "$(verdict)"
    for variant in on off; do
        exp="reused=1 with the cache, clobbered=0"
        [ "$variant" = off ] && exp="clobbered=0"
        cu_run "cache-safety-$variant" "${WITHSHIM[@]}" "VRAMCAP_CACHE=$([ "$variant" = on ] && echo 25% || echo off)" "$CACHE_SAFETY" cuda
        want_in clobbered 0 0
        if [ "$variant" = on ]; then want_kv reused 1; fi
        add_row "cache safety: free while a kernel writes, reuse on another stream (cache $variant)" "$exp" "${line:-no RESULT line} rc=$RC" "$(verdict)"
    done
else
    add_row "cache safety" "builds and runs" "cache_safety.cu did not build (see log)" FAIL
fi

# A malloc/free-heavy program: identical results with and without the cache,
# and how much faster the cache makes it.
exp="same checksum without shim, cache off, cache on; speed-up reported"
if [ -n "$CHURN" ]; then
    declare -A CH_MS CH_SUM
    for variant in base off on; do
        case $variant in
            base) run_cmd churn-base "$CU_TIMEOUT" "${NOSHIM[@]}" "$CHURN" 5000 ;;
            off) run_cmd churn-cache-off "$CU_TIMEOUT" "${WITHSHIM[@]}" VRAMCAP_CACHE=off "$CHURN" 5000 ;;
            on) run_cmd churn-cache-on "$CU_TIMEOUT" "${WITHSHIM[@]}" "$CHURN" 5000 ;;
        esac
        line=$(result_line "$OUTF" RESULT)
        CH_MS[$variant]=$(printf '%s\n' "$line" | sed -n 's/.*ms=\([0-9.]*\).*/\1/p')
        CH_SUM[$variant]=$(kv checksum "$line")
    done
    ok=1
    for v in base off on; do isint "${CH_SUM[$v]}" || ok=0; done
    [ "${CH_SUM[base]}" = "${CH_SUM[off]}" ] && [ "${CH_SUM[base]}" = "${CH_SUM[on]}" ] || ok=0
    speed=$(awk -v a="${CH_MS[base]:-0}" -v b="${CH_MS[on]:-0}" 'BEGIN { if (b > 0) printf "%.1fx", a / b; else print "NA" }')
    add_row "churn.cu 5000 iterations (2 cudaMalloc+cudaFree, 3 kernels each)" "$exp" \
        "checksums ${CH_SUM[base]:-?}/${CH_SUM[off]:-?}/${CH_SUM[on]:-?}; ms without shim ${CH_MS[base]:-?}, cache off ${CH_MS[off]:-?}, cache on ${CH_MS[on]:-?} (speed-up $speed)" "$(verdict)"
else
    add_row "churn.cu" "$exp" "churn.cu did not build (see log)" FAIL
fi

# ---------------------------------------------------------------- report

gpu_report
