#!/usr/bin/env bash
# stage-gpu.sh [BASELINE] - stages what a GPU run needs in .gpu/ (kept out
# of git through .git/info/exclude), small enough to carry (64 MiB): the
# release shim and CLI of the working tree, stripped, with COMMIT naming
# them; and with BASELINE (a commit, e.g. e446e89) that commit's shim and
# CLI in .gpu/base/ for side-by-side rows, e.g.
#   scripts/gpu-check.sh --artefacts .gpu -m tiered --tiered-models llama \
#       --tiered-ratios 1.5 --tiered-variants "e446e89=.gpu/base/libvramcap.so"
#   python3 scripts/gpu_bench.py --artefacts .gpu/base; ... --artefacts .gpu
# The baseline is built in a worktree under target/ (target/bench-baseline,
# which scripts/bench-hit-path.sh shares).
set -euo pipefail
cd "$(dirname "$0")/.."
baseline=${1:-}

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"

stage() { # stage DIR TARGET_DIR COMMIT
    mkdir -p "$1"
    for f in libvramcap.so vramcap; do
        cp "$2/release/$f" "$1/$f"
        strip "$1/$f"
    done
    echo "$3" >"$1/COMMIT"
}

cargo build -q --release --locked -p vramcap-shim -p vramcap
rm -rf .gpu
stage .gpu target "$(git describe --always --dirty)"
if [ -n "$baseline" ]; then
    wt=target/bench-baseline
    if [ -d "$wt" ]; then
        git -C "$wt" checkout -q --detach "$baseline"
    else
        git worktree add -q --detach "$wt" "$baseline"
    fi
    (cd "$wt" && cargo build -q --release -p vramcap-shim -p vramcap)
    stage .gpu/base "$wt/target" "$(git -C "$wt" describe --always)"
fi
du -sh .gpu
