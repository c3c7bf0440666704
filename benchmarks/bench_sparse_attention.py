"""Sparse Transformer attention (issue 16): one layer's attention, forward + backward, bf16, dense causal (SDPA flash)
vs the factorized strided / fixed patterns, with peak memory and block density; or (--train-step) a small model's
training step on the CPU, backend `dense` (masked SDPA over all n x n scores) vs `blocked`. Backends: `flex`
(FlexAttention, compiled, in the block-sparse layouts, permutations included in the time) and `blocked` (the segment
forms: flash-style SDPA on runs / columns / run pairs, no n x n mask; fixed/summary stays FlexAttention, or masked on a
CPU).

    python benchmarks/bench_sparse_attention.py                      # CUDA: 3,072 and 12,288 tokens
    python benchmarks/bench_sparse_attention.py --tiny               # CPU check: small n, forward only, fp32
    python benchmarks/bench_sparse_attention.py --blocks 128,64 --batch 32   # block sizes; a less launch-bound batch
    python benchmarks/bench_sparse_attention.py --train-step [--batch 8 --iters 5 --threads 2]   # CPU: 784 tokens

`split` runs each part on half the heads (one layer's full cost); `interleaved` is the mean of the layers that use each
part on all heads; `merged` is the union in one head. `position-wise` rows are the strided column mask without the
layout (the trap: every causal block is visited). `parts kernel ms` gives each head group's (split) or layer's
(interleaved) own kernel time. Density is the FlexAttention block mask's even for `blocked` rows (the work it skips is
the same: whole segments). Targets: >= 1.5x dense at 3,072 and >= 3x at 12,288 (the paper: 3.7x for strided at 12,288).
"""
from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import torch
from common import wall_ms

from genlab.core.tables import markdown_row, markdown_table
from genlab.nn.sparse_attention import FLEX_BLOCK, FLEX_BLOCKS, MaskCache, Part, attend, block_density, causal_block_density, layer_groups

# name -> (n, batch, heads, head_dim, strided l, fixed l, summary c): CIFAR-10's 3,072 bytes and 64x64x3;
# strided l ~ sqrt(n) rounded to a power of two, fixed l = 128 and c = 16 (the paper's text settings)
CASES = {"cifar": (3072, 8, 8, 64, 64, 128, 16), "long": (12288, 2, 8, 64, 128, 128, 16)}
TINY = {"tiny-a": (256, 1, 2, 16, 16, 32, 4), "tiny-b": (512, 1, 2, 16, 32, 64, 4)}
ROWS = [("dense", "split"), ("strided", "split"), ("strided", "interleaved"), ("strided", "merged"),
        ("strided-position-wise", "interleaved"), ("fixed", "split"), ("fixed", "interleaved"), ("fixed", "merged")]
BACKENDS = ("flex", "blocked")
# blocked changes nothing for merged unions (no segment form) or the position-wise trap: those rows stay flex-only
BLOCKED_ROWS = [("strided", "split"), ("strided", "interleaved"), ("fixed", "split"), ("fixed", "interleaved")]


def layer_variants(pattern, mode, l, c, heads):
    """Lists of head groups whose attention makes one timed layer (interleaved: one per part)."""
    if pattern == "strided-position-wise":
        col = layer_groups("strided", "interleaved", l, c, 2, heads)[1][0][1]
        return [[(heads, Part("strided/column(position-wise)", col.allowed))]]
    groups = layer_groups(pattern, mode, l, c, 2, heads)
    return groups if mode == "interleaved" and pattern != "dense" else groups[:1]


def run_layer(q, k, v, groups, cache, backend):
    outs, h0 = [], 0
    for nh, part in groups:
        outs.append(attend(q[:, h0:h0 + nh], k[:, h0:h0 + nh], v[:, h0:h0 + nh], part, cache, backend, q.shape[-1] ** -0.5))
        h0 += nh
    return torch.cat(outs, 1)


