#!/usr/bin/env bash
# gpu-check-2gpu.sh DIR — per-device caps on a machine with two GPUs.
#
# DIR holds the built libvramcap.so (e.g. .gpu/). Builds scripts/gpu/capcheck.cu
# with nvcc and runs its `twodev` modes (cudaMalloc 256 MiB chunks on device 0,
# then device 1; `twodev-thread`: a second thread fills device 1 meanwhile)
# under per-device limits:
#   VRAMCAP_LIMIT="0=2GiB,1=3GiB"                       caps follow the visible order,
#   the same with CUDA_VISIBLE_DEVICES swapped,         also when that order is swapped,
#   VRAMCAP_LIMIT="GPU-<uuid prefix of 1>=1GiB,2GiB"    the UUID names the physical GPU,
#   VRAMCAP_LIMIT="GPU-ffffffff=1GiB,2GiB"              a key naming no GPU stops the process;
# then PyTorch on both devices (scripts/gpu/check_2gpu.py): each context charged
# to its own device, and a live cap change on one device only.
# Every process has CUDA_DEVICE_ORDER=PCI_BUS_ID (so CUDA's order is nvidia-smi's).
# Prints a markdown table at the end; the full log goes to
# ${OUT:-/tmp}/gpu-check-2gpu.log (the table also to ${OUT:-/tmp}/gpu-check-2gpu.md).
# Exits 1 if any check fails; a check that could not run counts as a failure.
#
# Environment:
#   NVCC        nvcc to use (default /usr/local/cuda/bin/nvcc, else nvcc on PATH)
#   CUDA_ARCH   default sm_90
#   OUT         output folder (default /tmp)
#   CU_TIMEOUT  per-process timeout (default 120 s)
#   BUDGET_S    stop starting new checks after this many seconds (default 540)
#   KEEP_WORK=1 keep the temp build/output folder

set -u

NAME=gpu-check-2gpu
# shellcheck source-path=SCRIPTDIR source=gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu/lib.sh"
gpu_args 25 "$@"
gpu_setup "$1"
CUDA_ARCH=${CUDA_ARCH:-sm_90}
CU_TIMEOUT=${CU_TIMEOUT:-120}
BUDGET_S=${BUDGET_S:-540}

CHUNK=$((256 * MiB))
CAP0=$((2 * GiB)) # "0=2GiB,1=3GiB"
CAP1=$((3 * GiB))
UCAP=$((1 * GiB)) # "GPU-<prefix of device 1>=1GiB,2GiB"
UDEF=$((2 * GiB))
MAXB=$((4 * GiB)) # hard stop per device: above every cap here, never reached when capped

need_whole " of seconds" CU_TIMEOUT BUDGET_S
need_timeout

lower() { printf '%s' "${1,,}"; }

# ---------------------------------------------------------------- setup

gpu_commit
gpu_smi
SMI_UUIDS=() # index order of nvidia-smi (PCI bus order)
if [ -n "$NVSMI" ]; then
    while IFS= read -r u; do
        u=$(printf '%s' "$u" | tr -d ' \r')
        [ -n "$u" ] && SMI_UUIDS+=("$u")
    done < <(timeout 30 "$NVSMI" --query-gpu=uuid --format=csv,noheader 2>/dev/null)
fi
DATE_UTC=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
HEADER="vramcap gpu-check-2gpu — $DATE_UTC — commit $COMMIT — GPU $GPU_NAME x ${#SMI_UUIDS[@]}, driver $GPU_DRIVER"

# CUDA_VISIBLE_DEVICES as inherited (most machines: unset) and its swap.
BASE_CVD_SET=0
BASE_CVD=""
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    BASE_CVD_SET=1
    BASE_CVD=$CUDA_VISIBLE_DEVICES
fi
if [ "$BASE_CVD_SET" = 1 ] && [ -n "$BASE_CVD" ]; then
    IFS=, read -r cvd_a cvd_b _ <<<"$BASE_CVD"
    SWAP_CVD="${cvd_b:-1},${cvd_a:-0}"
else
    SWAP_CVD="1,0"
fi

{
    echo "$HEADER"
    echo "artefacts: $ART"
    ls -l "$ART" 2>&1
    echo "host: $(uname -a)"
    echo "nvidia-smi UUIDs: ${SMI_UUIDS[*]:-none}"
    echo "inherited CUDA_VISIBLE_DEVICES: $([ "$BASE_CVD_SET" = 1 ] && echo "'$BASE_CVD'" || echo unset); swapped: $SWAP_CVD"
    if [ -n "$NVSMI" ]; then timeout 30 "$NVSMI" 2>&1; else echo "nvidia-smi not found"; fi
} >>"$LOG"
progress "$HEADER"

