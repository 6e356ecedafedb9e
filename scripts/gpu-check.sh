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
#   CAP         cap to test (default 4GiB); whole bytes or N K/M/G(i)B (powers of 1024); 1..16 GiB
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

if [ $# -lt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
if [ ! -d "$1" ]; then
    echo "gpu-check: '$1' is not a directory" >&2
    exit 2
fi

ART=$(realpath "$1")
SHIM=$ART/libvramcap.so
CLI=$ART/vramcap
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$SCRIPT_DIR/.." && pwd)
GPU_SRC=$SCRIPT_DIR/gpu
CAP=${CAP:-4GiB}
PYTHON=${PYTHON:-python3}
OUT=${OUT:-/tmp}
CUDA_ARCH=${CUDA_ARCH:-sm_90}
CU_TIMEOUT=${CU_TIMEOUT:-120}
PY_TIMEOUT=${PY_TIMEOUT:-180}
BUDGET_S=${BUDGET_S:-540}

MiB=1048576
GiB=1073741824
CHUNK=$((256 * MiB))

mkdir -p "$OUT" || { echo "gpu-check: cannot create OUT=$OUT" >&2; exit 2; }
LOG=$OUT/gpu-check.log
MD=$OUT/gpu-check.md
: >"$LOG" || { echo "gpu-check: cannot write $LOG" >&2; exit 2; }

progress() { echo "[gpu-check] $*" >&2; echo "[gpu-check] $*" >>"$LOG"; }

# ---------------------------------------------------------------- helpers

# parse_size STR -> bytes on stdout; plain bytes or K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB,
# any case, all powers of 1024 (as vramcap's own size grammar reads them).
parse_size() {
    local s=$1 num unit mult
    if [[ $s =~ ^([0-9]+)[[:space:]]*([A-Za-z]*)$ ]]; then
        num=${BASH_REMATCH[1]}
        unit=${BASH_REMATCH[2]}
    else
        return 1
    fi
    case "${unit,,}" in
        "" | b) mult=1 ;;
        k | kb | kib) mult=1024 ;;
        m | mb | mib) mult=$MiB ;;
        g | gb | gib) mult=$GiB ;;
        t | tb | tib) mult=$((1024 * GiB)) ;;
        *) return 1 ;;
    esac
    # Refuse absurdly long numbers before bash arithmetic can overflow.
    [ ${#num} -le 15 ] || return 1
    echo $((10#$num * mult))
}

isint() { [[ ${1:-} =~ ^[0-9]+$ ]]; }

# mib BYTES -> "4096 MiB" (one decimal when not a whole number of MiB)
mib() {
    local b=${1:-}
    if ! isint "$b"; then
        printf '%s' "${b:-?}"
    elif ((b % MiB == 0)); then
        printf '%d MiB' $((b / MiB))
    else
        awk -v b="$b" 'BEGIN { printf "%.1f MiB", b / 1048576 }'
    fi
}

# kv KEY LINE -> value of " KEY=value" in a space-separated line (empty if absent)
kv() {
    local key=$1 line=" ${2:-} "
    local re=" ${key}=([^ ]*) "
    if [[ $line =~ $re ]]; then printf '%s' "${BASH_REMATCH[1]}"; fi
}

# last line of FILE that starts with "PREFIX "
result_line() { grep -a "^$2 " "$1" 2>/dev/null | tail -n 1; }

ROWS_NAME=()
ROWS_EXP=()
ROWS_OBS=()
ROWS_RES=()
NFAIL=0
add_row() {
    ROWS_NAME+=("$1")
    ROWS_EXP+=("$2")
    ROWS_OBS+=("$3")
    ROWS_RES+=("$4")
    [ "$4" = PASS ] || NFAIL=$((NFAIL + 1))
    echo "RESULT-ROW | $1 | $2 | $3 | $4" >>"$LOG"
    echo "[gpu-check]   -> $4: $3" >&2
}

# Remaining time for a check; 0 when the budget is spent.
time_left() {
    local left=$((BUDGET_S - SECONDS))
    ((left > 0)) && echo "$left" || echo 0
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || { echo "gpu-check: mktemp failed" >&2; exit 2; }
# shellcheck disable=SC2317  # called through trap
cleanup() { if [ "${KEEP_WORK:-0}" != 1 ]; then rm -rf "$WORK"; fi; }
trap cleanup EXIT

# run_cmd NAME TIMEOUT CMD... : runs CMD under timeout with stdin from /dev/null.
# Sets RC, OUTF, ERRF, and NOTRUN=1 when the time budget was already spent.
RC=0
OUTF=/dev/null
ERRF=/dev/null
NOTRUN=0
run_cmd() {
    local name=$1 to=$2 left t0
    shift 2
    OUTF=$WORK/$name.out
    ERRF=$WORK/$name.err
    : >"$OUTF"
    : >"$ERRF"
    NOTRUN=0
    left=$(time_left)
    if ((left < 5)); then
        NOTRUN=1
        RC=125
        progress "$name: not run (time budget of ${BUDGET_S}s spent)"
        return
    fi
    ((to > left)) && to=$left
    progress "running $name (timeout ${to}s)"
    {
        echo
        echo "=== $name ==="
        echo "start: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        printf 'cmd:'
        printf ' %q' "$@"
        echo
    } >>"$LOG"
    t0=$SECONDS
    timeout -k 10 "$to" "$@" >"$OUTF" 2>"$ERRF" </dev/null
    RC=$?
    {
        echo "rc: $RC (wall $((SECONDS - t0)) s)"
        echo "--- stdout ---"
        head -c 1000000 "$OUTF"
        echo "--- stderr ---"
        head -c 1000000 "$ERRF"
        echo "--- end $name ---"
    } >>"$LOG"
}

# Describe an abnormal exit for the observed column.
rc_note() {
    if [ "$NOTRUN" = 1 ]; then
        echo "not run: time budget spent"
    elif [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
        echo "TIMEOUT (rc=$RC)"
    elif [ "$RC" = 127 ] || [ "$RC" = 126 ]; then
        echo "could not execute (rc=$RC)"
    elif ((RC > 128)); then
        echo "killed by signal $((RC - 128))"
    fi
}

first_line() { head -n 1 "$1" 2>/dev/null | tr -d '\r' | cut -c1-"${2:-120}"; }

# ---------------------------------------------------------------- setup

CAP_BYTES=$(parse_size "$CAP") || {
    echo "gpu-check: cannot parse CAP='$CAP' (use whole bytes or N KiB/MiB/GiB)" >&2
    exit 2
}
if ((CAP_BYTES < GiB || CAP_BYTES > 16 * GiB)); then
    echo "gpu-check: CAP=$CAP ($CAP_BYTES bytes) outside 1 GiB..16 GiB (safety rule)" >&2
    exit 2
fi
for v in CU_TIMEOUT PY_TIMEOUT BUDGET_S; do
    if ! isint "${!v}"; then
        echo "gpu-check: $v='${!v}' is not a whole number of seconds" >&2
        exit 2
    fi
done

# Commit: git, else DIR/COMMIT, else unknown.
COMMIT=""
if command -v git >/dev/null 2>&1 && git -C "$ROOT" rev-parse --short HEAD >/dev/null 2>&1; then
    COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)
    if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | head -n 1)" ]; then
        COMMIT="$COMMIT+dirty"
    fi
fi
if [ -z "$COMMIT" ] && [ -r "$ART/COMMIT" ]; then
    COMMIT=$(head -n 1 "$ART/COMMIT" | tr -d '\r' | cut -c1-60)
fi
[ -n "$COMMIT" ] || COMMIT=unknown

NVSMI=$(command -v nvidia-smi 2>/dev/null || true)
[ -n "$NVSMI" ] || for c in /usr/local/nvidia/bin/nvidia-smi /usr/bin/nvidia-smi; do
    [ -x "$c" ] && NVSMI=$c && break
done
GPU_NAME=unknown
GPU_DRIVER=unknown
if [ -n "$NVSMI" ]; then
    q=$(timeout 30 "$NVSMI" --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    if [ -n "$q" ]; then
        GPU_NAME=$(echo "${q%,*}" | sed 's/^ *//; s/ *$//')
        GPU_DRIVER=$(echo "${q##*,}" | sed 's/^ *//; s/ *$//')
    fi
fi
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
if command -v timeout >/dev/null 2>&1; then :; else
    echo "gpu-check: 'timeout' (coreutils) not found" >&2
    exit 2
fi

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

NVCC_BIN=${NVCC:-}
if [ -z "$NVCC_BIN" ]; then
    if [ -x /usr/local/cuda/bin/nvcc ]; then
        NVCC_BIN=/usr/local/cuda/bin/nvcc
    else
        NVCC_BIN=$(command -v nvcc 2>/dev/null || true)
    fi
fi

# build_cu SRC OUT : nvcc with -lcuda; if the linker finds no libcuda.so, retry
# with the toolkit's stubs and the driver's own libcuda.so.1. Returns 0 on success.
build_cu() {
    local src=$1 out=$2 cudadir alt
    local -a link
    cudadir=$(dirname "$(dirname "$NVCC_BIN")")
    local alts=(
        "-lcuda"
        "-L$cudadir/lib64/stubs -lcuda"
        "-L$cudadir/targets/x86_64-linux/lib/stubs -lcuda"
        "-L/usr/local/nvidia/lib64 -l:libcuda.so.1"
        "-L/usr/lib/x86_64-linux-gnu -l:libcuda.so.1"
    )
    for alt in "${alts[@]}"; do
        read -r -a link <<<"$alt"
        echo "build: $NVCC_BIN -O2 -arch=$CUDA_ARCH -o $out $src ${link[*]}" >>"$LOG"
        if timeout 300 "$NVCC_BIN" -O2 -arch="$CUDA_ARCH" -o "$out" "$src" "${link[@]}" >>"$LOG" 2>&1; then
            echo "build ok: $out" >>"$LOG"
            (ldd "$out" 2>&1 || true) >>"$LOG"
            return 0
        fi
    done
    return 1
}

CAPCHECK=""
if [ -z "$NVCC_BIN" ] || [ ! -x "$NVCC_BIN" ]; then
    add_row "build capcheck.cu" "nvcc builds it" "nvcc not found (set NVCC)" FAIL
elif [ ! -r "$GPU_SRC/capcheck.cu" ]; then
    add_row "build capcheck.cu" "nvcc builds it" "$GPU_SRC/capcheck.cu missing" FAIL
else
    progress "building capcheck with $NVCC_BIN"
    if build_cu "$GPU_SRC/capcheck.cu" "$WORK/capcheck"; then
        CAPCHECK=$WORK/capcheck
        add_row "build capcheck.cu" "nvcc builds it" "ok ($CUDA_ARCH)" PASS
    else
        add_row "build capcheck.cu" "nvcc builds it" "build failed (see log)" FAIL
    fi
fi

# ---------------------------------------------------------------- a/f. info rows

REAL_TOTAL=""
REAL_PROPS=""
info_obs() {
    local line=$1
    echo "total=$(mib "$(kv total "$line")") props=$(mib "$(kv props_total "$line")") cu_total=$(mib "$(kv cu_total "$line")") cu_devtotal=$(mib "$(kv cu_devtotal "$line")") free=$(mib "$(kv free "$line")")"
}

if [ -n "$CAPCHECK" ]; then
    run_cmd capcheck-info-noshim "$CU_TIMEOUT" "${NOSHIM[@]}" "$CAPCHECK" info
    line=$(result_line "$OUTF" RESULT)
    note=$(rc_note)
    t=$(kv total "$line")
    p=$(kv props_total "$line")
    if [ "$RC" = 0 ] && isint "$t" && isint "$p" && ((t > CAP_BYTES && p > CAP_BYTES)); then
        res=PASS
        REAL_TOTAL=$t
        REAL_PROPS=$p
    else
        res=FAIL
    fi
    add_row "capcheck info, no shim (baseline)" "rc=0, real totals > CAP" \
        "${note:+$note; }${line:+$(info_obs "$line") }rc=$RC" "$res"
    if [ "$GPU_NAME" = unknown ]; then
        n=$(grep -a '^INFO device_name=' "$OUTF" 2>/dev/null | head -n 1 | sed 's/^INFO device_name="\([^"]*\)".*/\1/')
        [ -n "$n" ] && GPU_NAME="$n (from CUDA)"
        HEADER="vramcap gpu-check — $DATE_UTC — commit $COMMIT — GPU $GPU_NAME, driver $GPU_DRIVER — CAP=$CAP ($CAP_BYTES bytes)"
    fi

    run_cmd capcheck-info-cap "$CU_TIMEOUT" "${WITHSHIM[@]}" "$CAPCHECK" info
    line=$(result_line "$OUTF" RESULT)
    note=$(rc_note)
    t=$(kv total "$line")
    p=$(kv props_total "$line")
    if [ "$RC" = 0 ] && [ "$t" = "$CAP_BYTES" ] && [ "$p" = "$CAP_BYTES" ]; then res=PASS; else res=FAIL; fi
    add_row "capcheck info, CAP" "cudaMemGetInfo total = totalGlobalMem = CAP ($(mib "$CAP_BYTES"))" \
        "${note:+$note; }${line:+$(info_obs "$line") }rc=$RC" "$res"

    run_cmd capcheck-info-nolimit "$CU_TIMEOUT" "${NOLIMIT[@]}" "$CAPCHECK" info
    line=$(result_line "$OUTF" RESULT)
    note=$(rc_note)
    t=$(kv total "$line")
    p=$(kv props_total "$line")
    if [ -z "$REAL_TOTAL" ]; then
        res=FAIL
        note="${note:+$note; }no baseline to compare with"
    elif [ "$RC" = 0 ] && [ "$t" = "$REAL_TOTAL" ] && [ "$p" = "$REAL_PROPS" ]; then
        res=PASS
    else
        res=FAIL
    fi
    add_row "capcheck info, shim without VRAMCAP_LIMIT" "totals = baseline ($(mib "$REAL_TOTAL"))" \
        "${note:+$note; }${line:+$(info_obs "$line") }rc=$RC" "$res"
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

verify_state() {
    if grep -aq '^VERIFY ok$' "$OUTF"; then echo ok; elif grep -aq '^VERIFY' "$OUTF"; then echo bad; else echo none; fi
}

if [ -n "$CAPCHECK" ]; then
    # Baseline without the shim: the program itself must reach its 6 GiB hard stop.
    run_cmd capcheck-cudaMalloc-noshim "$CU_TIMEOUT" "${NOSHIM[@]}" "$CAPCHECK" cudaMalloc $((6 * GiB))
    line=$(result_line "$OUTF" RESULT)
    note=$(rc_note)
    b=$(kv bytes "$line")
    vs=$(verify_state)
    if [ "$RC" = 0 ] && [ "$b" = $((6 * GiB)) ] && [ "$(kv stop "$line")" = limit ] && [ "$vs" = ok ]; then res=PASS; else res=FAIL; fi
    add_row "capcheck cudaMalloc, no shim, stop 6 GiB" "bytes=6144 MiB (hard stop), VERIFY ok, rc=0" \
        "${note:+$note; }${line:+$(alloc_obs "$line") }verify=$vs rc=$RC" "$res"
else
    add_row "capcheck cudaMalloc, no shim, stop 6 GiB" "bytes=6144 MiB (hard stop), VERIFY ok, rc=0" "not built" FAIL
fi

MANAGED_LOOP_MAX=$((6 * GiB - 256 * MiB)) # what capcheck clamps managed memory to
for mode in cudaMalloc cuMemAlloc cudaMallocPitch cudaMallocManaged; do
    rowname="capcheck $mode, CAP"
    exp="$(mib $((CAP_BYTES - CHUNK))) < bytes <= $(mib "$CAP_BYTES"), err=2"
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
    run_cmd "capcheck-$mode-cap" "$CU_TIMEOUT" "${WITHSHIM[@]}" "$CAPCHECK" "$mode" "$maxb"
    line=$(result_line "$OUTF" RESULT)
    note=$(rc_note)
    b=$(kv bytes "$line")
    e=$(kv err "$line")
    t=$(kv total "$line")
    vs=$(verify_state)
    ok=1
    isint "$b" && ((b > CAP_BYTES - CHUNK && b <= CAP_BYTES)) || ok=0
    [ "$e" = 2 ] || ok=0
    if [ "$mode" = cudaMalloc ] && [ "$t" != "$CAP_BYTES" ]; then ok=0; fi
    [ "$vs" = ok ] || ok=0
    [ "$RC" = 0 ] || ok=0
    [ -n "$line" ] || ok=0
    if [ "$mode" = cudaMallocManaged ] && (((CAP_BYTES / CHUNK + 1) * CHUNK > MANAGED_LOOP_MAX)); then
        extra="CAP too large for the managed 6 GiB safety stop; "
    fi
    if [ "$mode" = cudaMallocPitch ] && [ -n "$line" ]; then
        extra="${extra}pitch=$(kv pitch "$line") "
    fi
    if [ "$ok" = 1 ]; then res=PASS; else res=FAIL; fi
    add_row "$rowname" "$exp" "${note:+$note; }${extra}${line:+$(alloc_obs "$line") }verify=$vs rc=$RC" "$res"
done

# ---------------------------------------------------------------- a2. more allocation paths

# TOUCH state of the last process: ok, bad (a bad or error line) or none.
touch_state() {
    if grep -aq '^TOUCH \(bad\|error\)' "$OUTF"; then
        echo bad
    elif grep -aq '^TOUCH ok' "$OUTF"; then
        echo ok
    else
        echo none
    fi
}
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

# Without the shim each new path must reach a 1 GiB hard stop: shows that the
# program itself works, so a failure with the shim is the shim's. For arrays,
# first_delta is the driver's real size of one array (drop of free memory).
for mode in "${NEW_MODES[@]}"; do
    rowname="capcheck $mode, no shim, stop 1 GiB"
    exp="bytes=1024 MiB (hard stop)"
    has_touch "$mode" && exp="$exp, TOUCH ok"
    exp="$exp, VERIFY ok, rc=0"
    if [ -z "$CAPCHECK" ]; then
        add_row "$rowname" "$exp" "not built" FAIL
        continue
    fi
    run_cmd "capcheck-$mode-noshim" "$CU_TIMEOUT" "${NOSHIM[@]}" "$CAPCHECK" "$mode" "$GiB"
    line=$(result_line "$OUTF" RESULT)
    note=$(rc_note)
    b=$(kv bytes "$line")
    vs=$(verify_state)
    ts=$(touch_state)
    ok=1
    [ "$RC" = 0 ] || ok=0
    [ -n "$line" ] || ok=0
    [ "$b" = "$GiB" ] || ok=0
    [ "$(kv stop "$line")" = limit ] || ok=0
    [ "$vs" = ok ] || ok=0
    if has_touch "$mode" && [ "$ts" != ok ]; then ok=0; fi
    if [ "$ok" = 1 ]; then res=PASS; else res=FAIL; fi
    tobs=""
    has_touch "$mode" && tobs="touch=$ts "
    add_row "$rowname" "$exp" "${note:+$note; }${line:+$(mode_extra "$mode" "$line")$(alloc_obs "$line") }${tobs}verify=$vs rc=$RC" "$res"
done

# With the cap: stop within one chunk below CAP (arrays: two chunks, as the
# driver's real array size may be a bit more than the 256 MiB counted), refused
# with err 2, and the process still healthy.
for mode in "${NEW_MODES[@]}"; do
    lo=$((CAP_BYTES - CHUNK))
    is_array "$mode" && lo=$((CAP_BYTES - 2 * CHUNK))
    rowname="capcheck $mode, CAP"
    exp="$(mib "$lo") < bytes <= $(mib "$CAP_BYTES"), err=2 (stop=refused)"
    has_touch "$mode" && exp="$exp, TOUCH ok"
    exp="$exp, VERIFY ok, rc=0"
    if [ -z "$CAPCHECK" ]; then
        add_row "$rowname" "$exp" "not built" FAIL
        continue
    fi
    run_cmd "capcheck-$mode-cap" "$CU_TIMEOUT" "${WITHSHIM[@]}" "$CAPCHECK" "$mode" $((CAP_BYTES + GiB))
    line=$(result_line "$OUTF" RESULT)
    note=$(rc_note)
    b=$(kv bytes "$line")
    vs=$(verify_state)
    ts=$(touch_state)
    ok=1
    [ "$RC" = 0 ] || ok=0
    [ -n "$line" ] || ok=0
    isint "$b" && ((b > lo && b <= CAP_BYTES)) || ok=0
    [ "$(kv err "$line")" = 2 ] || ok=0
    [ "$(kv stop "$line")" = refused ] || ok=0
    [ "$vs" = ok ] || ok=0
    if has_touch "$mode" && [ "$ts" != ok ]; then ok=0; fi
    if [ "$ok" = 1 ]; then res=PASS; else res=FAIL; fi
    tobs=""
    has_touch "$mode" && tobs="touch=$ts "
    add_row "$rowname" "$exp" "${note:+$note; }${line:+$(mode_extra "$mode" "$line")$(alloc_obs "$line") }${tobs}verify=$vs rc=$RC" "$res"
done

# ---------------------------------------------------------------- b/c/d. Python frameworks

PY_OK=1
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    PY_OK=0
fi

# py_row NAME EXPECTED OBS_KEYS... : common observed text for a Python check
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

LOW=$((CAP_BYTES - GiB))

# b. PyTorch
exp="total=CAP, OutOfMemoryError, CAP-1GiB <= allocated <= CAP, matmul ok"
if [ "$PY_OK" = 1 ] && [ -r "$GPU_SRC/check_torch.py" ]; then
    run_cmd torch "$PY_TIMEOUT" "${WITHSHIM[@]}" "$PYTHON" "$GPU_SRC/check_torch.py" --max-bytes $((CAP_BYTES + GiB))
    line=$(result_line "$OUTF" RESULTKV)
    note=$(py_note)
    a=$(kv allocated "$line")
    ok=1
    [ "$RC" = 0 ] || ok=0
    [ "$(kv total "$line")" = "$CAP_BYTES" ] || ok=0
    [ "$(kv oom "$line")" = 1 ] || ok=0
    isint "$a" && ((a <= CAP_BYTES && a >= LOW)) || ok=0
    [ "$(kv matmul_ok "$line")" = 1 ] || ok=0
    if [ "$ok" = 1 ]; then res=PASS; else res=FAIL; fi
    add_row "torch" "$exp" "${note:+$note; }$(py_obs "$line" total oom allocated reserved matmul_ok)" "$res"
else
    add_row "torch" "$exp" "python ($PYTHON) or check_torch.py not found" FAIL
fi

# b2. PyTorch under `vramcap run`, counters read with `vramcap stat --json` while it runs
exp="stat USED >= torch.cuda.memory_reserved(), extra (USED - reserved) <= 256 MiB, limit=CAP"
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
    isint "$x" && ((x <= 256 * MiB)) || ok=0
    [ "$(kv limit "$line")" = "$CAP_BYTES" ] || ok=0
    [ "$(kv cmd_ok "$line")" = 1 ] || ok=0
    if [ "$ok" = 1 ]; then res=PASS; else res=FAIL; fi
    add_row "torch under vramcap run + vramcap stat" "$exp" "${note:+$note; }used=$(mib "$u") reserved=$(mib "$rv") allocated=$(mib "$(kv allocated "$line")") extra=$((${x:-0} / 1024)) KiB allocs=$(kv allocs "$line")" "$res"
else
    add_row "torch under vramcap run + vramcap stat" "$exp" "python ($PYTHON) or check_torch_stat.py not found" FAIL
fi

# d. CuPy
exp="memGetInfo total=CAP, OutOfMemoryError, CAP-1GiB <= bytes <= CAP, compute ok"
if [ "$PY_OK" = 1 ] && [ -r "$GPU_SRC/check_cupy.py" ]; then
    run_cmd cupy "$PY_TIMEOUT" "${WITHSHIM[@]}" "$PYTHON" "$GPU_SRC/check_cupy.py" --max-bytes $((CAP_BYTES + GiB))
    line=$(result_line "$OUTF" RESULTKV)
    note=$(py_note)
    b=$(kv bytes "$line")
    ok=1
    [ "$RC" = 0 ] || ok=0
    [ "$(kv total "$line")" = "$CAP_BYTES" ] || ok=0
    [ "$(kv oom "$line")" = 1 ] || ok=0
    isint "$b" && ((b <= CAP_BYTES && b >= LOW)) || ok=0
    [ "$(kv compute_ok "$line")" = 1 ] || ok=0
    if [ "$ok" = 1 ]; then res=PASS; else res=FAIL; fi
    add_row "cupy" "$exp" "${note:+$note; }$(py_obs "$line" total oom bytes pool_total_bytes roundtrip_ok kernel_ok compute_ok)" "$res"
else
    add_row "cupy" "$exp" "python ($PYTHON) or check_cupy.py not found" FAIL
fi

# c. JAX, default allocator and preallocation
JLO=$((CAP_BYTES / 2))
JHI=$((CAP_BYTES * 3 / 4 + 64 * MiB))
exp="$(mib "$JLO") <= bytes_limit <= $(mib "$JHI"), compute ok"
if [ "$PY_OK" = 1 ] && [ -r "$GPU_SRC/check_jax.py" ]; then
    run_cmd jax-default "$PY_TIMEOUT" "${WITHSHIM[@]}" "$PYTHON" "$GPU_SRC/check_jax.py" default
    line=$(result_line "$OUTF" RESULTKV)
    note=$(py_note)
    bl=$(kv bytes_limit "$line")
    ok=1
    [ "$RC" = 0 ] || ok=0
    isint "$bl" && ((bl >= JLO && bl <= JHI)) || ok=0
    [ "$(kv compute_ok "$line")" = 1 ] || ok=0
    if [ "$ok" = 1 ]; then res=PASS; else res=FAIL; fi
    add_row "jax default (preallocate)" "$exp" "${note:+$note; }$(py_obs "$line" bytes_limit bytes_reserved compute_ok)" "$res"
else
    add_row "jax default (preallocate)" "$exp" "python ($PYTHON) or check_jax.py not found" FAIL
fi

# c. JAX, platform allocator
exp="exception with RESOURCE_EXHAUSTED/out of memory, CAP-1GiB <= bytes <= CAP, compute ok"
if [ "$PY_OK" = 1 ] && [ -r "$GPU_SRC/check_jax.py" ]; then
    run_cmd jax-platform "$PY_TIMEOUT" "${WITHSHIM[@]}" XLA_PYTHON_CLIENT_ALLOCATOR=platform \
        "$PYTHON" "$GPU_SRC/check_jax.py" platform --max-bytes $((CAP_BYTES + GiB))
    line=$(result_line "$OUTF" RESULTKV)
    note=$(py_note)
    b=$(kv bytes "$line")
    ok=1
    [ "$RC" = 0 ] || ok=0
    [ "$(kv env_allocator_is_platform "$line")" = 1 ] || ok=0
    [ "$(kv exception_raised "$line")" = 1 ] || ok=0
    [ "$(kv exception_resource_exhausted "$line")" = 1 ] || ok=0
    isint "$b" && ((b <= CAP_BYTES && b >= LOW)) || ok=0
    [ "$(kv compute_ok "$line")" = 1 ] || ok=0
    if [ "$ok" = 1 ]; then res=PASS; else res=FAIL; fi
    add_row "jax XLA_PYTHON_CLIENT_ALLOCATOR=platform" "$exp" \
        "${note:+$note; }$(py_obs "$line" exception_raised exception_resource_exhausted bytes compute_ok)" "$res"
else
    add_row "jax XLA_PYTHON_CLIENT_ALLOCATOR=platform" "$exp" "python ($PYTHON) or check_jax.py not found" FAIL
fi

# ---------------------------------------------------------------- b2/c2/d2. more framework allocators

# b3. PyTorch with another allocator configuration (PYTORCH_CUDA_ALLOC_CONF):
# same pass criteria as the torch row, plus a sign that the setting took effect.
torch_variant() {
    local rowname=$1 runname=$2 conf=$3 exp a ok
    exp="total=CAP, OutOfMemoryError, CAP-1GiB <= allocated <= CAP, matmul ok"
    case $conf in
        *expandable_segments*) exp="$exp, segments expandable (expandable_seen != 0)" ;;
        *cudaMallocAsync*) exp="$exp, allocator backend cudaMallocAsync" ;;
    esac
    if [ "$PY_OK" != 1 ] || [ ! -r "$GPU_SRC/check_torch.py" ]; then
        add_row "$rowname" "$exp" "python ($PYTHON) or check_torch.py not found" FAIL
        return
    fi
    run_cmd "$runname" "$PY_TIMEOUT" "${WITHSHIM[@]}" "PYTORCH_CUDA_ALLOC_CONF=$conf" \
        "$PYTHON" "$GPU_SRC/check_torch.py" --max-bytes $((CAP_BYTES + GiB))
    line=$(result_line "$OUTF" RESULTKV)
    note=$(py_note)
    a=$(kv allocated "$line")
    ok=1
    [ "$RC" = 0 ] || ok=0
    [ "$(kv total "$line")" = "$CAP_BYTES" ] || ok=0
    [ "$(kv oom "$line")" = 1 ] || ok=0
    isint "$a" && ((a <= CAP_BYTES && a >= LOW)) || ok=0
    [ "$(kv matmul_ok "$line")" = 1 ] || ok=0
    case $conf in
        *expandable_segments*) [ "$(kv expandable_seen "$line")" != 0 ] || ok=0 ;;
        *cudaMallocAsync*) [ "$(kv alloc_backend_async "$line")" = 1 ] || ok=0 ;;
    esac
    if [ "$ok" = 1 ]; then res=PASS; else res=FAIL; fi
    add_row "$rowname" "$exp" \
        "${note:+$note; }$(py_obs "$line" total oom allocated reserved matmul_ok alloc_backend_async expandable_seen expandable_segments)" "$res"
}
torch_variant "torch PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" torch-expandable "expandable_segments:True"
torch_variant "torch PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync" torch-async "backend:cudaMallocAsync"

