# shellcheck shell=bash
# scripts/gpu/lib.sh — what the GPU scripts share; sourced, never run.
#
# The sourcing script sets NAME (its prefix in messages, and the stem of
# OUT/NAME.log and OUT/NAME.md; OUT defaults to /tmp, PYTHON to python3) and
# calls these in its own order:
#   gpu_args LAST "$@"     -h/--help or no DIR: print lines 2..LAST of the script, exit 2
#   gpu_paths DIR          ART, SHIM, CLI, ROOT, GPU_SRC
#   gpu_outputs            OUT created, LOG (emptied) and MD
#   gpu_workdir            WORK, a temp folder removed at exit unless KEEP_WORK=1
#   gpu_setup DIR          the three above
#   gpu_commit, gpu_smi    COMMIT; NVSMI, GPU_NAME, GPU_DRIVER, GPU0_UUID
#   find_nvcc, build_cu    NVCC_BIN; nvcc with -lcuda and its fallbacks
#   run_cmd, rc_note       one process under timeout, logged (RC, OUTF, ERRF, NOTRUN);
#   run_begin, run_end     its start and end, for scripts that run a process their own way
#   add_row, gpu_report    the rows, then the table (printed, OUT/NAME.md, the log)

NAME=${NAME:?set NAME before sourcing scripts/gpu/lib.sh}
OUT=${OUT:-/tmp}
PYTHON=${PYTHON:-python3}
MiB=1048576
# shellcheck disable=SC2034  # for the sourcing scripts
GiB=1073741824

gpu_args() {
    local last=$1
    shift
    if [ $# -lt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
        sed -n "2,${last}p" "$0" | sed 's/^# \{0,1\}//'
        exit 2
    fi
    if [ ! -d "$1" ]; then
        echo "$NAME: '$1' is not a directory" >&2
        exit 2
    fi
}

# gpu_paths DIR : the artefacts in DIR and this checkout's folders.
# shellcheck disable=SC2034  # for the sourcing scripts
gpu_paths() {
    ART=$(realpath "$1")
    SHIM=$ART/libvramcap.so
    CLI=$ART/vramcap
    GPU_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    ROOT=$(cd "$GPU_SRC/../.." && pwd)
}

gpu_outputs() {
    mkdir -p "$OUT" || { echo "$NAME: cannot create OUT=$OUT" >&2; exit 2; }
    LOG=$OUT/$NAME.log
    MD=$OUT/$NAME.md
    : >"$LOG" || { echo "$NAME: cannot write $LOG" >&2; exit 2; }
}

progress() { echo "[$NAME] $*" >&2; echo "[$NAME] $*" >>"$LOG"; }

gpu_workdir() {
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/$NAME.XXXXXX") || { echo "$NAME: mktemp failed" >&2; exit 2; }
    trap gpu_cleanup EXIT
}

# gpu_setup DIR : gpu_paths DIR, gpu_outputs, gpu_workdir.
gpu_setup() {
    gpu_paths "$1"
    gpu_outputs
    gpu_workdir
}
# shellcheck disable=SC2317  # called through trap
gpu_cleanup() { if [ "${KEEP_WORK:-0}" != 1 ]; then rm -rf "$WORK"; fi; }

isint() { [[ ${1:-} =~ ^[0-9]+$ ]]; }

# need_whole WHAT VAR... : exit 2 unless every VAR holds a whole number
# ("is not a whole number" followed by WHAT, e.g. " of seconds").
need_whole() {
    local what=$1 v
    shift
    for v in "$@"; do
        if ! isint "${!v}"; then
            echo "$NAME: $v='${!v}' is not a whole number$what" >&2
            exit 2
        fi
    done
}

need_timeout() {
    command -v timeout >/dev/null 2>&1 || { echo "$NAME: 'timeout' (coreutils) not found" >&2; exit 2; }
}

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

# grep_state PATTERN STATE [PATTERN STATE...] : the STATE of the first PATTERN
# that a line of the last process's stdout matches (grep -a), else none.
grep_state() {
    while [ $# -ge 2 ]; do
        if grep -aq "$1" "$OUTF"; then
            echo "$2"
            return
        fi
        shift 2
    done
    echo none
}

first_line() { head -n 1 "$1" 2>/dev/null | tr -d '\r' | cut -c1-"${2:-120}"; }

# The commit: DIR/COMMIT (written when the artefacts were built, so it names
# what is being run, whatever .git the copy on the GPU machine carries), else
# git, else unknown.
gpu_commit() {
    COMMIT=""
    if [ -r "$ART/COMMIT" ]; then
        COMMIT=$(head -n 1 "$ART/COMMIT" | tr -d '\r' | cut -c1-60)
    fi
    if [ -z "$COMMIT" ] && command -v git >/dev/null 2>&1 && git -C "$ROOT" rev-parse --short HEAD >/dev/null 2>&1; then
        COMMIT=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)
        if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | head -n 1)" ]; then
            COMMIT="$COMMIT+dirty"
        fi
    fi
    [ -n "$COMMIT" ] || COMMIT=unknown
}

