"""Head-dim-16 attention: the Triton kernel (`model.attention=triton`) vs SDPA's kernels, plus the exp floor.

    python benchmarks/bench_attention.py                     # kernel table (needs CUDA + triton)
    python benchmarks/bench_attention.py --e2e               # ... then genlab bench bench_longseq, sdpa vs triton
    python benchmarks/bench_attention.py --variants 2/split,2/atomic --shapes long
    python benchmarks/bench_attention.py --sigmoid           # sdpa vs sigmoid attention (triton, flex, plain)
    python benchmarks/bench_attention.py --sigmoid --quick   # tiny shapes; also runs on CPU (rows that need CUDA say so)

FLOPs: 4·N²·D·B·H per forward (both matmuls), backward counted as 2.5× that (fwd+bwd = 3.5×).
Exp floor: B·H·N² exponentials per forward, the same again for the backward's recompute of P (2× for
fwd+bwd; the `split` backward does a third), at the rate of a measured MUFU-bound ex2 loop.
Each triton row is `EXP/BWD[/fixed][/mma]` (see src/genlab/nn/triton_attention.py): exp 0 =
tl.math.exp2, 1 = ex2.approx.ftz, 2 = 1 of 4 exps as an FMA polynomial, 3 = 1 of 8; bwd split = dK/dV +
dQ kernels, atomic = one kernel with fp32 atomics for dQ; fixed = the first block config, untuned;
mma = softmax row sums by the tensor cores (ones column appended to V).
--sigmoid: DiT-B attention (12 heads x 64, bf16, batch 65536 // N, views of a fused qkv projection) at
256, 258 (in-context tokens), 1024 and 4096 tokens: SDPA (softmax) against sigmoid attention through
its Triton kernel (src/genlab/nn/triton_sigmoid.py), FlexAttention and plain torch ops.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from common import error_cell, genlab_bench, report, wall_ms
from torch.nn.attention import SDPBackend, sdpa_kernel

from genlab.core.tables import markdown_row, markdown_table
from genlab.nn import triton_attention
from genlab.nn.attention import sigmoid_attention_flex, sigmoid_attention_plain
from genlab.nn.triton_attention import flash_attention
from genlab.nn.triton_sigmoid import sigmoid_attention_triton

SHAPES = {"long": (4, 16, 16384, 16), "d64": (4, 16, 4096, 64)}
DEFAULT_VARIANTS = "0/split,1/split,2/split,3/split,1/atomic,2/atomic,3/atomic"  # all autotuned


def mufu_rate() -> float:
    """ex2/s of a loop that only does ex2.approx.ftz (plus one FMUL each), measured on this GPU."""
    import triton
    import triton.language as tl

    @triton.jit
    def _mufu_loop(X, Y, ITERS: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + offs)
        for _ in range(ITERS):
            x = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x * -0.5], dtype=tl.float32,
                                          is_pure=True, pack=1)
        tl.store(Y + offs, x)

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    block, iters, progs = 4096, 1024, sms * 16
    x = torch.rand(progs * block, device="cuda")
    y = torch.empty_like(x)
    run = lambda: _mufu_loop[(progs,)](x, y, ITERS=iters, BLOCK=block, num_warps=4)  # noqa: E731
    ms = triton.testing.do_bench(run, warmup=50, rep=200, return_mode="median")
    return progs * block * iters / (ms * 1e-3)


def set_variant(var):
    """EXP/BWD[/fixed][/mma]: exp mode, backward kind; fixed = first config, no autotuning; mma = row sums by MMA."""
    exp_mode, bwd, *flags = var.split("/")
    os.environ.update(GENLAB_TRITON_ATTN_EXP=exp_mode, GENLAB_TRITON_ATTN_BWD=bwd,
                      GENLAB_TRITON_ATTN_TUNE="0" if "fixed" in flags else "1",
                      GENLAB_TRITON_ATTN_ROWSUM="mma" if "mma" in flags else "fadd")


def bench(fn, warmup=50, rep=300):
    import triton
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def qkv_views(B, N, H, D, device):
    """q, k, v [B, H, N, D] as Attention produces them (views of one fused qkv projection), and a cotangent."""
    g = torch.Generator(device=device).manual_seed(0)
    qkv = torch.randn(B, N, 3, H, D, device=device, generator=g, dtype=torch.bfloat16)
    q, k, v = (t.requires_grad_(True) for t in qkv.permute(2, 0, 3, 1, 4).detach().unbind(0))
    return q, k, v, torch.randn(B, H, N, D, device=device, generator=g, dtype=torch.bfloat16)


def fwd_and_bwd(attn, q, k, v, do, time_ms):
    """[out, dq, dk, dv] of one call, then its forward and forward + backward ms."""
    out = attn(q, k, v)
    got = [out.detach(), *torch.autograd.grad(out, (q, k, v), do)]
    return got, time_ms(lambda: attn(q, k, v)), time_ms(lambda: torch.autograd.grad(attn(q, k, v), (q, k, v), do))


def run_shape(shape, variants, rate, lines):
    B, H, N, D = shape
    fwd_flops = 4 * N * N * D * B * H
    q, k, v, do = qkv_views(B, N, H, D, "cuda")
    ref, cells = [], []

    def row(label, t_f, t_fb, err):
        return [label, f"{t_f:.2f}", f"{t_fb:.2f}", f"{fwd_flops / t_f / 1e9:.0f}", f"{3.5 * fwd_flops / t_fb / 1e9:.0f}", err]

    def measure(label, attn):
        try:
            got, t_f, t_fb = fwd_and_bwd(attn, q, k, v, do, bench)
            ref.extend([] if ref else got)  # the first row (sdpa flash) is the reference
            cells.append(row(label, t_f, t_fb, format(max(rel(a, b) for a, b in zip(got, ref)), ".1e")))
        except Exception as e:  # noqa: BLE001 - a backend that does not support the shape is a row, not a crash
            cells.append([label, "n/a", "n/a", "n/a", "n/a", error_cell(e)])
        print(cells[-1], flush=True)

    for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
        def sdpa(q, k, v, _b=getattr(SDPBackend, name)):
            with sdpa_kernel(_b):
                return F.scaled_dot_product_attention(q, k, v)
        measure(f"sdpa {name.split('_')[0].lower()}", sdpa)
    for var in variants:
        set_variant(var)
        measure(f"triton {var}", lambda q, k, v: flash_attention(q, k, v))
    for key in ("GENLAB_TRITON_ATTN_TUNE", "GENLAB_TRITON_ATTN_ROWSUM"):
        os.environ.pop(key, None)
    K = triton_attention._kernels()
    for name in ("_attn_fwd", "_attn_bwd_dkdv", "_attn_bwd_dq"):  # what the autotuner picked, per key
        for key, cfg in getattr(getattr(K, name + "_tuned"), "cache", {}).items():
            if key[0] == N:
                print(f"tuned {name} {key[:6]}: {cfg}", flush=True)
    t_floor = B * H * N * N / rate * 1e3  # ms of the forward's exponentials
    cells.append(row("exp floor (measured MUFU rate)", t_floor, 2 * t_floor, ""))
    lines += [f"\n[B={B}, H={H}, N={N}, D={D}] bf16, non-causal; fwd FLOPs {fwd_flops:.3e}\n",
              markdown_table(["kernel", "fwd ms", "fwd+bwd ms", "fwd TFLOP/s", "fwd+bwd TFLOP/s",
                              "max rel. diff to sdpa flash (out, dq, dk, dv)"], cells)]


SIGMOID_TOKENS = (256, 258, 1024, 4096)


def run_sigmoid(tokens, heads, head_dim, total, lines):
    """fwd and fwd+bwd ms of softmax SDPA and of sigmoid attention's paths; errors vs an fp32 plain reference."""
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    time_ms = (lambda fn: bench(fn, warmup=10, rep=100)) if cuda else (lambda fn: wall_ms(fn, 3))
    backends = [("sdpa (softmax)", lambda q, k, v: F.scaled_dot_product_attention(q, k, v)),
                ("sigmoid triton", sigmoid_attention_triton),
                ("sigmoid flex", sigmoid_attention_flex),
                ("sigmoid plain", sigmoid_attention_plain)]
    lines += [f"\n[{heads} heads x {head_dim}, bf16, batch {total} // N, fused-qkv views, non-causal] on {dev}\n",
              markdown_table(["N", "batch", "attention", "fwd ms", "fwd+bwd ms", "fwd+bwd vs sdpa",
                              "rel. err vs fp32 plain (out, dq, dk, dv)"], [], "rrlrrrl")]
    for n in tokens:
        B = max(1, total // n)
        q, k, v, do = qkv_views(B, n, heads, head_dim, dev)
        r = min(B, 2)  # the reference on the first samples only (fp32 n x n weights)
        q32, k32, v32 = (t[:r].detach().float().requires_grad_(True) for t in (q, k, v))
        ref = sigmoid_attention_plain(q32, k32, v32)
        ref = [ref.detach(), *torch.autograd.grad(ref, (q32, k32, v32), do[:r].float())]
        t_sdpa = None
        for label, attn in backends:
            try:
                got, t_f, t_fb = fwd_and_bwd(attn, q, k, v, do, time_ms)
                err = "n/a" if label.startswith("sdpa") else ", ".join(f"{rel(a[:r], b):.1e}" for a, b in zip(got, ref))
                t_sdpa = t_fb if label.startswith("sdpa") else t_sdpa
                ratio = f"{t_fb / t_sdpa:.2f}x" if t_sdpa else "n/a"
                lines.append(markdown_row([n, B, label, f"{t_f:.3f}", f"{t_fb:.3f}", ratio, err]))
            except Exception as e:  # noqa: BLE001 - a path that cannot run here (no CUDA, OOM) is a row, not a crash
                lines.append(markdown_row([n, B, label, "n/a", "n/a", "n/a", error_cell(e)]))
            print(lines[-1], flush=True)
            if cuda:
                torch.cuda.empty_cache()


def run_e2e(steps, warmup, attentions, profile_dir, lines, heads=(16,)):
    """genlab bench bench_longseq per attention kernel and head count (dim 256: 16 heads = head dim 16 as shipped,
    4 heads = head dim 64, the same sequence: what the head size costs)."""
    cells = []
    for h in heads:
        for att in attentions:
            prof = ["--profile", str(Path(profile_dir) / f"profile_{att}_h{h}")] if profile_dir and att != "sdpa" else []
            res = genlab_bench(["bench_longseq", f"model.heads={h}", f"model.attention={att}"], steps, warmup, *prof, echo=True)
            cells.append([f"{256 // h} ({h})", att, *([f"failed: {res['error'][:120]}", "", "", "", ""] if "error" in res else [
                f"{res['samples_per_s']:.2f}", f"{res['step_ms']:.1f}", f"{res['fwd_ms']:.1f} / {res['bwd_ms']:.1f} / {res['opt_ms']:.1f}",
                f"{100 * res['mfu']:.1f}%", f"{res['peak_mem_gib']:.2f}"])])
    lines += ["\n    genlab bench bench_longseq model.heads=H model.attention=X\n",
              markdown_table(["head dim (heads)", "attention", "img/s", "step ms", "fwd / bwd / opt ms", "MFU",
                              "peak mem GiB"], cells)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="long,d64")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help="comma list of EXP_MODE/BWD")
    p.add_argument("--e2e", action="store_true", help="also genlab bench bench_longseq with sdpa and triton")
    p.add_argument("--e2e-attention", default="sdpa,triton")
    p.add_argument("--e2e-heads", default="16,4", help="--e2e: head counts of the dim-256 model (16: head dim 16 as "
                   "shipped; 4: head dim 64)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--profile-dir", default=None, help="profile the non-sdpa e2e runs into this folder")
    p.add_argument("--once", default=None, metavar="VARIANT", help="run one untuned fwd+bwd (for ncu) and exit")
    p.add_argument("--out", default=None, help="also write the tables to this markdown file")
    p.add_argument("--sigmoid", action="store_true", help="sdpa vs sigmoid attention (triton/flex/plain) only")
    p.add_argument("--tokens", default=",".join(map(str, SIGMOID_TOKENS)), help="--sigmoid: sequence lengths")
    p.add_argument("--quick", action="store_true", help="--sigmoid at tiny shapes (smoke test; runs on CPU)")
    args = p.parse_args()
    if args.sigmoid:
        lines = ["", f"device: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu'}, torch {torch.__version__}"]
        sizes = ((64, 66), 2, 64, 256) if args.quick else ([int(t) for t in args.tokens.split(",")], 12, 64, 65536)
        run_sigmoid(*sizes, lines)  # tokens, heads, head dim, tokens per batch
        return report(lines, args.out)
    if args.once:  # one fwd+bwd of the long shape (for ncu), untuned
        set_variant(args.once + "/fixed")
        B, H, N, D = SHAPES["long"]
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        for _ in range(2):
            torch.autograd.grad(flash_attention(q, k, v), (q, k, v), torch.randn_like(q))
        torch.cuda.synchronize()
        return
    if not torch.cuda.is_available():
        sys.exit("bench_attention.py needs a CUDA GPU")
    lines = [f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}"]
    if args.shapes:
        import triton
        rate = mufu_rate()
        lines[0] += f", triton {triton.__version__}; measured ex2 rate {rate / 1e12:.2f} T/s"
        print(lines[0], flush=True)
        for s in args.shapes.split(","):
            variants = args.variants.split(",")
            if s != "long":  # context shape: the tuned variants only
                variants = [v for v in variants if "fixed" not in v][:2] or variants[:2]
            run_shape(SHAPES[s], variants, rate, lines)
    if args.e2e:
        run_e2e(args.steps, args.warmup, args.e2e_attention.split(","), args.profile_dir, lines,
                [int(h) for h in args.e2e_heads.split(",")])
    report(["", *lines], args.out)


if __name__ == "__main__":
    main()