# d2. CuPy with the stream-ordered allocator (MemoryAsyncPool)
exp="memGetInfo total=CAP, OutOfMemoryError, CAP-1GiB <= bytes <= CAP, compute ok"
if [ "$PY_OK" = 1 ] && [ -r "$GPU_SRC/check_cupy.py" ]; then
    run_cmd cupy-async "$PY_TIMEOUT" "${WITHSHIM[@]}" "$PYTHON" "$GPU_SRC/check_cupy.py" --mode async --max-bytes $((CAP_BYTES + GiB))
    line=$(result_line "$OUTF" RESULTKV)
    note=$(py_note)
    b=$(kv bytes "$line")
    ok=1
    [ "$RC" = 0 ] || ok=0
    [ "$(kv async_pool "$line")" = 1 ] || ok=0
    [ "$(kv total "$line")" = "$CAP_BYTES" ] || ok=0
    [ "$(kv oom "$line")" = 1 ] || ok=0
    isint "$b" && ((b <= CAP_BYTES && b >= LOW)) || ok=0
    [ "$(kv compute_ok "$line")" = 1 ] || ok=0
    if [ "$ok" = 1 ]; then res=PASS; else res=FAIL; fi
    add_row "cupy MemoryAsyncPool" "$exp" "${note:+$note; }$(py_obs "$line" total oom bytes pool_total_bytes other_error_status roundtrip_ok kernel_ok compute_ok)" "$res"
