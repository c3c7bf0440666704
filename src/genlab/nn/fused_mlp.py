"""SwiGLU with liger-kernel's fused SiLU * mul (`model.mlp=swiglu_liger`, docs/performance.md): the same module and
parameters as `model.mlp=swiglu`. Custom ops (liger's autograd.Function would be traced into by torch.compile); CPU
tensors run `silu(a) * b`, and liger is imported on the first CUDA call.
"""
from __future__ import annotations

import importlib.util

import torch

from genlab.nn.mlp import Mlp, mlp_registry, swiglu_plain, two_thirds
from genlab.nn.triton_attention import interpreting  # no triton import

# found without importing it (a constant to torch.compile)
HAS_LIGER = importlib.util.find_spec("liger_kernel") is not None
MAX_H = 32768  # liger's one-row block (calculate_settings caps BLOCK_SIZE at 65536; keep a margin)


def supports(h: torch.Tensor) -> bool:
    """Whether liger's kernel runs on fc1's output h [.., 2H] (CUDA, or the Triton interpreter in tests)."""
    return (HAS_LIGER and (h.is_cuda or interpreting()) and h.dim() >= 1 and h.shape[-1] % 2 == 0
            and 0 < h.shape[-1] // 2 <= MAX_H and h.dtype in (torch.float32, torch.bfloat16, torch.float16))


@torch.library.custom_op("genlab::liger_swiglu_fwd", mutates_args=())
def _fwd(h: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.swiglu import swiglu_fused_gate_up_forward
    return swiglu_fused_gate_up_forward(h)[1]


@_fwd.register_fake
def _(h):
    return h.new_empty(*h.shape[:-1], h.shape[-1] // 2)


@torch.library.custom_op("genlab::liger_swiglu_bwd", mutates_args=())
def _bwd(h: torch.Tensor, dc: torch.Tensor) -> torch.Tensor:
    from liger_kernel.ops.swiglu import swiglu_fused_gate_up_backward
    return swiglu_fused_gate_up_backward(h, dc).view(h.shape)  # a new buffer (in_place=False): h stays saved


@_bwd.register_fake
def _(h, dc):
    return torch.empty_like(h)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _backward(ctx, dc):
    (h,) = ctx.saved_tensors
    return _bwd(h, dc.to(h.dtype).contiguous())


_fwd.register_autograd(_backward, setup_context=_setup)


def swiglu_liger(h: torch.Tensor) -> torch.Tensor:
    """silu(a) * b of h = [a | b] (fc1's packed output): liger's kernel where it runs, else the plain composition."""
    if not supports(h) or h.numel() == 0:
        return swiglu_plain(h)
    return _fwd(h.contiguous())


class LigerSwiGLU(Mlp):
    """`Mlp(kind="swiglu")` (same parameters and state-dict keys) with the activation in liger's kernel."""

    def __init__(self, dim: int, hidden: int, bias: bool = True):
        super().__init__(dim, hidden, "swiglu", bias)

    def forward(self, x, grid=None):  # grid: unused (Mix-FFN reads it)
        return self.fc2(swiglu_liger(self.fc1(x)))


@mlp_registry.register("swiglu_liger", "swiglu with liger-kernel's fused SiLU * mul on CUDA (same parameters; plain "
                                       "swiglu on CPU)", hidden_of=two_thirds, matrices=3,
                       cuda_only=True, package="liger_kernel")
def swiglu_liger_mlp(dim: int, hidden: int, bias: bool = True) -> LigerSwiGLU:
    return LigerSwiGLU(dim, two_thirds(hidden), bias)
