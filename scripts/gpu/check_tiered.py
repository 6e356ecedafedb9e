"""Training under a cap smaller than its working set, for tiered spill.

Usage: check_tiered.py {llama|mlp} [--steps S] [--timed T] [--map] [--save-on-cpu]
                       [--fused-adamw] [--cuda-graph] [--expandable-segments]
                       [--host-state MIB [--host-order avg|sq]] [--profile FILE]

llama: a Llama-style causal LM from `transformers` (random initialisation,
no download): hidden 1024, 16 layers, 16 heads, MLP 2816, vocabulary 32000
(271 M parameters), AdamW, fp32, batch 8 x 512 tokens.
mlp: 8 x Linear(4096) with ReLU, AdamW, batch 256.

--save-on-cpu runs each forward and backward pass inside PyTorch's
torch.autograd.graph.save_on_cpu(pin_memory=True): the program itself keeps
the activations saved for the backward pass in host memory (what a program
that may be changed can do; for comparison with tiered spill).
--fused-adamw uses AdamW(fused=True): one kernel reads and writes each
optimizer state byte once a step, where the default (foreach) makes several
passes. Its losses differ from the default's in the last bits, so it is
compared with an uncapped run of its own.
--cuda-graph runs the whole training step (forward, backward and
AdamW(capturable=True)) as one CUDA graph, as PyTorch's whole-network
capture recipe does: three eager warm-up steps on a side stream, then a
capture, then a replay a step. Every kernel then reaches the driver as part
of cuGraphLaunch, never as a launch of its own. The Llama model is given
a causal mask made once (its own mask making copies from the host, which a
capture refuses) and makes no cache. The warm-up steps' losses
are the first three printed; capture runs nothing and prints none.
--profile FILE runs two more steps after the timed ones under
torch.profiler and writes every kernel they ran to FILE, one a line in the
order the GPU ran them: index, microseconds, name, tab-separated (for
scripts/gpu/kernel_delta.py, which compares two runs kernel by kernel).
Those steps are not timed and their losses are not printed.
--host-state MIB (no shim; what placement by hand costs): after the first
step, AdamW's state tensors, `exp_avg` first, then `exp_avg_sq` (or the
other way round with --host-order sq), are moved into pinned host memory
the GPU reads over the link, until MIB MiB are there; they stay there. The
step time is then what a placement that put exactly these bytes on the host
would cost, tensor by tensor: the floor of zero-copy spill for that many
bytes, whatever a shim can see (it sees segments, not tensors). Prints
`host_state_mib`, the MiB moved.

Deterministic (fixed seeds, TF32 off, deterministic algorithms). Prints one
`RESULTKV` line: `losses` (every step's loss, repr, joined by ','),
`ms_per_step` (median of the last T steps), `first_ms` (the first timed
step), `peak_reserved_mib` (torch's reserved peak), `peak_allocated_mib`
(the peak of what its tensors held), `max_proc_mib` (NVML's
figure for this process, sampled after each step: the driver's own count,
which the shim does not change), `max_dev_used_mib` (the whole GPU's used
memory, NVML, sampled the same way) and `oom`.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)

        def sample():
            mine = 0
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                if p.pid == os.getpid():
                    mine = (p.usedGpuMemory or 0) / 2**20
            return mine, pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20

        return sample
    except Exception:  # noqa: BLE001
        return lambda: (-1, -1)


def profile(torch, step, path):
    """Two steps under torch.profiler; their kernels, in order, to `path`."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(2):
            step()
        torch.cuda.synchronize()
    kernels = []
    for e in p.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA") and e.time_range.elapsed_us() >= 0:
            kernels.append((e.time_range.start, e.time_range.elapsed_us(), e.name))
    kernels.sort()
    with open(path, "w") as f:
        for i, (_, us, name) in enumerate(kernels):
            f.write(f"{i}\t{us}\t{name.replace(chr(9), ' ')}\n")
    print(f"PROFILE {len(kernels)} kernels to {path}")


class HostView:
    """A CUDA array interface over pinned host memory: torch.as_tensor
    makes a CUDA tensor of it that kernels read over the link."""

    def __init__(self, t):
        self.keep = t
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape),
            "typestr": "<f4",
            "data": (t.data_ptr(), False),
            "version": 3,
            "strides": None,
        }