else
    add_row "cupy MemoryAsyncPool" "$exp" "python ($PYTHON) or check_cupy.py not found" FAIL
fi

# c2. JAX, default BFC allocator without preallocation (grows on demand).
# MEM_FRACTION=1.0 makes the BFC limit the whole (capped) total: with the
# default 0.75 XLA itself would stop at 0.75*CAP, below CAP-1GiB.
exp="XLA_PYTHON_CLIENT_PREALLOCATE=false seen, exception with RESOURCE_EXHAUSTED/out of memory, CAP-1GiB <= bytes <= CAP, compute ok"
if [ "$PY_OK" = 1 ] && [ -r "$GPU_SRC/check_jax.py" ]; then
    run_cmd jax-growth "$PY_TIMEOUT" "${WITHSHIM[@]}" XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=1.0 \
        "$PYTHON" "$GPU_SRC/check_jax.py" growth --max-bytes $((CAP_BYTES + GiB))
    line=$(result_line "$OUTF" RESULTKV)
    note=$(py_note)
    b=$(kv bytes "$line")
    ok=1
    [ "$RC" = 0 ] || ok=0
    [ "$(kv env_preallocate_is_false "$line")" = 1 ] || ok=0
    [ "$(kv exception_raised "$line")" = 1 ] || ok=0
    [ "$(kv exception_resource_exhausted "$line")" = 1 ] || ok=0
    isint "$b" && ((b <= CAP_BYTES && b >= LOW)) || ok=0
    [ "$(kv compute_ok "$line")" = 1 ] || ok=0
    if [ "$ok" = 1 ]; then res=PASS; else res=FAIL; fi
    add_row "jax XLA_PYTHON_CLIENT_PREALLOCATE=false (BFC grows, MEM_FRACTION=1.0)" "$exp" \
        "${note:+$note; }$(py_obs "$line" exception_raised exception_resource_exhausted bytes bytes_limit compute_ok)" "$res"
