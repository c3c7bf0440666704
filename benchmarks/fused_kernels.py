"""Each fused kernel of issue 37 against its plain-PyTorch composition, forward + backward, on the GPU: the plain
composition eager and under torch.compile (what the presets run), the fused kernel eager (custom ops: the same kernel
under compile). CUDA events, median over --reps after warm-up, random cotangents; peak memory above the inputs.
Shapes: DiT-B/2 (256 tokens of width 768) and DiT-XL/2 (1152) at batch --batch, bf16 autocast over a float32
residual; GPT-2 124M's head (768 -> 50304 rows, 50257 real) over --gpt-batch x 1024 tokens.

    python benchmarks/fused_kernels.py [--batch 256 --gpt-batch 32 --reps 30]     (CUDA; prints a markdown table)
"""
from __future__ import annotations

import argparse
import sys

import torch
from common import cuda_timed as timed

from genlab.core.tables import markdown_table


def fwd_bwd(f, inputs, cot=None):
    """One forward + backward of f(*inputs) (a tensor or a tuple), cotangents fixed beforehand."""
    def run():
        out = f(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        cots = cot if cot is not None else [torch.ones_like(o) for o in outs]
        torch.autograd.backward(outs, cots)
        for t in inputs:
            t.grad = None
    return run


def row(op, kernel, plain, fused, inputs, cot, reps) -> dict:
    """The plain composition eager and compiled, and the fused kernel (None: its library is not installed)."""
    return {"op": op, "kernel": kernel, "eager": timed(fwd_bwd(plain, inputs, cot), reps),
            "compiled": timed(fwd_bwd(torch.compile(plain), inputs, cot), reps),
            "fused": None if fused is None else timed(fwd_bwd(fused, inputs, cot), reps)}


def adaln_rows(B, N, D, reps):
    from genlab.nn import fused_adaln as FA
    from genlab.nn.norm import norm_modulate_fused
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, N, D, device="cuda", generator=g).requires_grad_()                   # fp32 residual
    y = torch.randn(B, N, D, device="cuda", generator=g).bfloat16().requires_grad_()        # a matmul's output
    gate, sh, sc = (torch.randn(B, D, device="cuda", generator=g).bfloat16().requires_grad_() for _ in range(3))
    eps = 1e-6

    def ac(f):
        def run(*a):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return f(*a)
        return run
    ops = {
        "LN + modulate": ((x, sh, sc), lambda x, sh, sc: norm_modulate_fused(x, sh, sc, eps),
                          lambda x, sh, sc: FA.norm_modulate_triton(x, sh, sc, eps)),
        "x + g*y, LN + modulate": ((x, y, gate, sh, sc), lambda *a: FA.add_norm_modulate_plain(*a, eps),
                                   lambda *a: FA.add_norm_modulate_triton(*a, eps)),
        "x + g*y": ((x, y, gate), FA.gated_add_plain, FA.gated_add_triton),
    }
    rows = []
    for name, (inp, plain, fused) in ops.items():
        out = ac(plain)(*inp)
        cot = [torch.randn_like(o) for o in (out if isinstance(out, tuple) else (out,))]
        rows.append(row(f"{name} [{B}x{N}x{D}]", "genlab Triton (model.adaln=triton)", ac(plain), ac(fused), inp, cot, reps))
    return rows


def ce_rows(B, T, reps):
    from genlab.nn import fused_ce
    D, V, vocab = 768, 50304, 50257
    g = torch.Generator(device="cuda").manual_seed(0)
    head = torch.nn.Linear(D, V, bias=False).cuda()
    torch.nn.init.normal_(head.weight, std=0.02, generator=g)
    h = torch.randn(B * T, D, device="cuda", generator=g).requires_grad_()
    y = torch.randint(0, vocab, (B * T,), device="cuda", generator=g)

    def loss_of(kernel):
        def run(h, W):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return kernel(head, h, y, None, vocab)
        return run
    inp = (h, head.weight)
    plain = row(f"head + CE [{B * T}x{D} -> {V}]", "", loss_of(fused_ce.plain_ce), None, inp, None, reps)
    return [dict(plain, kernel=f"{name} (model.ce_kernel={name})", fused=timed(fwd_bwd(loss_of(fn), inp), reps) if ok else None)
            for name, ok, fn in (("cce", fused_ce.HAS_CCE, fused_ce.cce_ce), ("liger", fused_ce.HAS_LIGER, fused_ce.liger_ce))]


