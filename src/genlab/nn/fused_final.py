"""The DiT's final layer + the flow loss in one op (registry `final_kernel`, `model.final_kernel`; what `triton` does:
docs/performance.md). d loss / d out = 2 * dsse_b * diff with dsse_b = w_b / (B * N * P), so the backward is that
scale and two matmuls in the compute dtype; other devices and inputs (float64, P > MAX_P) run the op's plain-torch body.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from genlab.core.registry import Registry
from genlab.nn.kernels import KernelSpec, compute_dtype
from genlab.nn.triton_attention import HAS_TRITON, interpreting, require_kernels  # no triton import

final_kernel_registry = Registry("final_kernel", KernelSpec)

MAX_P = 256      # outputs per token held in registers (p * p * C)
BLOCK_K = 64     # slice of D per tl.dot
_kernels = functools.partial(require_kernels, "fused_final_kernels", "model.final_kernel=triton", "plain")


def supports(h: torch.Tensor, target: torch.Tensor) -> bool:
    """Whether the kernel runs on modulated tokens h [B, N, D] and the patchified target [B, N, P]."""
    ok = (torch.float32, torch.bfloat16, torch.float16)
    return (HAS_TRITON and (h.is_cuda or interpreting()) and h.dim() == 3 and 0 < target.shape[-1] <= MAX_P
            and h.dtype in ok and target.dtype in ok)


def _acc_dtype(h: torch.Tensor) -> torch.dtype:
    return torch.promote_types(h.dtype, torch.float32)


def _forward_kernel(h, W, b, target):
    B, N, D = h.shape
    P = target.shape[-1]
    block_p = max(16, 1 << (P - 1).bit_length())
    block_n = 64 if block_p <= 64 else 32           # the [BLOCK_N, BLOCK_P] float32 accumulator in registers
    tiles = -(-N // block_n)
    diff = torch.empty(B, N, P, dtype=torch.float32, device=h.device)
    part = torch.empty(B, tiles, dtype=torch.float32, device=h.device)
    if B * N:
        # float32 inputs: IEEE products unless torch allows TF32 matmuls (set_float32_matmul_precision / train.precision)
        ieee = h.dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest"
        meta = {} if interpreting() else {"num_warps": 4}
        _kernels()._final_sse_fwd[(B * tiles,)](h, W, b, target, diff, part, N, D, P, tiles, BLOCK_N=block_n,
                                                BLOCK_K=BLOCK_K, BLOCK_P=block_p, IEEE=ieee, **meta)
    return part.sum(1), diff


# -- the custom op: per-sample sum of squared errors, and the difference it leaves for the backward -------------------
@torch.library.custom_op("genlab::final_sse", mutates_args=())
def _sse_op(h: torch.Tensor, W: torch.Tensor, b: torch.Tensor,
            target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """h [B, N, D], W [P, D] and b [P] in the compute dtype, target [B, N, P] -> (sum_{n,p} diff^2 [B], diff)
    with diff = h W^T + b - target, both in float32 (float64 for float64 inputs)."""
    if supports(h, target) and W.dtype == h.dtype:
        return _forward_kernel(h.contiguous(), W.contiguous(), b.contiguous(), target.contiguous())
    acc = _acc_dtype(h)
    diff = F.linear(h.to(acc), W.to(acc), b.to(acc)) - target.to(acc)
    return diff.square().sum((1, 2)), diff


@_sse_op.register_fake
def _(h, W, b, target):
    acc = _acc_dtype(h)
    return h.new_empty(h.shape[0], dtype=acc), h.new_empty(target.shape, dtype=acc)


def _setup(ctx, inputs, output):
    h, W, b, _ = inputs
    ctx.save_for_backward(h, W, output[1])
    ctx.b_dtype = b.dtype
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # no zeros for the difference's (absent) gradient


def _backward(ctx, dsse, _ddiff):
    h, W, diff = ctx.saved_tensors
    if dsse is None:
        return None, None, None, None
    G = diff * (2 * dsse).to(diff.dtype)[:, None, None]   # d loss / d out, [B, N, P]
    g = G.flatten(0, 1).to(h.dtype)
    dh = (g @ W.to(h.dtype)).view(h.shape)
    dW = (g.T @ h.flatten(0, 1)).to(W.dtype)
    return dh, dW, G.sum((0, 1)).to(ctx.b_dtype), None


_sse_op.register_autograd(_backward, setup_context=_setup)


# -- the entries: (final layer, tokens h [B, N, D], condition c [B, D], patchified target [B, N, P], weight [B]) -------
def reduce_loss(per_sample: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """mean_b w_b * per_sample_b (the plain mean without a weight)."""
    return per_sample.mean() if weight is None else (weight.to(per_sample.dtype) * per_sample).mean()


@final_kernel_registry.register("plain", "the flow method calls the model for the velocity, then its float32 MSE "
                                         "(this entry: the same loss on the patch layout, the fused entry's reference)")
def plain_final_loss(final, h, c, target, weight):
    out = final(h, c)
    acc = _acc_dtype(out)
    return reduce_loss((out.to(acc) - target.to(acc)).square().flatten(1).mean(1), weight)


@final_kernel_registry.register("triton", "Triton kernel (CUDA): final projection + squared error in one pass, gradients "
                                          "formed in the forward, no velocity tensor (plain-torch op body on CPU)",
                                cuda_only=True, package="triton")
def triton_final_loss(final, h, c, target, weight):
    shift, scale = final.ada(c).chunk(2, dim=-1)
    hm = final.norm_modulate(h, shift, scale, final.eps)
    dt = compute_dtype(hm)
    lin = final.linear
    with torch.autocast(hm.device.type, enabled=False):
        sse, _ = _sse_op(hm.to(dt), lin.weight.to(dt), lin.bias, target)
        return reduce_loss(sse / target[0].numel(), weight)
