"""Each fused kernel of issue 37 against its plain-PyTorch composition, forward + backward, on the GPU: the plain
composition eager and under torch.compile (what the presets run), the fused kernel eager (custom ops: the same kernel
under compile). CUDA events, median over --reps after warm-up, random cotangents; peak memory above the inputs.
Shapes: DiT-B/2 (256 tokens of width 768) and DiT-XL/2 (1152) at batch --batch, bf16 autocast over a float32
residual; GPT-2 124M's head (768 -> 50304 rows, 50257 real) over --gpt-batch x 1024 tokens.

    python benchmarks/fused_kernels.py [--batch 256 --gpt-batch 32 --reps 30]     (CUDA; prints a markdown table)
--dit-parts: floors and parts of one DiT training step (issue 5): what the matmuls alone cost, which SDPA kernel is
fastest at DiT's shape, what the optimizer phase costs by piece, LayerNorm+adaLN fused or not (median of 20).

    python benchmarks/fused_kernels.py --dit-parts [--size B --batch 256]

--float8-mlp W: float8 against bf16 on a compiled MLP stack of width W (`--recipe bf16|tensorwise|rowwise`, --tokens
32768, --layers 4), one configuration per process (dynamo's recompile limit); prints one JSON line: fwd+bwd ms and
achieved TFLOP/s (6 x tokens x params of the linears per step).

    python benchmarks/fused_kernels.py --float8-mlp 2048 --recipe rowwise
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F
from common import cuda_timed as timed
from common import wall_ms
from torch.nn.attention import SDPBackend, sdpa_kernel

from genlab.core.tables import markdown_table
from genlab.families.image_flow.dit import DIT_SIZES, DiT, DiTSpec, FinalLayer, depatchify, patchify
from genlab.nn import fused_adaln as FA
from genlab.nn import fused_ce, fused_final, fused_mlp, fused_qkv
from genlab.nn.attention import split_plain
from genlab.nn.float8 import check_float8_device, convert_float8, count_float8
from genlab.nn.norm import norm_modulate_fused, norm_modulate_unfused
from genlab.nn.positions import rope_cache
from genlab.runtime.parallel import clip_grads
from genlab.training.step import ema_update


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


def bf16(f):
    """f under bf16 autocast (the presets' precision)."""
    def run(*a):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return f(*a)
    return run


def row(op, kernel, plain, fused, inputs, cot, reps) -> dict:
    """The plain composition eager and compiled, and the fused kernel (None: its library is not installed)."""
    return {"op": op, "kernel": kernel, "eager": timed(fwd_bwd(plain, inputs, cot), reps),
            "compiled": timed(fwd_bwd(torch.compile(plain), inputs, cot), reps),
            "fused": None if fused is None else timed(fwd_bwd(fused, inputs, cot), reps)}


def adaln_rows(B, N, D, reps):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, N, D, device="cuda", generator=g).requires_grad_()                   # fp32 residual
    y = torch.randn(B, N, D, device="cuda", generator=g).bfloat16().requires_grad_()        # a matmul's output
    gate, sh, sc = (torch.randn(B, D, device="cuda", generator=g).bfloat16().requires_grad_() for _ in range(3))
    eps = 1e-6
    ops = {
        "LN + modulate": ((x, sh, sc), lambda x, sh, sc: norm_modulate_fused(x, sh, sc, eps),
                          lambda x, sh, sc: FA.norm_modulate_triton(x, sh, sc, eps)),
        "x + g*y, LN + modulate": ((x, y, gate, sh, sc), lambda *a: FA.add_norm_modulate_plain(*a, eps),
                                   lambda *a: FA.add_norm_modulate_triton(*a, eps)),
        "x + g*y": ((x, y, gate), FA.gated_add_plain, FA.gated_add_triton),
    }
    rows = []
    for name, (inp, plain, fused) in ops.items():
        out = bf16(plain)(*inp)
        cot = [torch.randn_like(o) for o in (out if isinstance(out, tuple) else (out,))]
        rows.append(row(f"{name} [{B}x{N}x{D}]", "genlab Triton (model.adaln=triton)", bf16(plain), bf16(fused), inp, cot, reps))
    return rows