# nvidia-smi, and the first GPU's name, driver and UUID (GPU0_UUID, empty
# when unknown) from it.
# shellcheck disable=SC2034  # for the sourcing scripts
gpu_smi() {
    local c q
    GPU0_UUID=""
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
        GPU0_UUID=$(timeout 30 "$NVSMI" --query-gpu=uuid --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' \r')
    fi
}

# NVCC, else the toolkit's nvcc, else nvcc on PATH (empty when none).
find_nvcc() {
    NVCC_BIN=${NVCC:-}
    if [ -z "$NVCC_BIN" ]; then
        if [ -x /usr/local/cuda/bin/nvcc ]; then
            NVCC_BIN=/usr/local/cuda/bin/nvcc
        else
            NVCC_BIN=$(command -v nvcc 2>/dev/null || true)
        fi
    fi
}

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

# The row "build capcheck.cu"; CAPCHECK is the program, empty when it did not build.
# shellcheck disable=SC2034  # for the sourcing scripts
build_capcheck() {
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
}

# ---------------------------------------------------------------- rows

ROWS_NAME=()
ROWS_EXP=()
ROWS_OBS=()
ROWS_RES=()
NFAIL=0
# add_row NAME EXPECTED OBSERVED PASS|FAIL
add_row() {
    ROWS_NAME+=("$1")
    ROWS_EXP+=("$2")
    ROWS_OBS+=("$3")
    ROWS_RES+=("$4")
    [ "$4" = PASS ] || NFAIL=$((NFAIL + 1))
    echo "RESULT-ROW | $1 | $2 | $3 | $4" >>"$LOG"
    echo "[$NAME]   -> $4: $3" >&2
}