UNSET=(-u LD_PRELOAD -u VRAMCAP_LIMIT -u CUDA_DEVICE_ORDER)
NOSHIM=(env "${UNSET[@]}" CUDA_DEVICE_ORDER=PCI_BUS_ID)
WITHSHIM=(env "${UNSET[@]}" CUDA_DEVICE_ORDER=PCI_BUS_ID "LD_PRELOAD=$SHIM") # + VRAMCAP_LIMIT=...

HAVE_SHIM=0
[ -f "$SHIM" ] && [ -r "$SHIM" ] && HAVE_SHIM=1
add_row "artefacts present" "libvramcap.so in DIR" \
    "libvramcap.so: $([ "$HAVE_SHIM" = 1 ] && echo yes || echo MISSING)" \
    "$([ "$HAVE_SHIM" = 1 ] && echo PASS || echo FAIL)"

if ((${#SMI_UUIDS[@]} >= 2)); then res=PASS; else res=FAIL; fi
add_row "two GPUs (nvidia-smi --query-gpu=uuid)" ">= 2 GPUs" \
    "${#SMI_UUIDS[@]} GPU(s): ${SMI_UUIDS[*]:-none}${NVSMI:+ }$([ -n "$NVSMI" ] || echo '(nvidia-smi not found)')" "$res"

# ---------------------------------------------------------------- build

find_nvcc
build_capcheck

# ---------------------------------------------------------------- checks

# dev_line D : the RESULTDEV line of device D from the last process
dev_line() { grep -a "^RESULTDEV dev=$1 " "$OUTF" 2>/dev/null | tail -n 1; }
# VERIFYDEV state of device D in the last process: ok, bad or none
verify_dev() { grep_state "^VERIFYDEV dev=$1 ok\$" ok "^VERIFYDEV dev=$1 " bad; }
dev_obs() {
    local d=$1 line
    line=$(dev_line "$d")
    if [ -z "$line" ]; then
        printf 'dev%s: no RESULTDEV line; ' "$d"
        return
    fi
    printf 'dev%s: bytes=%s err=%s total=%s again_err=%s verify=%s uuid=%s; ' "$d" \
        "$(mib "$(kv bytes "$line")")" "$(kv err "$line")" "$(mib "$(kv total "$line")")" \
        "$(kv again_err "$line")" "$(verify_dev "$d")" "$(kv uuid "$line")"
}

# capped_ok D CAPBYTES : device D stopped within one chunk below CAPBYTES,
# refused with 2, reports CAPBYTES as its total, refuses one more chunk later,
# and its vector add is right.
capped_ok() {
    local d=$1 cap=$2 line b
    line=$(dev_line "$d")
    [ -n "$line" ] || return 1
    b=$(kv bytes "$line")
    isint "$b" && ((b > cap - CHUNK && b <= cap)) || return 1
    [ "$(kv err "$line")" = 2 ] || return 1
    [ "$(kv stop "$line")" = refused ] || return 1
    [ "$(kv total "$line")" = "$cap" ] || return 1
    [ "$(kv again_err "$line")" = 2 ] || return 1
    [ "$(verify_dev "$d")" = ok ] || return 1
    return 0
}

# The devices as this script sees them without CUDA_VISIBLE_DEVICES changes
# (from the baseline run): their UUIDs define "physical 0" and "physical 1".
P0=""
P1=""

# 1. baseline without the shim: both devices reach a 1 GiB hard stop.
exp="each device: bytes=1024 MiB (hard stop), VERIFYDEV ok; rc=0"
if [ -n "$CAPCHECK" ]; then
    run_cmd twodev-noshim "$CU_TIMEOUT" "${NOSHIM[@]}" "$CAPCHECK" twodev "$GiB"
    note=$(rc_note)
    ok=1
    [ "$RC" = 0 ] || ok=0
    for d in 0 1; do
        line=$(dev_line "$d")
        want_kv bytes "$GiB"
        want_kv stop limit
        [ "$(verify_dev "$d")" = ok ] || ok=0
    done
    P0=$(kv uuid "$(dev_line 0)")
    P1=$(kv uuid "$(dev_line 1)")
    order="CUDA order vs nvidia-smi: unknown"
    if ((${#SMI_UUIDS[@]} >= 2)) && [ "$BASE_CVD_SET" = 0 ]; then
        if [ "$(lower "$P0")" = "$(lower "${SMI_UUIDS[0]}")" ] && [ "$(lower "$P1")" = "$(lower "${SMI_UUIDS[1]}")" ]; then
            order="CUDA order = nvidia-smi order"
        else
            order="CUDA order differs from nvidia-smi order"
        fi
    fi
    add_row "twodev, no shim, stop 1 GiB per device" "$exp" \
        "${note:+$note; }$(dev_obs 0)$(dev_obs 1)$order; rc=$RC" "$(verdict)"
else
    add_row "twodev, no shim, stop 1 GiB per device" "$exp" "not built" FAIL
fi

# The physical GPU 1 for the UUID rows: the baseline's device 1, else
# nvidia-smi's second UUID.
PHYS1=$P1
if [[ $PHYS1 != GPU-* ]] && ((${#SMI_UUIDS[@]} >= 2)); then PHYS1=${SMI_UUIDS[1]}; fi
PHYS0=$P0
if [[ $PHYS0 != GPU-* ]] && ((${#SMI_UUIDS[@]} >= 2)); then PHYS0=${SMI_UUIDS[0]}; fi
# Key: the first group of hex digits (GPU-xxxxxxxx), or the whole UUID when
# that would also match the other GPU.
UKEY=""
if [[ $PHYS1 == GPU-* ]]; then
    UKEY="GPU-$(printf '%s' "${PHYS1#GPU-}" | cut -d- -f1)"
    if [ -n "$PHYS0" ] && [[ $(lower "$PHYS0") == $(lower "$UKEY")* ]]; then UKEY=$PHYS1; fi
fi

# run_twodev ROW EXP NAME MODE LIMIT CVD(or "-" for inherited) : runs capcheck
# MODE under the shim; sets note and ok (0 already when the exit status is not
# 0). Without capcheck or the shim the row is FAIL and it returns 1.
run_twodev() {
    local row=$1 exp=$2 name=$3 mode=$4 limit=$5 cvd=$6
    if [ -z "$CAPCHECK" ] || [ "$HAVE_SHIM" != 1 ]; then
        add_row "$row" "$exp" "capcheck not built or shim missing" FAIL
        return 1
    fi
    local -a cmd=("${WITHSHIM[@]}" "VRAMCAP_LIMIT=$limit")
    [ "$cvd" != - ] && cmd+=("CUDA_VISIBLE_DEVICES=$cvd")
    run_cmd "$name" "$CU_TIMEOUT" "${cmd[@]}" "$CAPCHECK" "$mode" "$MAXB"
    note=$(rc_note)
    ok=1
    [ "$RC" = 0 ] || ok=0
}

# 2/3. ordinal limits, one thread and two threads.
for mode in twodev twodev-thread; do
    rowname="$mode, VRAMCAP_LIMIT=0=2GiB,1=3GiB"
    exp="dev0: $(mib $((CAP0 - CHUNK))) < bytes <= $(mib $CAP0), dev1: $(mib $((CAP1 - CHUNK))) < bytes <= $(mib $CAP1); each err=2, total=its cap, one more chunk refused (again_err=2), VERIFYDEV ok; rc=0"
    run_twodev "$rowname" "$exp" "$mode-ordinal" "$mode" "0=2GiB,1=3GiB" - || continue
    capped_ok 0 "$CAP0" || ok=0
    capped_ok 1 "$CAP1" || ok=0
    add_row "$rowname" "$exp" "${note:+$note; }$(dev_obs 0)$(dev_obs 1)rc=$RC" "$(verdict)"
done

# 4. ordinal limits with the visible order swapped: the caps follow the order
# the process sees (its device 0 is physical 1 and gets 2 GiB).
rowname="twodev, VRAMCAP_LIMIT=0=2GiB,1=3GiB, CUDA_VISIBLE_DEVICES=$SWAP_CVD"
exp="visible dev0 is physical 1 (uuid), dev0 capped at $(mib $CAP0), dev1 at $(mib $CAP1) (criteria as above)"
if run_twodev "$rowname" "$exp" twodev-ordinal-swapped twodev "0=2GiB,1=3GiB" "$SWAP_CVD"; then
    u0=$(kv uuid "$(dev_line 0)")
    swapped=no
    if [[ $PHYS1 == GPU-* ]] && [ "$(lower "$u0")" = "$(lower "$PHYS1")" ]; then swapped=yes; fi
    [ "$swapped" = yes ] || ok=0
    capped_ok 0 "$CAP0" || ok=0
    capped_ok 1 "$CAP1" || ok=0
    add_row "$rowname" "$exp" "${note:+$note; }dev0 is physical 1: $swapped; $(dev_obs 0)$(dev_obs 1)rc=$RC" "$(verdict)"
fi

# 5/6. UUID key: physical GPU 1 gets 1 GiB whatever its visible index; the
# other one the default 2 GiB.
for cvd in - "$SWAP_CVD"; do
    if [ "$cvd" = - ]; then
        rowname="twodev, VRAMCAP_LIMIT=<uuid prefix of physical 1>=1GiB,2GiB"
        name=twodev-uuid
    else
        rowname="twodev, VRAMCAP_LIMIT=<uuid prefix of physical 1>=1GiB,2GiB, CUDA_VISIBLE_DEVICES=$cvd"
        name=twodev-uuid-swapped
    fi
    exp="the device whose uuid is physical 1's capped at $(mib $UCAP), the other at $(mib $UDEF) (criteria as above)"
    if [ -n "$CAPCHECK" ] && [ "$HAVE_SHIM" = 1 ] && [ -z "$UKEY" ]; then
        add_row "$rowname" "$exp" "no UUID for physical GPU 1 (baseline and nvidia-smi gave none)" FAIL
        continue
    fi
    run_twodev "$rowname" "$exp" "$name" twodev "$UKEY=1GiB,2GiB" "$cvd" || continue
    seen1=none
    for d in 0 1; do
        u=$(kv uuid "$(dev_line "$d")")
        if [ "$(lower "$u")" = "$(lower "$PHYS1")" ]; then
            want=$UCAP
            seen1=dev$d
        else
            want=$UDEF
        fi
        capped_ok "$d" "$want" || ok=0
    done
    [ "$seen1" != none ] || ok=0
    add_row "$rowname" "$exp" "${note:+$note; }key $UKEY; physical 1 is $seen1; $(dev_obs 0)$(dev_obs 1)rc=$RC" "$(verdict)"
done

# 7. a key that names no GPU: the process stops, and the line lists both GPUs.
rowname="twodev, VRAMCAP_LIMIT=GPU-ffffffff=1GiB,2GiB (names no GPU)"
exp="the process stops before allocating (rc != 0); its one line lists both GPUs' UUIDs"
if run_twodev "$rowname" "$exp" twodev-unmatched twodev "GPU-ffffffff=1GiB,2GiB" -; then
    # It must stop: exit status 0 would mean it ran without the cap it asked
    # for; 124 or 137, that it hung.
    ok=1
    case $RC in 0 | 124 | 137) ok=0 ;; esac
    line=$(grep -a "GPU-ffffffff" "$ERRF" | head -n 1)
    for u in "$PHYS0" "$PHYS1"; do
        [[ $u == GPU-* ]] && grep -qi -- "$u" <<<"$line" || ok=0
    done
    add_row "$rowname" "$exp" "rc=$RC; $(printf '%s' "$line" | cut -c1-400)" "$(verdict)"
fi

# 8/9. PyTorch on both devices (scripts/gpu/check_2gpu.py): each context is
# charged to its own device; a live cap change on one device leaves the other.
export VRAMCAP_STATS_DIR=$WORK/stats
py2() { # NAME MODE : check_2gpu.py MODE under the shim at 8 GiB per device; sets line
    run_cmd "$1" 180 "${WITHSHIM[@]}" VRAMCAP_LIMIT=8GiB "$PYTHON" "$GPU_SRC/check_2gpu.py" "$2" --cli "$CLI"
    line=$(result_line "$OUTF" RESULTKV)
    ok=1
    [ "$RC" = 0 ] && [ -n "$line" ] || ok=0
}
py2 torch-context context
for d in 0 1; do
    c=$(kv "ctx${d}_mib" "$line")
    u=$(kv "used${d}_mib" "$line")
    n=$(kv "nvml${d}_mib" "$line")
    isint "$c" && isint "$u" && isint "$n" && ((c >= 100 && u >= c && (u - n <= 64 && n - u <= 64))) || ok=0
done
add_row "PyTorch, 256 MiB on cuda:0 and 512 MiB on cuda:1: the contexts" \
    "each device's context (>= 100 MiB) is charged there; held within 64 MiB of NVML's figure for the process on that GPU" \
    "$(rc_note)${line:-no result}" "$(verdict)"
py2 torch-live live
want_kv limit_rc 0
want_kv total0 $((8 * GiB))
want_kv total1 $((2 * GiB))
want_kv extra0 fits
want_kv extra1 refused
add_row "PyTorch on both devices, \`vramcap limit -i <uuid of 1> 2GiB\` from inside" \
    "exit 0; device 1's total 2 GiB and 1.5 GiB more refused; device 0's total 8 GiB and 1.5 GiB more fits" \
    "$(rc_note)${line:-no result}" "$(verdict)"

# ---------------------------------------------------------------- report

gpu_report
