"""Issue 34: what parking's entry gate costs when parking is enabled but
unused. ../park_gate_cost.cu runs --rounds times (at least 3) in each of
three variants, interleaved (../gate_cost.py): no shim, the shim with
VRAMCAP_PARK unset, the shim with VRAMCAP_PARK=manual. The row holds the
launches (<<<>>> and cuLaunchKernel through the runtime's entry point) and
the cache-hit pair (issue 43, done-when 6) to at most 1.05 times their
cost with parking off, shows that the unhooked
functions were forwarders only with parking on, and notes every figure
(scripts/bench_gate.py prints the same as a table).
"""
import pytest

import gate_cost

pytestmark = pytest.mark.park

BOUND = 1.05


def test_park_gate_cost(request, gpu, runner, build, check):
    rounds = max(3, request.config.getoption("--rounds"))
    check.title = ("parking's gate: an empty kernel's launch (<<<>>>, cuLaunchKernel) and unhooked calls "
                   "(cuCtxGetCurrent, cuStreamQuery) and the cache-hit pair, no shim / VRAMCAP_PARK unset / VRAMCAP_PARK=manual, "
                   "%d interleaved rounds, VRAMCAP_PARK_MOVE=%s" % (rounds, gpu.park_move or "unset"))
    prog = build("park_gate_cost")
    got, failed = gate_cost.measure(runner, prog, gpu.shim, rounds, park_move=gpu.park_move,
                                    CUDA_VISIBLE_DEVICES=gpu.uuid0 or "0")
    for r in failed:
        check.ran(r)
    for k in ("launch_rt_ns", "launch_drv_ns", "alloc_pair_ns"):
        off, park = gate_cost.figure(got, "off", k), gate_cost.figure(got, "park", k)
        r = park / off if off and park and off > 0 else None
        check.at_most("%s: parking on / off" % k, r, BOUND, show=lambda x: "%.3f" % x)
    # The forwarders were used exactly when parking was on.
    for v, want in (("off", "libcuda.so.1"), ("park", "libvramcap.so")):
        for k in ("lib_launch", "lib_ctx", "lib_query"):
            check.eq("%s %s" % (v, k), sorted(got[v].get(k, ())), [want])
    for line in gate_cost.table(got):
        if line.startswith("| ") and not line.startswith("| what"):
            check.note(line)
