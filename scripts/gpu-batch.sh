#!/usr/bin/env bash
# gpu-batch.sh STEP... - runs named GPU checks one after the other on the
# GPU machine, each under its own time limit, against the artefacts that
# scripts/stage-gpu.sh staged (.gpu/, and .gpu/base/ for side-by-side
# rows), and leaves in $OUT what comes back from there (at most 8 files):
# each step's table (STEP.md) and one tarball of everything (batch.tgz:
# every log, every process's output). A step cut by its limit still
# leaves what it wrote. Steps, with their limits (seconds):
#   park       -m park, every row with the default move (shim, since
#              session 20)                                    (540)
#   park-ck    -m park, every row with VRAMCAP_PARK_MOVE=checkpoint (the
#              swap-time row runs only here)                  (540)
#   park-shim  -m park, every row with VRAMCAP_PARK_MOVE=shim+checkpoint (540)
#   park-s     -m park, every row with VRAMCAP_PARK_MOVE=shim, the trainers
#              beside the baseline's parking                    (480)
#   park-fix   the idle notebook and JAX rows with VRAMCAP_PARK_MOVE=shim (240)
#   park-rest  the JAX, 100 cycles, CUDA graph pool and gate cost rows
#              with VRAMCAP_PARK_MOVE=shim (the graph row runs both the
#              shim's moves and shim+checkpoint)              (480)
#   fhl        -m "full or held or live"                      (280)
#   tiered     tiered Llama at 1.5x beside .gpu/base             (300)
#   bench      gpu_bench.py: the cache-hit pair, the PyTorch step (260)
#   bench-base gpu_bench.py on .gpu/base, the pairs only        (120)
#   gate       bench_gate.py, parking by the shim's moves: launches and
#              the PyTorch step with parking on and unused       (260)
#   hostmem    research/host_create.cu, 8 GiB                  (120)
#   calls      research/hit_calls.cu: each driver call of a cache hit (60)
#   busyremap  research/busy_remap.cu: whether the VMM calls and a copy
#              wait for unrelated work still running            (60)
#   unmapped   research/unmapped_query.cu: what pointer queries and the
#              like answer about an address whose memory is unmapped, as
#              a parked block's is                              (60)
# e.g. (one device call must end within 600 s):
#   bash scripts/gpu-batch.sh fhl tiered
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${OUT:?OUT names the folder that comes back}
work=$(mktemp -d /tmp/gpu-batch.XXXXXX)
base=.gpu/base
[ -d .gpu ] || { echo "gpu-batch: no .gpu/ (run scripts/stage-gpu.sh here first)" >&2; exit 2; }
# The baseline's parking beside this build's (the two trainers), when staged.
park_base=()
[ -f "$base/libvramcap.so" ] && park_base=(--park-baseline "$base/libvramcap.so")

run_step() { # run_step NAME LIMIT COMMAND...
    local name=$1 limit=$2
    shift 2
    mkdir -p "$work/$name"
    echo "== $name (at most ${limit}s) $(date -u +%H:%M:%S)"
    timeout -s INT -k 10 "$limit" "$@" >"$work/$name/stdout.txt" 2>&1
    echo "== $name: exit $? $(date -u +%H:%M:%S)"
}

check() { # check NAME LIMIT ARGS... (the pytest suite, budget 30 s under the limit)
    local name=$1 limit=$2
    shift 2
    run_step "$name" "$limit" bash scripts/gpu-check.sh --artefacts .gpu --out "$work/$name" \
        --name "$name" --budget $((limit - 30)) "$@"
}

probe() { # probe NAME LIMIT PROGRAM ARGS... (scripts/gpu/research/PROGRAM.cu, built here)
    local name=$1 limit=$2 program=$3
    shift 3
    mkdir -p "$work/$name"
    if /usr/local/cuda/bin/nvcc -O2 -arch=sm_90 -o "$work/$name/$program" \
        "scripts/gpu/research/$program.cu" -lcuda >"$work/$name/build.txt" 2>&1; then
        run_step "$name" "$limit" "$work/$name/$program" "$@"
    else
        echo "gpu-batch: $program did not build ($name/build.txt):"
        cat "$work/$name/build.txt"
    fi
}

for step in "$@"; do
    case $step in
    park) check park 540 -m park ;;
    park-ck) check park-ck 540 -m park --park-move checkpoint ;;
    park-shim) check park-shim 540 -m park --park-move shim+checkpoint ;;
    park-s) check park-s 480 -m park --park-move shim "${park_base[@]}" ;;
    park-fix) check park-fix 240 -m park -k "parked_by_idle or jax" --park-move shim ;;
    park-rest) check park-rest 480 -m park -k "jax or hundred or graph or gate" --park-move shim ;;
    fhl) check fhl 280 -m "full or held or live" ;;
    tiered)
        [ -f "$base/libvramcap.so" ] || { echo "gpu-batch: tiered needs $base (stage-gpu.sh BASELINE)"; continue; }
        check tiered 300 -m tiered -k "reference or capped" --tiered-models llama --tiered-ratios 1.5 \
            --tiered-variants "$(cat "$base/COMMIT")=$base/libvramcap.so"
        ;;
    bench)
        run_step bench 260 python3 scripts/gpu_bench.py --artefacts .gpu --out "$work/bench" \
            --rounds 2 --torch-rounds 4 --budget 220
        ;;
    bench-base)
        run_step bench-base 120 python3 scripts/gpu_bench.py --artefacts "$base" --out "$work/bench-base" \
            --rounds 2 --torch-rounds 0 --budget 90
        ;;
    gate)
        run_step gate 260 python3 scripts/bench_gate.py --artefacts .gpu --out "$work/gate" \
            --park-move shim --rounds 3 --torch-rounds 4 --budget 220
        ;;
    hostmem) probe hostmem 120 host_create 8 ;;
    calls) probe calls 60 hit_calls ;;
    busyremap) probe busyremap 60 busy_remap ;;
    unmapped) probe unmapped 60 unmapped_query ;;
    *) echo "gpu-batch: no step $step (park, park-ck, park-shim, park-s, park-fix, park-rest, fhl, tiered, bench, bench-base, gate, hostmem, calls, busyremap, unmapped)" >&2 ;;
    esac
done
for f in "$work"/*/*.md; do
    [ -e "$f" ] && cp "$f" "$out/$(basename "$(dirname "$f")")-$(basename "$f")"
done
tar czf "$out/batch.tgz" -C "$work" .
ls -la "$out"
cat "$work"/hostmem/stdout.txt "$work"/calls/stdout.txt "$work"/busyremap/stdout.txt "$work"/unmapped/stdout.txt \
    2>/dev/null || true