def swiglu_rows(M, H, reps):
    """silu(a) * b over fc1's packed [M, 2H] bf16 output (the SwiGLU activation, model.mlp=swiglu_liger)."""
    from genlab.nn import fused_mlp
    h = torch.randn(M, 2 * H, device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    h = h.bfloat16().requires_grad_()
    cot = [torch.randn(M, H, device="cuda").bfloat16()]
    return [row(f"SwiGLU silu(a)*b [{M}x{2 * H}]", "liger (model.mlp=swiglu_liger)", fused_mlp.swiglu_plain,
                fused_mlp.swiglu_liger if fused_mlp.HAS_LIGER else None, (h,), cot, reps)]


def qkv_rows(B, N, H, hd, reps, qk_norm=True, rope=True):
    """The QKV projection's output [B, N, 3*H*hd] (bf16) -> q, k, v [B, H, N, hd] with QK RMSNorm and RoPE
    (model.qkv_kernel=triton); the plain split is what Attention.heads_qkv runs with qkv_kernel=plain."""
    from genlab.nn import fused_qkv
    from genlab.nn.attention import split_plain
    from genlab.nn.positions import rope_cache
    h = torch.randn(B, N, 3 * H * hd, device="cuda").bfloat16().requires_grad_()
    norms = [torch.nn.RMSNorm(hd).cuda() if qk_norm else torch.nn.Identity() for _ in range(2)]
    table = tuple(t.cuda() for t in rope_cache(N, hd)) if rope else None
    cot = [torch.randn(B, H, N, hd, device="cuda").bfloat16() for _ in range(3)]

    def split(fn):
        return lambda h: fn(h, H, *norms, table)
    parts = "+".join(p for p, on in (("QK-norm", qk_norm), ("RoPE", rope)) if on) or "split only"
    return [row(f"QKV split + {parts} [{B}x{N}x{3 * H * hd}, {H} heads]", "genlab Triton (model.qkv_kernel=triton)",
                split(split_plain), split(fused_qkv.split_triton), (h,), cot, reps)]


def final_rows(B, N, D, P, reps):
    """DiT's final layer (adaLN norm + modulation, projection D -> P) + the flow loss against a [B, C, H, W] target:
    the plain path (the projection, depatchify, float32 MSE) and model.final_kernel=triton (patchified target, one
    custom op); bf16 autocast, float32 tokens (the residual stream)."""
    from genlab.families.image_flow.dit import FinalLayer, depatchify, patchify
    from genlab.nn import fused_final
    torch.manual_seed(0)
    final = FinalLayer(D, P).cuda()
    for p in final.parameters():
        torch.nn.init.normal_(p, std=0.02)
    side, C = int(N ** 0.5) * 2, P // 4   # patch 2: P = 4 * C
    h = torch.randn(B, N, D, device="cuda").requires_grad_()
    c = torch.randn(B, D, device="cuda").requires_grad_()
    target = torch.randn(B, C, side, side, device="cuda")

    def plain(h, c):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            v = depatchify(final(h, c), 2, C, side, side)
            return torch.nn.functional.mse_loss(v.float(), target)

    def fused(h, c):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return fused_final.triton_final_loss(final, h, c, patchify(target, 2), None)
    return [row(f"final layer + flow loss [{B}x{N}x{D} -> {P}]", "genlab Triton (model.final_kernel=triton)", plain, fused,
                (h, c), None, reps)]


def fmt(t):
    return "not installed" if t is None else f"{t[0]:.2f} ms ({t[1]:.2f} GiB)"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--gpt-batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("fused_kernels.py needs a CUDA GPU")
    rows = adaln_rows(a.batch, 256, 768, a.reps) + adaln_rows(a.batch // 2, 256, 1152, a.reps) + ce_rows(a.gpt_batch, 1024, a.reps)
    # SwiGLU widths (2/3 of 4 x dim): DiT-B/2 tokens, GPT-2 124M tokens
    rows += swiglu_rows(a.batch * 256, 2048, a.reps) + swiglu_rows(a.gpt_batch * 1024, 2048, a.reps)
    # the QKV split: DiT-B/2 with qk_norm + rope2d-like tables, GPT-2 124M with rope, bench_longseq's head width 16
    rows += (qkv_rows(a.batch, 256, 12, 64, a.reps) + qkv_rows(a.gpt_batch, 1024, 12, 64, a.reps, qk_norm=False)
             + qkv_rows(1, 16384, 16, 16, a.reps))
    rows += final_rows(a.batch, 256, 768, 16, a.reps)  # DiT-B/2 on 32x32x4 latents
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; forward + backward, median of {a.reps}; "
          f"(peak GiB above the inputs)\n")
    print(markdown_table(["op", "plain eager", "plain compiled", "fused", "fused kernel", "speed-up vs compiled"],
                         [[r["op"], fmt(r["eager"]), fmt(r["compiled"]), fmt(r["fused"]), r["kernel"],
                           "n/a" if r["fused"] is None else f"{r['compiled'][0] / r['fused'][0]:.2f}x"] for r in rows],
                         "lrrrlr"))


if __name__ == "__main__":
    main()
