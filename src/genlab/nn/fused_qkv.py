"""The QKV split in Triton (`model.qkv_kernel=triton`, docs/performance.md): h [B, N, 3 * H * HD] -> q, k, v
[B, H, N, HD], with RMSNorm per head of q and k and RoPE, in one pass. Backward per head, xhat = x * rstd:
dy = R^T dout, d weight = sum dy * xhat, dx = rstd * (dy * w - xhat * mean(dy * w * xhat)); only h is saved.
CPU tensors and inputs the kernel does not take (odd head width, float64) run `split_plain`.
"""
from __future__ import annotations

import functools

import torch

from genlab.nn.attention import qkv_kernel_registry, split_plain
from genlab.nn.triton_attention import HAS_TRITON, interpreting, require_kernels  # no triton import

MAX_HD = 256
_kernels = functools.partial(require_kernels, "fused_qkv_kernels", "model.qkv_kernel=triton", "plain")


def supports(h: torch.Tensor, heads: int) -> bool:
    """Whether the kernel runs on the projection's output h [B, N, 3 * heads * HD] (CUDA or the interpreter)."""
    if not (HAS_TRITON and (h.is_cuda or interpreting()) and h.dim() == 3 and h.shape[-1] % (3 * heads) == 0):
        return False
    hd = h.shape[-1] // (3 * heads)
    return hd % 2 == 0 and 0 < hd <= MAX_HD and h.dtype in (torch.float32, torch.bfloat16, torch.float16)


def triton_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _launch(name: str, h, wq, wk, cos, sin, heads: int, eps: float, *bufs):
    """Kernel `name`, one program per token of h; an absent input is passed as h (a pointer it never reads)."""
    B, N, C = h.shape
    half = C // (3 * heads) // 2
    if B * N:
        getattr(_kernels(), name)[(B * N,)](
            h, *(h if t is None else t for t in (wq, wk, cos, sin)), *bufs, N, heads, eps, HAS_QN=wq is not None,
            HAS_KN=wk is not None, HAS_ROPE=cos is not None, HALF=half, BLOCK_H=triton_pow2(heads),
            BLOCK_J=triton_pow2(half), **({} if interpreting() else {"num_warps": 4}))


@torch.library.custom_op("genlab::qkv_split_fwd", mutates_args=())
def _fwd_op(h: torch.Tensor, wq: torch.Tensor | None, wk: torch.Tensor | None, cos: torch.Tensor | None,
            sin: torch.Tensor | None, heads: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, N, C = h.shape
    q, k, v = (h.new_empty(B, heads, N, C // (3 * heads)) for _ in range(3))
    _launch("_split_fwd", h, wq, wk, cos, sin, heads, eps, q, k, v)
    return q, k, v


@_fwd_op.register_fake
def _(h, wq, wk, cos, sin, heads, eps):
    B, N, C = h.shape
    return tuple(h.new_empty(B, heads, N, C // (3 * heads)) for _ in range(3))


@torch.library.custom_op("genlab::qkv_split_bwd", mutates_args=())
def _bwd_op(h: torch.Tensor, wq: torch.Tensor | None, wk: torch.Tensor | None, cos: torch.Tensor | None,
            sin: torch.Tensor | None, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor, heads: int,
            eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    B, N, C = h.shape
    dh = torch.empty_like(h)
    pw = torch.zeros(2, B * N, C // (3 * heads), dtype=torch.float32, device=h.device)  # per-token d weight of q and k
    _launch("_split_bwd", h, wq, wk, cos, sin, heads, eps, dq, dk, dv, dh, pw)
    return dh, pw.sum(1)


@_bwd_op.register_fake
def _(h, wq, wk, cos, sin, dq, dk, dv, heads, eps):
    return torch.empty_like(h), h.new_empty(2, h.shape[-1] // (3 * heads), dtype=torch.float32)


def _setup(ctx, inputs, output):
    h, wq, wk, cos, sin, heads, eps = inputs
    ctx.save_for_backward(h, wq, wk, cos, sin)
    ctx.heads, ctx.eps = heads, eps


def _backward(ctx, dq, dk, dv):
    h, wq, wk, cos, sin = ctx.saved_tensors
    B, N, C = h.shape
    shape = (B, ctx.heads, N, C // (3 * ctx.heads))
    dq, dk, dv = (torch.zeros(shape, dtype=h.dtype, device=h.device) if d is None else d.contiguous()
                  for d in (dq, dk, dv))
    dh, dw = _bwd_op(h, wq, wk, cos, sin, dq, dk, dv, ctx.heads, ctx.eps)
    return (dh, None if wq is None else dw[0].to(wq.dtype), None if wk is None else dw[1].to(wk.dtype),
            None, None, None, None)


_fwd_op.register_autograd(_backward, setup_context=_setup)


def _eps(norms, h):
    """nn.RMSNorm's eps: its own, or (eps=None) the float32 machine eps it uses for bf16/fp16/fp32 inputs."""
    for n in norms:
        if isinstance(n, torch.nn.RMSNorm) and n.eps is not None:
            return float(n.eps)
    return float(torch.finfo(torch.promote_types(h.dtype, torch.float32)).eps)


def split_triton(h, heads: int, q_norm, k_norm, rope=None):
    """h [B, N, 3 * heads * HD] -> q, k, v [B, heads, N, HD]: RMSNorm of q and k (an nn.RMSNorm, or nn.Identity for
    none), then RoPE with `rope` = (cos, sin) [>= N, HD / 2] (or None), in one pass; `split_plain` where the kernel
    does not run."""
    if (not supports(h, heads) or not all(isinstance(n, (torch.nn.RMSNorm, torch.nn.Identity)) for n in (q_norm, k_norm))
            or rope is not None and rope[0].shape[0] < h.shape[1]):  # (too short a table: the plain path's error)
        return split_plain(h, heads, q_norm, k_norm, rope)
    N, hd = h.shape[1], h.shape[-1] // (3 * heads)
    cos = sin = None
    if rope is not None:
        cos, sin = (t[:N].float().contiguous() for t in rope)
    # the RMSNorm's weight (ones when it has none), or None for no norm (nn.Identity)
    wq, wk = ((n.weight if n.weight is not None else h.new_ones(hd, dtype=torch.float32))
              if isinstance(n, torch.nn.RMSNorm) else None for n in (q_norm, k_norm))
    return _fwd_op(h.contiguous(), wq, wk, cos, sin, heads, _eps((q_norm, k_norm), h))


qkv_kernel_registry.register(
    "triton", "Triton kernel (CUDA): the QKV split into heads with QK RMSNorm and RoPE in one pass (plain on CPU)",
    cuda_only=True, package="triton")(split_triton)