else
    add_row "jax XLA_PYTHON_CLIENT_PREALLOCATE=false (BFC grows, MEM_FRACTION=1.0)" "$exp" "python ($PYTHON) or check_jax.py not found" FAIL
fi

# e2. numba-cuda device arrays
exp="exception with CUDA_ERROR_OUT_OF_MEMORY (2), CAP-1GiB <= bytes <= CAP, round trip and @cuda.jit kernel ok (a device-to-device copy where numba's JIT cannot load)"
if [ "$PY_OK" = 1 ] && [ -r "$GPU_SRC/check_numba.py" ]; then
    run_cmd numba "$PY_TIMEOUT" "${WITHSHIM[@]}" "$PYTHON" "$GPU_SRC/check_numba.py" --max-bytes $((CAP_BYTES + GiB))
    line=$(result_line "$OUTF" RESULTKV)
    note=$(py_note)
    b=$(kv bytes "$line")
    ok=1
    [ "$RC" = 0 ] || ok=0
    [ "$(kv exception_raised "$line")" = 1 ] || ok=0
    [ "$(kv oom_error "$line")" = 1 ] || ok=0
    isint "$b" && ((b <= CAP_BYTES && b >= LOW)) || ok=0
    [ "$(kv compute_ok "$line")" = 1 ] || ok=0
    if [ "$ok" = 1 ]; then res=PASS; else res=FAIL; fi
    add_row "numba-cuda device_array" "$exp" \
        "${note:+$note; }$(py_obs "$line" total exception_raised exception_code oom_error bytes roundtrip_ok kernel_ok jit_unavailable d2d_ok compute_ok)" "$res"
