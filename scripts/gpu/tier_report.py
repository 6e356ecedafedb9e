"""Where tiered spill put a training run's memory, by what the memory holds.

Usage: tier_report.py STDERR STDOUT STEPS

STDERR is the run's log at VRAMCAP_LOG=debug (the block table a round
prints every 50 rounds: the last complete one is used); STDOUT holds the
TENSORMAP lines of check_tiered.py --map. Each block is named by the
category that holds most of its bytes (param, grad, exp_avg, exp_avg_sq;
"other" for blocks no such tensor lies in: activations and workspaces in
PyTorch's cache). Prints, per category, the MiB on the device and on the
host, the weighted uses per block per step (and the plain count, in
logs of builds before it was dropped from the launch path), and the
blocks' scores (passes over each byte, decayed: what placement ranks by)
on the device and on the host, as median (lowest-highest).
"""

import re
import sys
from collections import defaultdict

BLOCK = re.compile(
    r"round (\d+): block (0x[0-9a-f]+) (\d+) bytes on the (device|host) score ([0-9.]+)(?: uses (\d+))? weighted (\d+)"
)


def spread(v):
    """Median (lowest-highest) of a list of scores; "-" when empty."""
    if not v:
        return "-"
    v = sorted(v)
    return f"{v[len(v) // 2]:.1f} ({v[0]:.1f}-{v[-1]:.1f})"


def main() -> int:
    err, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tables = defaultdict(list)
    for line in open(err, errors="replace"):
        m = BLOCK.search(line)
        if m:
            tables[int(m.group(1))].append(m.groups()[1:])
    if not tables:
        print("REPORT no block table in the log (VRAMCAP_LOG=debug, a run of 50 rounds or more)")
        return 1
    rounds = sorted(tables)
    table = tables[rounds[-1]]
    tensors = []
    for line in open(out, errors="replace"):
        if line.startswith("TENSORMAP "):
            _, cat, ptr, n = line.split()
            tensors.append((int(ptr, 16), int(n), cat))
    tensors.sort()
    rows = defaultdict(lambda: [0, 0, 0, 0, 0])  # dev MiB, host MiB, blocks, uses, weighted
    scores = defaultdict(lambda: ([], []))  # on the device, on the host
    for ptr, n, place, score, uses, weighted in table:
        start, size = int(ptr, 16), int(n)
        held = defaultdict(int)
        for tp, tn, cat in tensors:
            if tp >= start + size:
                break
            lo, hi = max(tp, start), min(tp + tn, start + size)
            if hi > lo:
                held[cat] += hi - lo
        cat = max(held, key=held.get) if held else "other"
        r = rows[cat]
        r[0 if place == "device" else 1] += size / 2**20
        r[2] += 1
        r[3] = None if uses is None or r[3] is None else r[3] + int(uses)
        r[4] += int(weighted)
        scores[cat][0 if place == "device" else 1].append(float(score))
    print(f"REPORT round {rounds[-1]}, {len(table)} blocks, {steps} steps")
    print(
        "REPORT | holds | blocks | MiB on the device | MiB on the host | uses per block per step | weighted "
        "| score on the device | score on the host |"
    )
    print("REPORT |---|---|---|---|---|---|---|---|")
    for cat in sorted(rows):
        d, h, b, u, w = rows[cat]
        plain = "-" if u is None else f"{u / b / steps:.1f}"
        on = " | ".join(spread(v) for v in scores[cat])
        print(f"REPORT | {cat} | {b} | {d:.0f} | {h:.0f} | {plain} | {w / b / steps:.1f} | {on} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