def ce_rows(B, T, reps):
    D, V, vocab = 768, 50304, 50257
    g = torch.Generator(device="cuda").manual_seed(0)
    head = torch.nn.Linear(D, V, bias=False).cuda()
    torch.nn.init.normal_(head.weight, std=0.02, generator=g)
    h = torch.randn(B * T, D, device="cuda", generator=g).requires_grad_()
    y = torch.randint(0, vocab, (B * T,), device="cuda", generator=g)

    def loss_of(kernel):
        return bf16(lambda h, W: kernel(head, h, y, None, vocab))
    inp = (h, head.weight)
    plain = row(f"head + CE [{B * T}x{D} -> {V}]", "", loss_of(fused_ce.plain_ce), None, inp, None, reps)
    return [dict(plain, kernel=f"{name} (model.ce_kernel={name})", fused=timed(fwd_bwd(loss_of(fn), inp), reps) if ok else None)
            for name, ok, fn in (("cce", fused_ce.HAS_CCE, fused_ce.cce_ce), ("liger", fused_ce.HAS_LIGER, fused_ce.liger_ce))]


def swiglu_rows(M, H, reps):
    """silu(a) * b over fc1's packed [M, 2H] bf16 output (the SwiGLU activation, model.mlp=swiglu_liger)."""
    h = torch.randn(M, 2 * H, device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    h = h.bfloat16().requires_grad_()
    cot = [torch.randn(M, H, device="cuda").bfloat16()]
    return [row(f"SwiGLU silu(a)*b [{M}x{2 * H}]", "liger (model.mlp=swiglu_liger)", fused_mlp.swiglu_plain,
                fused_mlp.swiglu_liger if fused_mlp.HAS_LIGER else None, (h,), cot, reps)]


def qkv_rows(B, N, H, hd, reps, qk_norm=True, rope=True):
    """The QKV projection's output [B, N, 3*H*hd] (bf16) -> q, k, v [B, H, N, hd] with QK RMSNorm and RoPE
    (model.qkv_kernel=triton); the plain split is what Attention.heads_qkv runs with qkv_kernel=plain."""
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
    torch.manual_seed(0)
    final = FinalLayer(D, P).cuda()
    for p in final.parameters():
        torch.nn.init.normal_(p, std=0.02)
    side, C = int(N ** 0.5) * 2, P // 4   # patch 2: P = 4 * C
    h = torch.randn(B, N, D, device="cuda").requires_grad_()
    c = torch.randn(B, D, device="cuda").requires_grad_()
    target = torch.randn(B, C, side, side, device="cuda")
    plain = bf16(lambda h, c: F.mse_loss(depatchify(final(h, c), 2, C, side, side).float(), target))
    fused = bf16(lambda h, c: fused_final.triton_final_loss(final, h, c, patchify(target, 2), None))
    return [row(f"final layer + flow loss [{B}x{N}x{D} -> {P}]", "genlab Triton (model.final_kernel=triton)", plain, fused,
                (h, c), None, reps)]


def median_ms(fn):
    return timed(fn)[0]


def gemm_floor(D, depth, tokens, hidden, dev):
    """Every Linear GEMM of one training step (fwd Y=XW^T, bwd dX=dY W and dW=dY^T X), bf16, cuBLAS."""
    rows, total_ms, total_flop = [], 0.0, 0.0
    for name, k, n in (("qkv", D, 3 * D), ("proj", D, D), ("fc1", D, hidden), ("fc2", hidden, D)):
        x, w, dy = (torch.randn(*shape, device=dev, dtype=torch.bfloat16) for shape in ((tokens, k), (n, k), (tokens, n)))
        f, bx, bw = (median_ms(fn) for fn in (lambda: x @ w.t(), lambda: dy @ w, lambda: dy.t() @ x))
        flop = 2 * tokens * k * n
        rows.append((name, tokens, k, n, f, bx, bw, 3 * flop / (f + bx + bw) / 1e9))
        total_ms += (f + bx + bw) * depth
        total_flop += 3 * flop * depth
    return rows, total_ms, total_flop


def sdpa_variants(B, H, N, Dh, dev):
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
                ms = median_ms(step)
                out.append((layout, be, ms, 3 * 4 * B * H * N * N * Dh / ms / 1e9))  # fwd 2 matmuls x (1 fwd + 2 bwd)
            except Exception as e:  # noqa: BLE001
                out.append((layout, be, float("nan"), str(e).splitlines()[0][:60]))
    return out


def optimizer_variants(model, dev):
    params = list(model.parameters())
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
        base = median_ms(set_grads)
        tag = "fused" if fused else "foreach"
        res.append((f"AdamW {tag}: clip_grad_norm_ + step + EMA lerp",
                    median_ms(lambda: full_step(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0))) - base))
        res.append((f"AdamW {tag}: genlab clip_grads(fold into fused) + step + EMA",
                    median_ms(lambda: full_step(lambda: clip_grads(params, 1.0, opt))) - base))
        res.append((f"AdamW {tag}: step only", median_ms(lambda: (set_grads(), opt.step())) - base))
        res.append((f"AdamW {tag}: clip_grad_norm_ only", median_ms(lambda: (set_grads(), torch.nn.utils.clip_grad_norm_(params, 1.0))) - base))
        res.append(("EMA foreach_lerp_ only", median_ms(lambda: ema_update(ema, params, 1e-4))))
    return res, sum(p.numel() for p in params)