def measure(fn, device, iters, warmup):
    """(wall ms per call from CUDA events, extra peak MiB, GPU kernel ms per call from the profiler). At small
    sizes an eager fwd+bwd is bound by the host's launches, so wall ms says more about Python than about the
    kernels; kernel ms is the sum of the kernels' own device time (copies and permutations included)."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        wall, mem = start.elapsed_time(end) / iters, (torch.cuda.max_memory_allocated() - base) / 2 ** 20
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
        kernel_us = sum(getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)
                        for e in prof.key_averages())
        return wall, mem, kernel_us / 1e3 / iters
    return wall_ms(fn, iters, warmup=0), float("nan"), float("nan")


def fmt(x, spec):
    return "-" if x != x else format(x, spec)  # NaN (CPU: no kernel times) -> "-"


def bench_case(name, shape, device, backward, iters, warmup, block=FLEX_BLOCK, batch=0, backends=BACKENDS,
               modes=("split", "interleaved", "merged")):
    n, B, H, D, l_strided, l_fixed, c = shape
    B = batch or B
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (torch.randn(B, H, n, D, device=device, dtype=dt, requires_grad=backward) for _ in range(3))
    grad = torch.randn(B, H, n, D, device=device, dtype=dt)
    rows, ref_ms, ref_kms = [], None, None
    todo = [("flex", pm) for pm in ROWS if ("flex" in backends and pm[1] in modes) or pm[0] == "dense"]
    todo += [("blocked", pm) for pm in BLOCKED_ROWS if "blocked" in backends and pm[1] in modes]
    for backend, (pattern, mode) in todo:
        l = l_fixed if pattern == "fixed" else l_strided
        variants = layer_variants(pattern, mode, l, c, H)
        cache = MaskCache(block=block)
        dens = []
        for groups in variants:
            parts = [p for _, p in groups]
            cache.build(parts, n, device, backend)
            cache.build(parts, n, device, "flex")  # the densities
            for nh, p in groups:
                d = causal_block_density(n, block) if p.name == "dense" else block_density(cache.get(p, n, device, "flex")[0])
                dens.append(d * nh / H / len(variants))  # head-weighted: the work of one layer
        ms, kms, mem, parts_ms = 0.0, 0.0, 0.0, []
        for groups in variants:
            def step():
                out = run_layer(q, k, v, groups, cache, backend)
                if backward:
                    torch.autograd.grad(out, (q, k, v), grad)
            t, m, kt = measure(step, device, iters, warmup)
            ms += t / len(variants)
            kms += kt / len(variants)
            mem = max(mem, m)
            if len(variants) > 1:
                parts_ms.append(kt)
            elif len(groups) > 1:  # split: each head group alone (they run one after another)
                for one in groups:
                    hq, hk, hv, hg = (x[:, :one[0]] for x in (q, k, v, grad))
                    parts_ms.append(measure(lambda: torch.autograd.grad(run_layer(hq, hk, hv, [one], cache, backend), (q, k, v), hg)
                                            if backward else run_layer(hq, hk, hv, [one], cache, backend), device, iters, warmup)[2])
        ref_ms, ref_kms = (ms, kms) if pattern == "dense" else (ref_ms, ref_kms)
        shown = "flex" if pattern == "dense" else backend
        rows.append(markdown_row([name, n, B, block, pattern, mode if pattern != "dense" else "-",
                                  shown if pattern != "dense" else "sdpa", l, c, f"{sum(dens):.3f}", f"{ms:.3f}",
                                  f"{ref_ms / ms:.2f}x", fmt(kms, ".3f"), "/".join(fmt(t, ".3f") for t in parts_ms) or "-",
                                  f"{fmt(ref_kms / kms, '.2f')}{'x' if kms == kms else ''}",
                                  "-" if device.type != "cuda" else f"{mem:.0f}"]))
        print(rows[-1], flush=True)
    return rows


def train_step_table(batch, iters, threads):
    """One training step (forward + backward) of a small Sparse Transformer on MNIST-sized byte sequences (28x28x1 =
    784 tokens) on the CPU, `dense` against `blocked` (what model.sparse_backend=auto picks on a CPU)."""
    from genlab.families.sparse.sparse_transformer import SparseSpec, SparseTransformer
    if threads:
        torch.set_num_threads(threads)
    print(f"Sparse Transformer training step on CPU ({torch.get_num_threads()} threads), 784 tokens, dim 128, depth 4, "
          f"4 heads, batch {batch}, fp32, mean of {iters}\n")
    print(markdown_table(["pattern", "mode", "dense ms", "blocked ms", "speedup"], [], "llrrr"))
    for pattern, mode in BLOCKED_ROWS:
        torch.manual_seed(0)
        model = SparseTransformer(SparseSpec(image_size=28, channels=1, dim=128, depth=4, heads=4, pattern=pattern, mode=mode))
        idx = torch.randint(0, 257, (batch, model.spec.seq_len))

        def step(backend):
            model.zero_grad(set_to_none=True)
            model(idx, backend=backend).float().mean().backward()
        dense, blocked = (wall_ms(lambda: step(b), iters) for b in ("dense", "blocked"))
        print(markdown_row([pattern, mode, f"{dense:.0f}", f"{blocked:.0f}", f"{dense / blocked:.2f}x"]), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="CPU check: small n, forward only, fp32")
    ap.add_argument("--cases", default="cifar,long", help=f"comma list of {', '.join(CASES)}")
    ap.add_argument("--blocks", default=str(FLEX_BLOCK), help=f"FlexAttention block sizes, comma list of {FLEX_BLOCKS}")
    ap.add_argument("--batch", type=int, default=0, help="batch instead of each case's own (larger: less launch-bound)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help=f"comma list of {', '.join(BACKENDS)}")
    ap.add_argument("--modes", default="split,interleaved,merged", help="comma list of the factorization modes to time "
                    "(the dense reference row always runs)")
    ap.add_argument("--iters", type=int, default=None, help="timed calls (default: 20; --train-step: 5)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    ap.add_argument("--train-step", action="store_true", help="a small model's CPU training step, dense vs blocked")
    ap.add_argument("--threads", type=int, default=0, help="--train-step: torch threads (0 = torch's default)")
    a = ap.parse_args()
    if a.train_step:
        return train_step_table(a.batch or 8, a.iters or 5, a.threads)
    blocks, backends = [int(b) for b in a.blocks.split(",") if b], [b for b in a.backends.split(",") if b]
    for option, given, known in (("--blocks", blocks, FLEX_BLOCKS), ("--backends", backends, BACKENDS)):
        if bad := [b for b in given if b not in known]:
            raise SystemExit(f"{option}: {bad} not in {known}")
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
    cuda = torch.cuda.is_available() and not a.tiny
    device = torch.device("cuda" if cuda else "cpu")
    cases = TINY if not cuda else {k: CASES[k] for k in a.cases.split(",") if k}
    what = "forward + backward, bf16" if cuda else "forward only, fp32 (CPU check; FlexAttention eager)"
    gpu = torch.cuda.get_device_name() if cuda else "CPU"
    head = [f"Sparse attention, one layer, {what}, {gpu}; density = fraction of block x block tiles visited "
            f"(dense rows: causal at that block size); speedup vs SDPA causal (flash); wall = CUDA events around the eager "
            "calls, kernel = the kernels' summed device time (profiler); peak = extra MiB allocated during the step",
            "", *markdown_table(["case", "n", "batch", "block", "pattern", "mode", "backend", "l", "c", "block density",
                                 "wall ms", "wall speedup", "kernel ms", "parts kernel ms", "kernel speedup", "peak MiB"], [],
                                "lrrrlllrrrrrrlrr").splitlines()]
    print("\n".join(head), flush=True)
    rows = []
    for name, shape in cases.items():
        for block in blocks:
            rows += bench_case(name, shape, device, backward=cuda, iters=a.iters or 20 if cuda else 2,
                               warmup=a.warmup if cuda else 1, block=block, batch=a.batch, backends=backends,
                               modes=a.modes.split(","))
    if a.out:
        Path(a.out).write_text("\n".join(head + rows) + "\n")


if __name__ == "__main__":
    main()
