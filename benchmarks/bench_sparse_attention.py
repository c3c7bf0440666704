"""Sparse Transformer attention (issue 16): one layer's attention, forward + backward, bf16, dense causal
(SDPA flash) vs the factorized strided / fixed patterns (FlexAttention, compiled, in their block-sparse
layouts, permutations included in the time), with peak memory and block density.

    python benchmarks/bench_sparse_attention.py                      # CUDA: 3,072 and 12,288 tokens
    python benchmarks/bench_sparse_attention.py --out table.md
    python benchmarks/bench_sparse_attention.py --tiny               # CPU check: small n, forward only, fp32
    python benchmarks/bench_sparse_attention.py --blocks 128,64 --batch 32   # block sizes; a less launch-bound batch

`split` runs each part on half the heads (one layer's full cost); `interleaved` is the mean of the
layers that use each part on all heads; `merged` is the union in one head. `position-wise` rows are the
strided column mask without the layout (the trap: every causal block is visited).
Targets: >= 1.5x dense at 3,072 and >= 3x at 12,288 (the paper: 3.7x for strided at 12,288).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import warnings  # noqa: E402

import torch  # noqa: E402

from genlab.models.sparse_attention import (FLEX_BLOCK, FLEX_BLOCKS, MaskCache, Part, attend,  # noqa: E402
                                            block_density, causal_block_density, layer_groups)

# name -> (n, batch, heads, head_dim, strided l, fixed l, summary c): CIFAR-10's 3,072 bytes and 64x64x3;
# strided l ~ sqrt(n) rounded to a power of two, fixed l = 128 and c = 16 (the paper's text settings)
CASES = {"cifar": (3072, 8, 8, 64, 64, 128, 16), "long": (12288, 2, 8, 64, 128, 128, 16)}
TINY = {"tiny-a": (256, 1, 2, 16, 16, 32, 4), "tiny-b": (512, 1, 2, 16, 32, 64, 4)}
ROWS = [("dense", "split"), ("strided", "split"), ("strided", "interleaved"), ("strided", "merged"),
        ("strided-position-wise", "interleaved"), ("fixed", "split"), ("fixed", "interleaved"), ("fixed", "merged")]


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
        return start.elapsed_time(end) / iters, (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e3, float("nan")


def bench_case(name, shape, device, backward, iters, warmup, block=FLEX_BLOCK, batch=0):
    n, B, H, D, l_strided, l_fixed, c = shape
    B = batch or B
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (torch.randn(B, H, n, D, device=device, dtype=dt, requires_grad=backward) for _ in range(3))
    grad = torch.randn(B, H, n, D, device=device, dtype=dt)
    backend = "flex"
    rows, ref_ms = [], None
    for pattern, mode in ROWS:
        l = l_fixed if pattern == "fixed" else l_strided
        variants = layer_variants(pattern, mode, l, c, H)
        cache = MaskCache(block=block)
        dens = []
        for groups in variants:
            parts = [p for _, p in groups]
            cache.build(parts, n, device, backend)
            for nh, p in groups:
                d = causal_block_density(n, block) if p.name == "dense" else block_density(cache.get(p, n, device, backend)[0])
                dens.append(d * nh / H / len(variants))  # head-weighted: the work of one layer
        ms, mem = 0.0, 0.0
        for groups in variants:
            def step():
                out = run_layer(q, k, v, groups, cache, backend)
                if backward:
                    torch.autograd.grad(out, (q, k, v), grad)
            t, m = measure(step, device, iters, warmup)
            ms += t / len(variants)
            mem = max(mem, m)
        ref_ms = ms if pattern == "dense" else ref_ms
        rows.append(f"| {name} | {n} | {B} | {block} | {pattern} | {mode if pattern != 'dense' else '-'} | {l} | {c} | {sum(dens):.3f} "
                    f"| {ms:.3f} | {ref_ms / ms:.2f}x | {'-' if device.type != 'cuda' else f'{mem:.0f}'} |")
        print(rows[-1], flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="CPU check: small n, forward only, fp32")
    ap.add_argument("--cases", default="cifar,long", help=f"comma list of {', '.join(CASES)}")
    ap.add_argument("--blocks", default=str(FLEX_BLOCK), help=f"FlexAttention block sizes, comma list of {FLEX_BLOCKS}")
    ap.add_argument("--batch", type=int, default=0, help="batch instead of each case's own (larger: less launch-bound)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    a = ap.parse_args()
    blocks = [int(b) for b in a.blocks.split(",") if b]
    if bad := [b for b in blocks if b not in FLEX_BLOCKS]:
        raise SystemExit(f"--blocks: {bad} not in {FLEX_BLOCKS}")
    warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
    cuda = torch.cuda.is_available() and not a.tiny
    device = torch.device("cuda" if cuda else "cpu")
    cases = TINY if not cuda else {k: CASES[k] for k in a.cases.split(",") if k}
    what = "forward + backward, bf16" if cuda else "forward only, fp32 (CPU check; FlexAttention eager)"
    gpu = torch.cuda.get_device_name() if cuda else "CPU"
    head = [f"Sparse attention, one layer, {what}, {gpu}; density = fraction of block x block tiles visited "
            f"(dense rows: causal at that block size); speedup vs SDPA causal (flash); peak = extra MiB allocated "
            "during the step",
            "", "| case | n | batch | block | pattern | mode | l | c | block density | ms | speedup | peak MiB |",
            "| --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    print("\n".join(head), flush=True)
    rows = []
    for name, shape in cases.items():
        for block in blocks:
            rows += bench_case(name, shape, device, backward=cuda, iters=a.iters if cuda else 2,
                               warmup=a.warmup if cuda else 1, block=block, batch=a.batch)
    if a.out:
        Path(a.out).write_text("\n".join(head + rows) + "\n")


if __name__ == "__main__":
    main()