# A row's verdict is built up in ok: it starts at 1, and each criterion that
# does not hold sets it to 0.
verdict() { if [ "$ok" = 1 ]; then echo PASS; else echo FAIL; fi; }
# want_kv KEY VALUE : KEY of the result line is VALUE
want_kv() { [ "$(kv "$1" "$line")" = "$2" ] || ok=0; }
# want_in KEY LOW [HIGH] : KEY of the result line is a whole number in [LOW, HIGH]
want_in() {
    local v
    v=$(kv "$1" "$line")
    isint "$v" && ((v >= $2)) && { [ $# -lt 3 ] || ((v <= $3)); } || ok=0
}

# ---------------------------------------------------------------- processes

# Remaining time for a check; 0 when the budget is spent.
time_left() {
    local left=$((BUDGET_S - SECONDS))
    ((left > 0)) && echo "$left" || echo 0
}

# run_cmd NAME TIMEOUT CMD... : runs CMD under timeout with stdin from /dev/null,
# everything it printed into the log. Sets RC, OUTF and ERRF; NOTRUN=1 (and
# RC=125) when fewer than RUN_MIN_LEFT seconds (default 5) of the budget were left.
RC=0
OUTF=/dev/null
ERRF=/dev/null
NOTRUN=0
run_cmd() {
    local name=$1
    run_begin "$@" || return 0
    shift 2
    timeout -k 10 "$RUN_TO" "$@" >"$OUTF" 2>"$ERRF" </dev/null
    RC=$?
    run_end "$name" "stdout"
}

# run_begin NAME TIMEOUT CMD... : what every way of running one process
# starts with: OUTF and ERRF emptied, NOTRUN; returns 1 (RC=125, NOTRUN=1)
# when fewer than RUN_MIN_LEFT seconds of the budget are left; else logs the
# command and sets RUN_TO (TIMEOUT, at most what is left) and RUN_T0.
run_begin() {
    local name=$1 left
    RUN_TO=$2
    shift 2
    OUTF=$WORK/$name.out
    ERRF=$WORK/$name.err
    : >"$OUTF"
    : >"$ERRF"
    NOTRUN=0
    left=$(time_left)
    if ((left < ${RUN_MIN_LEFT:-5})); then
        NOTRUN=1
        RC=125
        progress "$name: not run (time budget of ${BUDGET_S}s spent)"
        return 1
    fi
    ((RUN_TO > left)) && RUN_TO=$left
    progress "running $name (timeout ${RUN_TO}s)"
    {
        echo
        echo "=== $name ==="
        echo "start: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        printf 'cmd:'
        printf ' %q' "$@"
        echo
    } >>"$LOG"
    RUN_T0=$SECONDS
}

# run_end NAME WHAT : logs RC, the wall time, stdout (titled WHAT) and stderr.
run_end() {
    {
        echo "rc: $RC (wall $((SECONDS - RUN_T0)) s)"
        echo "--- $2 ---"
        head -c 1000000 "$OUTF"
        echo "--- stderr ---"
        head -c 1000000 "$ERRF"
        echo "--- end $1 ---"
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

# ---------------------------------------------------------------- report

# The header line of a markdown table of checks.
table_head() {
    echo "| check | expected | observed | PASS/FAIL |"
    echo "|---|---|---|---|"
}

esc() { printf '%s' "$1" | sed 's/|/\\|/g'; }

# Prints HEADER and the table of rows (also to MD and the log), then exits 1
# if any row is FAIL, else 0.
gpu_report() {
    local i
    if [ -n "$NVSMI" ]; then
        {
            echo
            echo "=== nvidia-smi at the end ==="
            timeout 30 "$NVSMI" 2>&1
        } >>"$LOG"
    fi
    {
        echo "$HEADER"
        echo
        table_head
        for i in "${!ROWS_NAME[@]}"; do
            echo "| $(esc "${ROWS_NAME[$i]}") | $(esc "${ROWS_EXP[$i]}") | $(esc "${ROWS_OBS[$i]}") | ${ROWS_RES[$i]} |"
        done
        echo
        echo "${#ROWS_NAME[@]} checks, $((${#ROWS_NAME[@]} - NFAIL)) passed, $NFAIL failed (${SECONDS}s). Full log: $LOG"
    } >"$WORK/table.md"
    gpu_table_out ""
    [ "$NFAIL" = 0 ] && exit 0
    exit 1
}

# gpu_table_out FUNCTION : WORK/table.md to MD, to the end of the log (after
# what FUNCTION, unless empty, writes there, under "=== summary ===") and to stdout.
gpu_table_out() {
    cp "$WORK/table.md" "$MD" 2>/dev/null || true
    {
        echo
        [ -z "$1" ] || "$1"
        echo "=== summary ==="
        cat "$WORK/table.md"
    } >>"$LOG"
    echo
    cat "$WORK/table.md"
}