else
    add_row "numba-cuda device_array" "$exp" "python ($PYTHON) or check_numba.py not found" FAIL
fi

# f2. NVML memory info of a capped process (CUDA initialised by torch, 1 GiB held)
exp="nvmlDeviceGetMemoryInfo(0): total=CAP, 1 GiB <= used <= CAP; torch mem_get_info total = NVML total"
if [ "$PY_OK" = 1 ] && [ -r "$GPU_SRC/check_nvml.py" ]; then
    run_cmd nvml "$PY_TIMEOUT" "${WITHSHIM[@]}" "$PYTHON" "$GPU_SRC/check_nvml.py" --hold-bytes "$GiB"
    line=$(result_line "$OUTF" RESULTKV)
    note=$(py_note)
    t=$(kv total "$line")
    u=$(kv used "$line")
    ok=1
    [ "$RC" = 0 ] || ok=0
    [ "$t" = "$CAP_BYTES" ] || ok=0
    isint "$u" && ((u >= GiB && u <= CAP_BYTES)) || ok=0
    [ -n "$t" ] && [ "$(kv torch_total "$line")" = "$t" ] || ok=0
    if [ "$ok" = 1 ]; then res=PASS; else res=FAIL; fi
    add_row "NVML nvmlDeviceGetMemoryInfo" "$exp" \
        "${note:+$note; }nvml_via=$(grep -a '^RESULT ' "$OUTF" | tail -n 1 | sed -n 's/.*"nvml_via": "\([a-z]*\)".*/\1/p') $(py_obs "$line" total used free torch_total total_v2 used_v2)" "$res"
