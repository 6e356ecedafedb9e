#!/usr/bin/env bash
# gpu-python.sh DIR — issue 35 on the GPU machine: PyTorch capped with
# no launcher, from the release wheel (DIR/vramcap-*.whl, from
# scripts/package.sh) installed offline into a fresh virtual environment
# that sees PYTHON's packages (torch). DIR/jupyter-wheels/, when there (pip
# download of jupyter_client and ipykernel for the GPU machine's Python),
# goes in too, for the Jupyter row. Rows: VRAMCAP_LIMIT=2GiB python
# check_torch.py; a script whose first line is vramcap.set_limit(0,
# "2GiB"), started with plain python; NotActive after CUDA is up;
# vramcap.torch beside torch.cuda; a kernel from `vramcap kernel install
# --limit 2GiB` started by jupyter_client; interpreter start with and
# without the .pth. Table last; log in ${OUT:-/tmp}/gpu-python.log.
set -u
NAME=gpu-python
# shellcheck source-path=SCRIPTDIR source=gpu/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/gpu/lib.sh"
gpu_args 13 "$@"
gpu_setup "$1"
BUDGET_S=${BUDGET_S:-420}
need_timeout
gpu_commit
gpu_smi
HEADER="vramcap gpu-python — $(date -u '+%Y-%m-%d %H:%M:%S UTC') — commit $COMMIT — GPU $GPU_NAME, driver $GPU_DRIVER"
export VRAMCAP_STATS_DIR=$WORK/stats
G=$GiB
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
site=$(echo "$venv"/lib/python3*/site-packages)
"$PYTHON" -c 'import sys; print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' \
    >"$site/outer-packages.pth" || ok=0
run_cmd pip 120 env PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/pip" install --no-index --no-deps --no-cache-dir "$whl"
[ "$RC" = 0 ] || ok=0
[ -f "$site/vramcap_autostart.pth" ] || ok=0
add_row "pip install $(basename "$whl") into a fresh venv (offline)" "exit 0; site-packages/vramcap_autostart.pth" "rc=$RC; $([ -f "$site/vramcap_autostart.pth" ] && echo 'the .pth is there' || echo 'no .pth')" "$(verdict)"
PY=$venv/bin/python
# No launcher and no LD_PRELOAD in any row.
bare=(env -u LD_PRELOAD -u VRAMCAP_LIBRARY -u VRAMCAP_LIMIT -u VRAMCAP_GROUP)

run_cmd env-limit 180 "${bare[@]}" VRAMCAP_LIMIT=2GiB "$PY" "$GPU_SRC/check_torch.py" --max-bytes $((4 * G))
line=$(result_line "$OUTF" RESULTKV)
ok=1
[ "$RC" = 0 ] || ok=0
want_kv total $((2 * G))
want_kv oom 1
want_in bytes $((1 * G)) $((2 * G))
add_row "VRAMCAP_LIMIT=2GiB python check_torch.py (the .pth alone)" "total 2 GiB, torch.OutOfMemoryError, 1..2 GiB filled" \
    "rc=$RC; $(printf '%s' "$line" | cut -c1-300)" "$(verdict)"

cat >"$WORK/train.py" <<EOF
import vramcap; vramcap.set_limit(0, "2GiB")
import runpy, sys
sys.path.insert(0, "$GPU_SRC")
sys.argv = ["check_torch.py", "--max-bytes", "$((4 * G))"]
runpy.run_path("$GPU_SRC/check_torch.py", run_name="__main__")
EOF
run_cmd set-limit 180 "${bare[@]}" "$PY" "$WORK/train.py"
line=$(result_line "$OUTF" RESULTKV)
ok=1
[ "$RC" = 0 ] || ok=0
want_kv total $((2 * G))
want_kv oom 1
want_in bytes $((1 * G)) $((2 * G))
said="vramcap: set_limit(0, '2GiB'): restarting this program under libvramcap.so with VRAMCAP_LIMIT=0=2GiB"
grep -qxF "$said" "$ERRF" || ok=0
add_row "python train.py, first line vramcap.set_limit(0, \"2GiB\")" "one restart line; total 2 GiB, OOM, 1..2 GiB filled" \
    "rc=$RC; $(grep -c 'restarting this program' "$ERRF") restart line(s); $(printf '%s' "$line" | cut -c1-300)" "$(verdict)"

