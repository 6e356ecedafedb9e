#!/usr/bin/env bash
# gpu-wheel.sh DIR — issue 16 on the GPU machine: the release wheel
# (DIR/vramcap-*.whl, from scripts/package.sh) installed into a fresh
# virtual environment caps PyTorch on the real driver.
#
# The environment sees PYTHON's packages (for torch, through a .pth file);
# the wheel goes in with pip, offline. Rows: `vramcap doctor` on
# the real driver; `vramcap run --limit 2GiB -- python check_torch.py` and
# the same through `python -m vramcap run`: mem_get_info's total 2 GiB,
# torch.OutOfMemoryError at the end, at most 2 GiB filled; the package
# reads the cap from inside. Table last; log in ${OUT:-/tmp}/gpu-wheel.log.
set -u
NAME=gpu-wheel
# shellcheck source-path=SCRIPTDIR source=gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu/lib.sh"
gpu_args 11 "$@"
gpu_setup "$1"
BUDGET_S=${BUDGET_S:-240}
need_timeout
gpu_commit
gpu_smi
HEADER="vramcap gpu-wheel — $(date -u '+%Y-%m-%d %H:%M:%S UTC') — commit $COMMIT — GPU $GPU_NAME, driver $GPU_DRIVER"
export VRAMCAP_STATS_DIR=$WORK/stats
whl=""
for f in "$ART"/vramcap-*.whl; do [ -f "$f" ] && whl=$f && break; done
venv=$WORK/venv
ok=1
if [ -z "$whl" ]; then
    add_row "install the wheel" "pip installs it" "no vramcap-*.whl in $ART" FAIL
    gpu_report
fi
run_cmd venv 120 "$PYTHON" -m venv --system-site-packages "$venv"
[ "$RC" = 0 ] || ok=0
# PYTHON's own packages (torch), also when PYTHON is itself a virtual
# environment, whose packages --system-site-packages does not reach.
"$PYTHON" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' \
    >"$(echo "$venv"/lib/python3*/site-packages)/outer-packages.pth" || ok=0
run_cmd pip 120 env PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/pip" install --no-index --no-deps --no-cache-dir "$whl"
[ "$RC" = 0 ] || ok=0
add_row "pip install $(basename "$whl") into a fresh venv (offline)" "exit 0" "rc=$RC" "$(verdict)"

run_cmd doctor 60 env -u LD_PRELOAD -u VRAMCAP_LIBRARY "$venv/bin/vramcap" doctor
ok=1
[ "$RC" = 0 ] || ok=0
grep -q "^ok    shim: $venv/lib/python3.*/site-packages/vramcap/libvramcap.so" "$OUTF" || ok=0
grep -q '^ok    interposition: ' "$OUTF" || ok=0
add_row "vramcap doctor (the wheel's CLI, the real driver)" "finds the shim in the venv's package; interposition proven" \
    "rc=$RC; $(grep -E '^(ok|FAIL|warn) +(shim|driver|interposition)' "$OUTF" | tr '\n' ';' | cut -c1-400)" "$(verdict)"

G=$GiB
for how in cli module; do
    if [ $how = cli ]; then run=("$venv/bin/vramcap"); else run=("$venv/bin/python" -m vramcap); fi
    run_cmd "torch-$how" 180 env -u LD_PRELOAD -u VRAMCAP_LIBRARY "${run[@]}" run --limit 2GiB -- \
        "$venv/bin/python" "$GPU_SRC/check_torch.py" --max-bytes $((4 * G))
    line=$(result_line "$OUTF" RESULTKV)
    ok=1
    [ "$RC" = 0 ] || ok=0
    want_kv total $((2 * G))
    want_kv oom 1
    want_in bytes $((1 * G)) $((2 * G))
    add_row "$([ $how = cli ] && echo 'vramcap run' || echo 'python -m vramcap run') --limit 2GiB -- python check_torch.py" \
        "total 2 GiB, torch.OutOfMemoryError, 1..2 GiB filled" "rc=$RC; $(printf '%s' "$line" | cut -c1-400)" "$(verdict)"
done

run_cmd inside 120 env -u LD_PRELOAD -u VRAMCAP_LIBRARY "$venv/bin/vramcap" run --limit 2GiB -- "$venv/bin/python" -c \
    'import torch, vramcap; torch.zeros(1, device="cuda"); print("INSIDE", vramcap.is_active(), vramcap.get_limit(0))'
ok=1
grep -qx "INSIDE True $((2 * G))" "$OUTF" || ok=0
add_row "import vramcap under the wheel's vramcap run" "is_active() True, get_limit(0) = 2 GiB" "rc=$RC; $(grep INSIDE "$OUTF" | head -n 1)" "$(verdict)"
gpu_report