else
    add_row "NVML nvmlDeviceGetMemoryInfo" "$exp" "python ($PYTHON) or check_nvml.py not found" FAIL
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
    run_cmd cache-safety-naive "$CU_TIMEOUT" "${NOSHIM[@]}" "$CACHE_SAFETY" naive
    line=$(result_line "$OUTF" RESULT)
    c=$(kv clobbered "$line")
    if [ "$RC" = 0 ] && isint "$c" && ((c > 0)); then res=PASS; else res=FAIL; fi
    add_row "cache safety control (program reuses without waiting, no shim)" "$exp" "${line:-no RESULT line} rc=$RC" "$res"
    for variant in on off; do
        exp="reused=1 with the cache, clobbered=0"
        [ "$variant" = off ] && exp="clobbered=0"
        run_cmd "cache-safety-$variant" "$CU_TIMEOUT" "${WITHSHIM[@]}" "VRAMCAP_CACHE=$([ "$variant" = on ] && echo 25% || echo off)" "$CACHE_SAFETY" cuda
        line=$(result_line "$OUTF" RESULT)
        c=$(kv clobbered "$line")
        ok=1
        [ "$RC" = 0 ] && isint "$c" && ((c == 0)) || ok=0
        if [ "$variant" = on ] && [ "$(kv reused "$line")" != 1 ]; then ok=0; fi
        if [ "$ok" = 1 ]; then res=PASS; else res=FAIL; fi
        add_row "cache safety: free while a kernel writes, reuse on another stream (cache $variant)" "$exp" "${line:-no RESULT line} rc=$RC" "$res"
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
    if [ "$ok" = 1 ]; then res=PASS; else res=FAIL; fi
    add_row "churn.cu 5000 iterations (2 cudaMalloc+cudaFree, 3 kernels each)" "$exp" \
        "checksums ${CH_SUM[base]:-?}/${CH_SUM[off]:-?}/${CH_SUM[on]:-?}; ms without shim ${CH_MS[base]:-?}, cache off ${CH_MS[off]:-?}, cache on ${CH_MS[on]:-?} (speed-up $speed)" "$res"