def norm_variants(tokens_b, N, D, dev):
    x = torch.randn(tokens_b, N, D, device=dev, requires_grad=True)
    sh, sc = (torch.randn(tokens_b, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    out = []
    for name, fn in (("unfused", norm_modulate_unfused), ("fused", norm_modulate_fused)):
        for comp in (False, True):
            f = bf16(torch.compile(fn) if comp else fn)

            def step():
                y = f(x, sh, sc, 1e-6)
                y.backward(torch.ones_like(y))
            out.append((name, "compiled" if comp else "eager", median_ms(step)))
    return out


def dit_parts(a):
    dev = torch.device("cuda")
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


def float8_mlp(a):
    dev, w = torch.device("cuda"), a.float8_mlp
    blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.LayerNorm(w), torch.nn.Linear(w, 4 * w), torch.nn.GELU(),
                                                     torch.nn.Linear(4 * w, w)) for _ in range(a.layers)).to(dev)
    if a.recipe != "bf16":
        check_float8_device(dev)
        convert_float8(blocks, a.recipe)
        assert count_float8(blocks) == 2 * a.layers

    @torch.compile
    def model(x):
        for b in blocks:
            x = x + b(x)
        return x
    x = torch.randn(a.tokens, w, device=dev, requires_grad=True)
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-4, fused=True)

    def step():
        bf16(model)(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    ms = wall_ms(step, a.steps, warmup=5, device=dev)
    print(json.dumps({"width": w, "recipe": a.recipe, "step_ms": ms, "tflops": 6 * a.tokens * a.layers * 8 * w ** 2 / ms / 1e9}))


def fmt(t):
    return "not installed" if t is None else f"{t[0]:.2f} ms ({t[1]:.2f} GiB)"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--gpt-batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--dit-parts", action="store_true", help="the parts of one DiT training step instead")
    ap.add_argument("--size", default="B", help="--dit-parts: the DiT size")
    ap.add_argument("--float8-mlp", type=int, metavar="WIDTH", help="float8 vs bf16 on a compiled MLP stack of this width")
    ap.add_argument("--recipe", default="bf16", help="--float8-mlp: bf16, tensorwise or rowwise")
    ap.add_argument("--tokens", type=int, default=32768, help="--float8-mlp")
    ap.add_argument("--layers", type=int, default=4, help="--float8-mlp")
    ap.add_argument("--steps", type=int, default=20, help="--float8-mlp: timed steps")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("fused_kernels.py needs a CUDA GPU")
    if a.dit_parts or a.float8_mlp:
        return dit_parts(a) if a.dit_parts else float8_mlp(a)
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
