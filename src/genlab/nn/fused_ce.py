"""The GPT head + cross-entropy (registry `ce_kernel`, `model.ce_kernel`): sum_i w_i * CE(h_i @ W[:vocab]^T, y_i).
`plain`, `cce` (Cut Cross-Entropy, called without `valids` and gradient filtering: no host sync, exact gradients),
`liger` and `auto`; what each costs and why: docs/performance.md ("Fused kernels"). CPU tensors always take the plain
path; both libraries are imported on the first CUDA call only.
"""
from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from genlab.core.registry import Registry
from genlab.nn.kernels import KernelSpec, compute_dtype

ce_kernel_registry = Registry("ce_kernel", KernelSpec)

# found without importing them (constants to torch.compile); they are imported inside the custom ops below,
# which torch.compile does not trace, on the first CUDA call
HAS_CCE = importlib.util.find_spec("cut_cross_entropy") is not None
HAS_LIGER = importlib.util.find_spec("liger_kernel") is not None


def _reduce(nll: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    return nll.mean() if weights is None else (weights.reshape(-1).float() * nll).sum()


@ce_kernel_registry.register("plain", "logits from the head, then float32 cross-entropy (fused with the head's "
                                      "upcast under torch.compile)")
def plain_ce(head, h, y, weights, vocab: int) -> torch.Tensor:
    """head: the Linear; h [N, D]; y [N] long; weights [N] or None (= the mean); the first `vocab` logits count."""
    logits = head(h)
    logits = logits if vocab == logits.shape[-1] else logits[:, :vocab]
    logits = logits.float() if logits.element_size() < 4 else logits  # bf16 logits, fp32 math (fused when compiled)
    return _reduce(F.cross_entropy(logits, y, reduction="none"), weights)


# -- cut cross-entropy as custom ops: opaque to torch.compile (one graph around them), no host sync -----------------
@torch.library.custom_op("genlab::cce_fwd", mutates_args=())
def _cce_fwd(e: torch.Tensor, c: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from cut_cross_entropy.cce_lse_forward import cce_lse_forward_kernel
    from cut_cross_entropy.indexed_dot import indexed_neg_dot_forward_kernel
    lse = cce_lse_forward_kernel(e, c, None, softcap=None, return_logit_avg=False)
    nll = indexed_neg_dot_forward_kernel(e, c, y, False, None, None, lse.dtype).add_(lse)
    return nll, lse


@_cce_fwd.register_fake
def _(e, c, y):
    return e.new_empty(e.shape[0], dtype=torch.float32), e.new_empty(e.shape[0], dtype=torch.float32)


@torch.library.custom_op("genlab::cce_bwd", mutates_args=())
def _cce_bwd(dnll: torch.Tensor, e: torch.Tensor, c: torch.Tensor, lse: torch.Tensor,
             y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from cut_cross_entropy.cce_backward import cce_backward_kernel
    # the library forms d/dc only for a classifier that requires grad
    de, dc = cce_backward_kernel(dnll, e, c.detach().requires_grad_(), lse, None, None, None, targets=y)
    return de, dc


@_cce_bwd.register_fake
def _(dnll, e, c, lse, y):
    return torch.empty_like(e), torch.empty_like(c)


def _cce_setup(ctx, inputs, output):
    e, c, y = inputs
    ctx.save_for_backward(e, c, y, output[1])


def _cce_backward(ctx, dnll, _dlse):
    e, c, y, lse = ctx.saved_tensors
    de, dc = _cce_bwd(dnll.float().contiguous(), e, c, lse, y)
    return de, dc, None


_cce_fwd.register_autograd(_cce_backward, setup_context=_cce_setup)


@ce_kernel_registry.register("cce", "Cut Cross-Entropy (cut-cross-entropy wheel; CUDA, bf16/fp16): no logits in memory, "
                                    "exact gradients, no host sync", cuda_only=True, package="cut_cross_entropy")
def cce_ce(head, h, y, weights, vocab: int) -> torch.Tensor:
    if resolve("cce", h, weights) != "cce":
        return plain_ce(head, h, y, weights, vocab)
    dt = compute_dtype(h)
    with torch.autocast(h.device.type, enabled=False):
        nll, _ = _cce_fwd(h.to(dt).contiguous(), head.weight[:vocab].to(dt), y.contiguous())
        return _reduce(nll, weights)


# -- liger: loss and both gradients in its forward (one custom op), scaled by the incoming gradient -----------------
@torch.library.custom_op("genlab::liger_flce", mutates_args=())
def _liger_fwd(h: torch.Tensor, W: torch.Tensor, y: torch.Tensor,
               grads: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from liger_kernel.ops.fused_linear_cross_entropy import fused_linear_cross_entropy_forward
    out = fused_linear_cross_entropy_forward(h, W, y, reduction="mean", accum_dtype=torch.float32,
                                             compute_gradients=grads, weight_requires_grad=grads)
    loss, gh, gW = out[0], out[4], out[5]
    if not grads:
        return loss.float(), h.new_empty(0), W.new_empty(0)
    return loss.float(), gh, gW.to(W.dtype)


@_liger_fwd.register_fake
def _(h, W, y, grads):
    return (h.new_empty((), dtype=torch.float32), torch.empty_like(h) if grads else h.new_empty(0),
            torch.empty_like(W) if grads else W.new_empty(0))


def _liger_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1], output[2])


def _liger_backward(ctx, dloss, _dgh, _dgW):
    gh, gW = ctx.saved_tensors
    return gh * dloss.to(gh.dtype), gW * dloss.to(gW.dtype), None, None


_liger_fwd.register_autograd(_liger_backward, setup_context=_liger_setup)


@ce_kernel_registry.register("liger", "liger-kernel fused linear cross-entropy (CUDA): logits in chunks, gradients in "
                                      "the forward; 1 host sync per step", cuda_only=True, package="liger_kernel")
def liger_ce(head, h, y, weights, vocab: int) -> torch.Tensor:
    if not (HAS_LIGER and h.is_cuda) or weights is not None:  # per-token weights (mdlm): liger has none
        return plain_ce(head, h, y, weights, vocab)
    dt = compute_dtype(h)
    with torch.autocast(h.device.type, enabled=False):
        return _liger_fwd(h.to(dt).contiguous(), head.weight[:vocab].to(dt), y.contiguous(), torch.is_grad_enabled())[0]


def resolve(name: str, h: torch.Tensor, weights) -> str:
    """The entry that actually runs for these inputs (auto's choice; the plain fallback of cce/liger off CUDA)."""
    if name in ("cce", "auto") and HAS_CCE and h.is_cuda and compute_dtype(h) in (torch.float16, torch.bfloat16):
        return "cce"
    if name in ("liger", "auto") and HAS_LIGER and h.is_cuda and weights is None:
        return "liger"
    return "plain"


@ce_kernel_registry.register("auto", "cce on CUDA under bf16/fp16 when installed, else liger when installed, "
                                     "else plain (always plain on CPU)")
def auto_ce(head, h, y, weights, vocab: int) -> torch.Tensor:
    return ce_kernel_registry.get(resolve("auto", h, weights))(head, h, y, weights, vocab)
