"""Where a capped run's extra time goes, kernel by kernel.

Usage: kernel_delta.py REF RUN

REF and RUN are kernel lists written by check_tiered.py --profile (index,
microseconds, name; the same two steps of the same program): REF uncapped,
RUN under a cap. Prints REPORT lines: the GPU time a step spends in
kernels in each, and the difference by kind of kernel (matrix products and
convolutions by the words tier.rs's is_product looks for, the optimizer's
multi-tensor and fused kernels, everything else) and by kernel name, the
largest first. When both ran the same kernels in the same order, the
largest differences of single launches are listed too, with their index in
the two steps.
"""

import sys
from collections import defaultdict

PRODUCT = ["gemm", "gemv", "xmma", "cutlass", "convolve", "convolution", "fprop", "dgrad", "wgrad", "matmul", "_mm_"]
OPTIMIZER = ["multi_tensor_apply", "foreach", "fused_adam", "adam"]


def kind(name: str) -> str:
    n = name.lower()
    if any(w in n for w in PRODUCT):
        return "product"
    if any(w in n for w in OPTIMIZER):
        return "optimizer"
    return "other"


def load(path):
    rows = []
    for line in open(path, errors="replace"):
        parts = line.rstrip("\n").split("\t", 2)
        if len(parts) == 3:
            rows.append((float(parts[1]), parts[2]))
    return rows


def short(name: str, n: int = 90) -> str:
    return name if len(name) <= n else name[: n - 3] + "..."


def main() -> int:
    ref, run = load(sys.argv[1]), load(sys.argv[2])
    if not ref or not run:
        print(f"REPORT no kernels in {'the reference' if not ref else 'the run'}")
        return 1
    tr, tc = sum(u for u, _ in ref) / 2, sum(u for u, _ in run) / 2
    print(f"REPORT kernels a step: {len(ref) // 2} uncapped, {len(run) // 2} capped")
    print(f"REPORT GPU time in kernels a step: {tr / 1000:.1f} ms uncapped, {tc / 1000:.1f} ms capped (+{(tc - tr) / 1000:.1f} ms)")
    by_kind = defaultdict(lambda: [0.0, 0.0])
    by_name = defaultdict(lambda: [0.0, 0.0, 0])
    for i, rows in enumerate((ref, run)):
        for us, name in rows:
            by_kind[kind(name)][i] += us / 2
            by_name[name][i] += us / 2
            if i == 0:
                by_name[name][2] += 1
    print("REPORT | kind | uncapped ms | capped ms | difference ms |")
    print("REPORT |---|---|---|---|")
    for k in sorted(by_kind, key=lambda k: by_kind[k][0] - by_kind[k][1]):
        a, b = by_kind[k]
        print(f"REPORT | {k} | {a / 1000:.1f} | {b / 1000:.1f} | {(b - a) / 1000:+.1f} |")
    print("REPORT | kernel (largest differences) | launches a step | uncapped ms | capped ms | difference ms |")
    print("REPORT |---|---|---|---|---|")
    for name in sorted(by_name, key=lambda n: by_name[n][0] - by_name[n][1])[:15]:
        a, b, c = by_name[name]
        print(f"REPORT | {short(name)} | {c // 2} | {a / 1000:.2f} | {b / 1000:.2f} | {(b - a) / 1000:+.2f} |")
    if len(ref) == len(run) and all(a[1] == b[1] for a, b in zip(ref, run)):
        per = len(ref) // 2
        d = sorted(range(len(ref)), key=lambda i: ref[i][0] - run[i][0])[:15]
        print("REPORT | launch (index in its step) | uncapped us | capped us |")
        print("REPORT |---|---|---|")
        for i in d:
            print(f"REPORT | {i % per} of {per}: {short(ref[i][1], 70)} | {ref[i][0]:.0f} | {run[i][0]:.0f} |")
    else:
        print("REPORT the two runs did not launch the same kernels in the same order; no launch-by-launch list")
    return 0


if __name__ == "__main__":
    sys.exit(main())