run_cmd after-cuda 120 "${bare[@]}" "$PY" -c '
import vramcap._autostart as a
import torch
print("LOADED_AFTER_IMPORT", int(a.cuda_loaded()))
torch.zeros(1, device="cuda")
import vramcap
try:
    vramcap.set_limit(0, "2GiB")
except vramcap.NotActive as e:
    print("NOTACTIVE", e)'
ok=1
grep -q "^NOTACTIVE set_limit(0, '2GiB'): libvramcap.so is not loaded and CUDA is initialised in this process already, and the shim must be there first; start it as: .*vramcap run --limit 0=2GiB -- " "$OUTF" || ok=0
add_row "set_limit after torch.zeros(1, device='cuda')" "NotActive naming vramcap run --limit 0=2GiB" \
    "rc=$RC; $(grep -o 'LOADED_AFTER_IMPORT [01]' "$OUTF") (libcuda after import torch); $(grep -m1 '^NOTACTIVE' "$OUTF" | cut -c1-220)" "$(verdict)"

run_cmd vramcap-torch 120 "${bare[@]}" VRAMCAP_LIMIT=4GiB "$PY" -c '
import vramcap.torch as vt
vt.set_limit("cuda:0", 2 * 1024**3)
import torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
s = vt.memory_stats(0)
print("VT", "limit=%d" % vt.get_limit(0), "alloc=%d" % s["allocated_bytes.all.current"],
      "reserved=%d" % s["reserved_bytes.all.current"], "torch_reserved=%d" % torch.cuda.memory_reserved(0),
      "total=%d" % torch.cuda.mem_get_info()[1], "vt_total=%d" % vt.mem_get_info(0)[1])'
line=$(result_line "$OUTF" VT)
ok=1
[ "$RC" = 0 ] || ok=0
want_kv limit $((2 * G))
want_kv total $((2 * G))
want_kv vt_total $((2 * G))
a=$(kv alloc "$line")
r=$(kv reserved "$line")
t=$(kv torch_reserved "$line")
isint "$a" && isint "$r" && isint "$t" && ((a >= t && r >= a && t >= G)) || ok=0
add_row "vramcap.torch beside torch.cuda (VRAMCAP_LIMIT=4GiB, lowered to 2 GiB)" \
    "limit and totals 2 GiB; reserved >= allocated >= torch.cuda.memory_reserved >= 1 GiB" "rc=$RC; $line" "$(verdict)"

ok=1
if [ -d "$ART/jupyter-wheels" ]; then
    run_cmd jupyter-pip 180 env PIP_DISABLE_PIP_VERSION_CHECK=1 "$venv/bin/pip" install --no-index --no-cache-dir \
        --find-links "$ART/jupyter-wheels" jupyter_client ipykernel
fi
run_cmd kernel-install 60 "${bare[@]}" JUPYTER_DATA_DIR="$WORK/jupyter" "$venv/bin/vramcap" kernel install --limit 2GiB
[ "$RC" = 0 ] || ok=0
install_line=$(head -n 1 "$OUTF")
run_cmd kernel 300 "${bare[@]}" JUPYTER_DATA_DIR="$WORK/jupyter" JUPYTER_RUNTIME_DIR="$WORK/jupyter-run" \
    "$PY" "$GPU_SRC/check_kernel.py" vramcap-2gib $((1 * G))
line=$(result_line "$OUTF" RESULTKV)
[ "$RC" = 0 ] || ok=0
want_kv pid_match 1
want_kv active True
want_kv total $((2 * G))
want_kv oom 1
want_in filled_mib 1024 2048
want_kv lowered_limit $((1 * G))
want_kv lowered_total $((1 * G))
add_row "kernel from vramcap kernel install --limit 2GiB, by jupyter_client" \
    "the kernel is KernelManager's process, under the shim; total 2 GiB; OOM at 1..2 GiB; set_limit 1 GiB from a cell" \
    "rc=$RC; $install_line; $line$([ "$RC" = 0 ] || tail -n 1 "$ERRF" | cut -c1-200)" "$(verdict)"

run_cmd start 300 "${bare[@]}" "$PY" "$ROOT/scripts/bench-python-start.py" --venv "$venv" --runs 150 --set
ok=1
[ "$RC" = 0 ] || ok=0
add_row "python -c pass, with and without the .pth (150 interleaved runs)" "difference within noise (goal < 2 ms)" \
    "rc=$RC; $(grep -E '^(with|without|difference|site|VRAMCAP_LIMIT set)' "$OUTF" | sed 's/  */ /g' | tr '\n' ';' | cut -c1-600)" "$(verdict)"
gpu_report
