"""Floors and parts of one DiT training step on the GPU (issue 5): what the matmuls alone cost, which SDPA
kernel is fastest at DiT's shape, what the optimizer phase costs by piece, LayerNorm+adaLN fused or not.
Timings: CUDA events, median of 20 after warm-up, random inputs.

    python benchmarks/probe_dit_parts.py [--size B --batch 256]      (CUDA; prints markdown tables)
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from common import cuda_timed

from genlab.core.tables import markdown_table


def bench(fn):
    return cuda_timed(fn)[0]


def gemm_floor(D, depth, tokens, hidden, dev):
    """Every Linear GEMM of one training step (fwd Y=XW^T, bwd dX=dY W and dW=dY^T X), bf16, cuBLAS."""
    rows = []
    total_ms, total_flop = 0.0, 0.0
    for name, k, n in (("qkv", D, 3 * D), ("proj", D, D), ("fc1", D, hidden), ("fc2", hidden, D)):
        x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        dy = torch.randn(tokens, n, device=dev, dtype=torch.bfloat16)
        f = bench(lambda: x @ w.t())
        bx = bench(lambda: dy @ w)
        bw = bench(lambda: dy.t() @ x)
        flop = 2 * tokens * k * n
        rows.append((name, tokens, k, n, f, bx, bw, 3 * flop / (f + bx + bw) / 1e9))
        total_ms += (f + bx + bw) * depth
        total_flop += 3 * flop * depth
    return rows, total_ms, total_flop


def sdpa_variants(B, H, N, Dh, dev):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    out = []
    qkv = torch.randn(B, N, 3, H, Dh, device=dev, dtype=torch.bfloat16, requires_grad=True)
    qc = [torch.randn(B, H, N, Dh, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    for layout, inputs in (("packed-permute", lambda: qkv.permute(2, 0, 3, 1, 4)), ("contiguous", lambda: qc)):
        for be in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
            def step():
                q, k, v = inputs()
                with sdpa_kernel(getattr(SDPBackend, be)):
                    o = F.scaled_dot_product_attention(q, k, v)
                o.backward(torch.ones_like(o))
            try:
                ms = bench(step)
                flop = 3 * 4 * B * H * N * N * Dh  # fwd 2 matmuls x (1 fwd + 2 bwd)
                out.append((layout, be, ms, flop / ms / 1e9))
            except Exception as e:  # noqa: BLE001
                out.append((layout, be, float("nan"), str(e).splitlines()[0][:60]))
    return out


def optimizer_variants(model, dev):
    from genlab.runtime.parallel import clip_grads
    from genlab.training.trainer import ema_update
    params = [p for p in model.parameters()]
    ema = [p.detach().clone() for p in params]
    res = []
    for fused in (True, False):
        opt = torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": 0.0},
                                 {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                                lr=1e-4, fused=fused or None, foreach=None if fused else True)
        grads = [torch.randn_like(p) for p in params]

        def set_grads():
            for p, g in zip(params, grads):
                p.grad = g.clone()

        def full_step(clip):
            set_grads()
            clip()
            opt.step()
            opt.zero_grad(set_to_none=True)
            ema_update(ema, params, 1e-4)
        base = bench(set_grads)
        tag = "fused" if fused else "foreach"
        res.append((f"AdamW {tag}: clip_grad_norm_ + step + EMA lerp",
                    bench(lambda: full_step(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0))) - base))
        res.append((f"AdamW {tag}: genlab clip_grads(fold into fused) + step + EMA",
                    bench(lambda: full_step(lambda: clip_grads(params, 1.0, opt))) - base))
        res.append((f"AdamW {tag}: step only", bench(lambda: (set_grads(), opt.step())) - base))
        res.append((f"AdamW {tag}: clip_grad_norm_ only", bench(lambda: (set_grads(), torch.nn.utils.clip_grad_norm_(params, 1.0))) - base))
        res.append(("EMA foreach_lerp_ only", bench(lambda: ema_update(ema, params, 1e-4))))
        opt.grad_scale = None
    return res, sum(p.numel() for p in params)


def norm_variants(tokens_b, N, D, dev):
    from genlab.nn.norm import norm_modulate_fused, norm_modulate_unfused
    x = torch.randn(tokens_b, N, D, device=dev, requires_grad=True)
    sh = torch.randn(tokens_b, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    sc = torch.randn(tokens_b, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
    out = []
    for name, fn in (("unfused", norm_modulate_unfused), ("fused", norm_modulate_fused)):
        for comp in (False, True):
            f = torch.compile(fn) if comp else fn

            def step():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    y = f(x, sh, sc, 1e-6)
                y.backward(torch.ones_like(y))
            out.append((name, "compiled" if comp else "eager", bench(step)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="B")
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()
    dev = torch.device("cuda")
    from genlab.families.image_flow.dit import DIT_SIZES, DiT, DiTSpec
    D, depth, H = DIT_SIZES[a.size]
    N = 256
    tokens = a.batch * N
    print(f"## DiT-{a.size}/2 batch {a.batch} parts on {torch.cuda.get_device_name()} (torch {torch.__version__})\n")
    rows, ms, flop = gemm_floor(D, depth, tokens, 4 * D, dev)
    print(markdown_table(["GEMM", "M", "K", "N", "fwd ms", "bwd dX ms", "bwd dW ms", "TFLOP/s"],
                         [[*r[:4], f"{r[4]:.3f}", f"{r[5]:.3f}", f"{r[6]:.3f}", f"{r[7]:.0f}"] for r in rows]))
    print(f"\nall block GEMMs of one step ({depth} blocks): {ms:.1f} ms, {flop / ms / 1e9:.0f} TFLOP/s\n")
    print(markdown_table(["SDPA layout", "backend", "fwd+bwd ms (one layer)", "TFLOP/s"],
                         [[r[0], r[1], f"{r[2]:.3f}", r[3] if isinstance(r[3], str) else format(r[3], ".0f")]
                          for r in sdpa_variants(a.batch, H, N, D // H, dev)]))
    model = DiT(DiTSpec(32, 4, 1000, D, depth, H)).to(dev)
    res, n = optimizer_variants(model, dev)
    print(f"\noptimizer phase, {n / 1e6:.1f}M fp32 params (floor: fused AdamW 28 B/param + EMA 12 B/param + clip 4-12 B/param)\n")
    print(markdown_table(["piece", "ms"], [[name, f"{t:.3f}"] for name, t in res]))
    print("\n" + markdown_table(["LayerNorm+adaLN (fwd+bwd, fp32 residual in, bf16 autocast)", "mode", "ms (one call)"],
                                [[r[0], r[1], f"{r[2]:.3f}"] for r in norm_variants(a.batch, N, D, dev)]))


if __name__ == "__main__":
    main()
