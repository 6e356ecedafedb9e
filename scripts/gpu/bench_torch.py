#!/usr/bin/env python3
"""PyTorch training-step benchmark for vramcap (not a test).

MLP of 8 x Linear(4096, 4096) with ReLU between them, batch 256, float32,
AdamW, MSE loss against a fixed random target. TF32 is switched off for
matmuls and cuDNN so every variant does the same arithmetic. Warms up for
--warmup steps, then times --steps steps between two torch.cuda.synchronize()
calls and prints:

  INFO total=.. free=..            (torch.cuda.mem_get_info, shows a cap in force)
  BENCH what=torch_mlp_step steps=200 ms_per_step=..

Exit status 0 on success, 1 on error, 3 when torch/CUDA is missing.
"""
import argparse
import sys
import time
import traceback


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    args.steps = max(1, args.steps)
    args.warmup = max(0, args.warmup)
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001
        print("ERROR import torch failed: %r" % (e,), flush=True)
        return 3
    if not torch.cuda.is_available():
        print("ERROR torch.cuda.is_available() is False", flush=True)
        return 3
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.manual_seed(0)
        dev = torch.device("cuda", 0)
        free, total = torch.cuda.mem_get_info(0)
        print("INFO total=%d free=%d" % (total, free), flush=True)

        layers = []
        for i in range(8):
            layers.append(nn.Linear(4096, 4096))
            if i < 7:
                layers.append(nn.ReLU())
        model = nn.Sequential(*layers).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(256, 4096, device=dev)
        y = torch.randn(256, 4096, device=dev)

        def step():
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            return loss

        for _ in range(args.warmup):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        lv = float(loss.item())
        ms = (t1 - t0) * 1000.0 / args.steps
        print("BENCH what=torch_mlp_step steps=%d ms_per_step=%.4f loss=%.6g max_reserved=%d"
              % (args.steps, ms, lv, torch.cuda.max_memory_reserved(0)), flush=True)
        if lv != lv:  # NaN
            print("ERROR loss is NaN", flush=True)
            return 1
        return 0
    except Exception as e:  # noqa: BLE001
        print("ERROR %s: %s" % (type(e).__name__, " ".join(str(e).split())[:500]), flush=True)
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
