"""The GELU MLP with its activation in the matmul epilogues (`model.mlp=gelu_quack`, docs/performance.md): quack-kernels'
CuTe-DSL GEMMs (Tri Dao's `quack`) on Hopper or newer. Same module, parameters and state-dict keys as `model.mlp=gelu`.

Forward: fc1 is one `gemm_act` (x W1^T + b1, tanh GELU in the epilogue, pre-activation stored for the backward), fc2
a cuBLAS addmm of the post-activation. Backward: d pre-activation is one `gemm_dact` (dy W2 times GELU'(pre) in the
epilogue, the post-activation recomputed there for dW2); the weight and input gradients are cuBLAS matmuls, the bias
gradients sums. Saved: x, the pre-activation and the cast weights (eager autograd of the plain MLP also keeps the
post-activation, for fc2's weight gradient). The whole MLP is two custom ops, so torch.compile keeps one graph around
it. Inputs the kernels do not take (CPU, float32/float64, widths not multiples of 8, GPUs before sm90) run the plain
composition.
"""
from __future__ import annotations

import importlib.util
import os

import torch
import torch.nn.functional as F

from genlab.nn.kernels import compute_dtype
from genlab.nn.mlp import Mlp, mlp_registry

HAS_QUACK = importlib.util.find_spec("quack") is not None  # found without importing it (a constant to torch.compile)
ACT = "gelu_tanh_approx"  # quack's name of F.gelu(approximate="tanh"), the plain MLP's activation


def tuned() -> bool:
    """Benchmarking knob GENLAB_QUACK_TUNED=1: quack's autotuner (it compiles ~44 tile configurations per GEMM shape on
    sm90 at the first call) instead of its default configuration."""
    return os.environ.get("GENLAB_QUACK_TUNED", "0") == "1"


def supports(x: torch.Tensor, w1: torch.Tensor) -> bool:
    """Whether quack's kernels take this MLP call: CUDA sm90+, bf16/fp16 matmuls, widths that are multiples of 8."""
    return (HAS_QUACK and x.is_cuda and compute_dtype(x) in (torch.bfloat16, torch.float16)
            and w1.shape[0] % 8 == 0 and w1.shape[1] % 8 == 0 and torch.cuda.get_device_capability(x.device)[0] >= 9)


def install_problem() -> str:
    """quack compiles only from a site-packages install: it fingerprints each function it compiles by its source unless
    the function's file sits in a site-packages folder, and elsewhere walks into the CuTe DSL's internals and fails
    mid-run (`epilogue fn depends on <ContextVar ...>`, seen with `pip install --target DIR`)."""
    spec = importlib.util.find_spec("cutlass")
    where = str(spec.origin) if spec else ""
    if "site-packages" in where or "dist-packages" in where:
        return ""
    return (f"quack-kernels' CuTe DSL (nvidia-cutlass-dsl) is {'at ' + where if where else 'not importable'}; quack "
            "compiles only from a site-packages install: pip install quack-kernels into the environment (not --target)")


@torch.library.custom_op("genlab::quack_gelu_mlp_fwd", mutates_args=())
def _fwd(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
         b2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, D] -> (out [M, D], pre-activation [M, H]); one epilogue GEMM and one cuBLAS addmm."""
    from quack.gemm_interface import gemm_act  # optional (.[kernels], Hopper); the first CUDA call imports it
    pre, post = gemm_act(x, w1.t(), bias=b1, activation=ACT, store_preact=True, tuned=tuned())
    return torch.addmm(b2, post, w2.t()), pre


@_fwd.register_fake
def _(x, w1, b1, w2, b2):
    return x.new_empty(x.shape[0], w2.shape[0]), x.new_empty(x.shape[0], w1.shape[0])


@torch.library.custom_op("genlab::quack_gelu_mlp_bwd", mutates_args=())
def _bwd(dy: torch.Tensor, x: torch.Tensor, pre: torch.Tensor, w1: torch.Tensor,
         w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dW1, db1, dW2, db2) from dy [M, D] and the saved x and pre-activation."""
    from quack.gemm_interface import gemm_dact  # optional (.[kernels], Hopper); the first CUDA call imports it
    dpre, post = gemm_dact(dy, w2, pre, activation=ACT, tuned=tuned())  # dy W2 * GELU'(pre), and GELU(pre)
    acc = torch.promote_types(dy.dtype, torch.float32)  # bias sums over all tokens: at least float32
    db1, db2 = dpre.sum(0, dtype=acc), dy.sum(0, dtype=acc)
    return dpre @ w1, dpre.t() @ x, db1.to(w1.dtype), dy.t() @ post, db2.to(w2.dtype)


@_bwd.register_fake
def _(dy, x, pre, w1, w2):
    return torch.empty_like(x), torch.empty_like(w1), w1.new_empty(w1.shape[0]), torch.empty_like(w2), \
        w2.new_empty(w2.shape[0])


def _setup(ctx, inputs, output):
    x, w1, _, w2, _ = inputs
    ctx.save_for_backward(x, output[1], w1, w2)


def _backward(ctx, dy, _dpre):  # the pre-activation output is saved for the backward, not used downstream
    x, pre, w1, w2 = ctx.saved_tensors
    return _bwd(dy.to(x.dtype).contiguous(), x, pre, w1, w2)


_fwd.register_autograd(_backward, setup_context=_setup)


class QuackGeluMlp(Mlp):
    """`Mlp(kind="gelu")` (same parameters and state-dict keys) with fc1's GELU and its derivative in GEMM epilogues."""

    def __init__(self, dim: int, hidden: int, bias: bool = True):
        super().__init__(dim, hidden, "gelu", bias)

    def forward(self, x, grid=None):  # grid: unused (Mix-FFN reads it)
        w1 = self.fc1.weight
        if not supports(x, w1) or x.numel() == 0:
            return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
        dt = compute_dtype(x)  # the custom ops see no autocast: cast as autocast would, here
        b1 = self.fc1.bias if self.fc1.bias is not None else w1.new_zeros(w1.shape[0])
        b2 = self.fc2.bias if self.fc2.bias is not None else w1.new_zeros(self.fc2.weight.shape[0])
        out, _ = _fwd(x.reshape(-1, x.shape[-1]).to(dt).contiguous(), w1.to(dt), b1.to(dt),
                      self.fc2.weight.to(dt), b2.to(dt))
        return out.view(*x.shape[:-1], out.shape[-1])


@mlp_registry.register("gelu_quack", "gelu with fc1's GELU (forward) and GELU' (backward) in quack-kernels' GEMM epilogues "
                                     "on Hopper+ (same parameters; plain gelu elsewhere)",
                       matrices=2, cuda_only=True, package="quack", install_problem=install_problem)
def gelu_quack_mlp(dim: int, hidden: int, bias: bool = True) -> QuackGeluMlp:
    return QuackGeluMlp(dim, hidden, bias)