else
    add_row "churn.cu" "$exp" "churn.cu did not build (see log)" FAIL
fi

# ---------------------------------------------------------------- report

if [ -n "$NVSMI" ]; then
    {
        echo
        echo "=== nvidia-smi at the end ==="
        timeout 30 "$NVSMI" 2>&1
    } >>"$LOG"
fi

esc() { printf '%s' "$1" | sed 's/|/\\|/g'; }
{
    echo "$HEADER"
    echo
    echo "| check | expected | observed | PASS/FAIL |"
    echo "|---|---|---|---|"
    for i in "${!ROWS_NAME[@]}"; do
        echo "| $(esc "${ROWS_NAME[$i]}") | $(esc "${ROWS_EXP[$i]}") | $(esc "${ROWS_OBS[$i]}") | ${ROWS_RES[$i]} |"
    done
    echo
    echo "${#ROWS_NAME[@]} checks, $((${#ROWS_NAME[@]} - NFAIL)) passed, $NFAIL failed (${SECONDS}s). Full log: $LOG"
} >"$WORK/table.md"

cp "$WORK/table.md" "$MD" 2>/dev/null || true
{
    echo
    echo "=== summary ==="
    cat "$WORK/table.md"
} >>"$LOG"
echo
cat "$WORK/table.md"

[ "$NFAIL" = 0 ] && exit 0
exit 1