def host_state_step(torch, opt, eager_step, mib, order, moved):
    """eager_step, whose first call is followed by the move of `mib` MiB of
    AdamW state into pinned host memory (module docs); `moved[0]`: bytes."""
    first = [True]
    keys = ["exp_avg", "exp_avg_sq"] if order == "avg" else ["exp_avg_sq", "exp_avg"]

    def step():
        loss = eager_step()
        if first[0]:
            first[0] = False
            want = mib << 20
            for key in keys:
                for st in opt.state.values():
                    t = st.get(key)
                    if moved[0] >= want or t is None or t.dtype != torch.float32:
                        continue
                    h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    h.copy_(t)
                    d = torch.as_tensor(HostView(h), device="cuda")
                    assert d.data_ptr() == h.data_ptr()
                    d.keep = h
                    st[key] = d
                    moved[0] += t.numel() * 4
            torch.cuda.synchronize()
        return loss

    return step


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=["llama", "mlp"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--timed", type=int, default=10)
    ap.add_argument(
        "--save-on-cpu",
        action="store_true",
        help="keep the activations saved for backward in pinned host memory (torch.autograd.graph.save_on_cpu)",
    )
    ap.add_argument(
        "--fused-adamw",
        action="store_true",
        help="AdamW(fused=True): one kernel a step for the optimizer",
    )
    ap.add_argument(
        "--cuda-graph",
        action="store_true",
        help="capture the whole step (forward, backward, optimizer) as one CUDA graph and replay it",
    )
    ap.add_argument(
        "--expandable-segments",
        action="store_true",
        help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: PyTorch maps its memory page by page with cuMemCreate",
    )
    ap.add_argument(
        "--profile",
        metavar="FILE",
        help="after the timed steps, profile two more and write their kernels to FILE",
    )
    ap.add_argument(
        "--host-state",
        type=int,
        default=0,
        metavar="MIB",
        help="after the first step, move this many MiB of AdamW state into pinned host memory the GPU reads (no shim)",
    )
    ap.add_argument("--host-order", choices=["avg", "sq"], default="avg")
    ap.add_argument(
        "--map",
        action="store_true",
        help="print a TENSORMAP line (category, address, bytes) for every parameter, gradient and optimizer state tensor at the end",
    )
    a = ap.parse_args()
    if a.expandable_segments:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    sample = nvml()
    losses, times = [], []
    moved = [0]
    oom = 0
    max_proc = max_dev = 0.0
    try:
        if a.model == "llama":
            from transformers import LlamaConfig, LlamaForCausalLM

            cfg = LlamaConfig(
                vocab_size=32000,
                hidden_size=1024,
                intermediate_size=2816,
                num_hidden_layers=16,
                num_attention_heads=16,
                num_key_value_heads=16,
                max_position_embeddings=512,
                attn_implementation="eager",
            )
            model = LlamaForCausalLM(cfg).cuda()
            g = torch.Generator(device="cuda").manual_seed(1)
            ids = torch.randint(0, 32000, (8, 512), device="cuda", generator=g)

            extra = {}
            if a.cuda_graph:
                # The model's own mask making copies from the host, which a
                # capture refuses; a causal mask made once, as the eager
                # attention adds it, is taken as it is (and the cache, which
                # training does not read, is not made).
                causal = torch.full((512, 512), torch.finfo(torch.float32).min, device="cuda").triu(1)
                extra = {"attention_mask": causal[None, None].expand(8, 1, 512, 512), "use_cache": False}

            def step_loss():
                return model(input_ids=ids, labels=ids, **extra).loss
        else:
            layers = []
            for _ in range(8):
                layers += [torch.nn.Linear(4096, 4096), torch.nn.ReLU()]
            model = torch.nn.Sequential(*layers).cuda()
            x = torch.randn(256, 4096, device="cuda")
            y = torch.randn(256, 4096, device="cuda")

            def step_loss():
                return torch.nn.functional.mse_loss(model(x), y)

        kw = {}
        if a.fused_adamw:
            kw["fused"] = True
        if a.cuda_graph:
            kw["capturable"] = True
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **kw)

        def eager_step():
            opt.zero_grad(set_to_none=True)
            if a.save_on_cpu:
                with torch.autograd.graph.save_on_cpu(pin_memory=True):
                    loss = step_loss()
                    loss.backward()
            else:
                loss = step_loss()
                loss.backward()
            opt.step()
            return loss

        step = eager_step
        warm = 0
        if a.host_state:
            step = host_state_step(torch, opt, eager_step, a.host_state, a.host_order, moved)
        if a.cuda_graph:
            warm = min(3, a.steps)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warm):
                    t0 = time.perf_counter()
                    loss = eager_step()
                    side.synchronize()
                    times.append(time.perf_counter() - t0)
                    losses.append(repr(loss.item()))
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            opt.zero_grad(set_to_none=True)
            with torch.cuda.graph(graph):
                static_loss = step_loss()
                static_loss.backward()
                opt.step()

            def step():
                graph.replay()
                return static_loss

        for _ in range(a.steps - warm):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(repr(loss.item()))
            p, d = sample()
            max_proc, max_dev = max(max_proc, p), max(max_dev, d)
        if a.profile:
            profile(torch, step, a.profile)
    except torch.OutOfMemoryError as e:
        oom = 1
        print("OOM", str(e).splitlines()[0])
    if a.map and not oom:
        for p in model.parameters():
            print(f"TENSORMAP param {p.data_ptr():#x} {p.numel() * p.element_size()}")
            if p.grad is not None:
                g = p.grad
                print(f"TENSORMAP grad {g.data_ptr():#x} {g.numel() * g.element_size()}")
            for k, t in opt.state.get(p, {}).items():
                if torch.is_tensor(t) and t.is_cuda and t.numel() > 1:
                    print(f"TENSORMAP {k} {t.data_ptr():#x} {t.numel() * t.element_size()}")
    timed = sorted(times[-a.timed:]) if times else [float("nan")]
    first = times[-a.timed] if len(times) >= a.timed else float("nan")
    print(
        f"RESULTKV model={a.model} losses={','.join(losses) or 'none'} "
        f"ms_per_step={1000 * timed[len(timed) // 2]:.1f} first_ms={1000 * first:.1f} "
        f"peak_reserved_mib={torch.cuda.max_memory_reserved() / 2**20:.0f} "
        f"peak_allocated_mib={torch.cuda.max_memory_allocated() / 2**20:.0f} "
        f"max_proc_mib={max_proc:.0f} max_dev_used_mib={max_dev:.0f} oom={oom} "
        f"host_state_mib={moved[0] / 2**20:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
