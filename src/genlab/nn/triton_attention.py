"""Flash attention in Triton for small head dims (16/32/64/128), `model.attention=triton` (docs/performance.md,
"Head-dim-16 attention"): bf16/fp16 ``[B, H, N, D]`` (any strides with a unit last stride), scale ``D**-0.5``,
bidirectional or causal, no mask/dropout. Forward: base-2 online softmax ``exp2(S * c - m)``, c = ``D**-0.5 * log2(e)``
(one FMA per score), saving ``lse2 = m + log2(l)``; backward: ``delta = rowsum(dO * O)``, ``P = exp2(S c - lse2)``,
``dS = P (dP - delta)``, a dK/dV kernel plus dQ by fp32 atomics (``atomic``) or by its own kernel (``split``).
Benchmarking knobs: ``GENLAB_TRITON_ATTN_EXP`` (0 ``tl.math.exp2``, the interpreter's; 1 ``ex2.approx.ftz``; 2 / 3
(default 2): 1 of every 4 / 8 exps as a degree-3 polynomial on the FMA pipe), ``GENLAB_TRITON_ATTN_BWD``
(atomic | split), ``GENLAB_TRITON_ATTN_TUNE=0`` (first config, no autotuning), ``GENLAB_TRITON_ATTN_ROWSUM``
(fadd | mma: row sums by the tensor cores, a ones-column of V).
"""
from __future__ import annotations

import importlib
import importlib.util
import os

import torch
import torch.nn.functional as F

from genlab.core.errors import GenlabError
from genlab.nn.attention_spec import attention_registry

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
# found without importing it (a constant to torch.compile); the fused kernels import it inside their custom ops
HAS_TRITON = importlib.util.find_spec("triton") is not None
LOG2E = 1.4426950408889634


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_LOADED: dict = {}


def load_kernels(name: str):
    """The kernels module genlab.nn.<name> (imports triton on first use), or the exception its import raised
    (no triton, or a broken install); cached either way. Shared by the softmax and sigmoid backends."""
    if name not in _LOADED:
        try:
            _LOADED[name] = importlib.import_module(f"genlab.nn.{name}")
        except Exception as e:  # noqa: BLE001 - ImportError, or whatever a broken triton install raises
            _LOADED[name] = e
    return _LOADED[name]


def missing_triton(name: str) -> str:
    """'(ErrorType: first line)' of the failed import of kernels module `name`, for one-line errors."""
    e = load_kernels(name)
    return f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"


def require_kernels(name: str, switch: str, valid: str):
    """The kernels module `name`, or a one-line GenlabError naming the switch that needs it and its other choices."""
    m = load_kernels(name)
    if isinstance(m, Exception):
        raise GenlabError(f"{switch} needs a working 'triton' package {missing_triton(name)}; valid choices: {valid}")
    return m


def _kernels(name: str = "triton_attention_kernels"):
    """The kernels module `name` (default: the softmax kernels); None when triton cannot be imported."""
    m = load_kernels(name)
    return None if isinstance(m, Exception) else m


def check_available(head_dim: int | None = None, device: torch.device | str | None = None) -> None:
    """Raise a one-line GenlabError when this backend cannot run (no triton, no CUDA, unsupported D)."""
    others = ", ".join(n for n in attention_registry.names() if n != "triton")
    if _kernels() is None:
        raise GenlabError(f"model.attention=triton needs the 'triton' package "
                          f"{missing_triton('triton_attention_kernels')}; valid choices without it: {others}")
    cuda_ok = torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda")
    if not cuda_ok and not interpreting():
        raise GenlabError(f"model.attention=triton needs a CUDA device (or TRITON_INTERPRET=1); "
                          f"valid choices here: {others}")
    if head_dim is not None and head_dim not in SUPPORTED_HEAD_DIMS:
        raise GenlabError(f"model.attention=triton supports head dims {', '.join(map(str, SUPPORTED_HEAD_DIMS))}, "
                          f"got {head_dim}; valid choices for this model: {others}")


# -- host side -----------------------------------------------------------------------------------------------------
_INTERP_BLOCKS = {"BLOCK_M": 32, "BLOCK_N": 32}


def _exp_mode() -> int:
    if interpreting():
        return 0  # the interpreter cannot run inline PTX
    return int(os.environ.get("GENLAB_TRITON_ATTN_EXP", "2"))


def _s(t):  # (z, h, n) strides of a [B, H, N, D] tensor
    return t.stride(0), t.stride(1), t.stride(2)


def _prep(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def _new_bnhd(B, H, N, D, dtype, device):
    """[B, H, N, D] view of a [B, N, H, D] buffer: `out.transpose(1, 2).reshape(B, N, H*D)` is then free."""
    return torch.empty(B, N, H, D, dtype=dtype, device=device).permute(0, 2, 1, 3)


def _cdiv(a, b):
    return -(-a // b)


_DEFAULTS = {"_attn_fwd": "_FWD_CONFIGS", "_attn_bwd_dkdv": "_DKDV_CONFIGS", "_attn_bwd_dq": "_DQ_CONFIGS"}


def _launch(name, grid_fn, args, meta):
    K = _kernels()
    if K is None:
        check_available()  # raises the GenlabError that names the import failure
    if interpreting():
        getattr(K, name)[grid_fn(_INTERP_BLOCKS)](*args, **meta, **_INTERP_BLOCKS)
    elif os.environ.get("GENLAB_TRITON_ATTN_TUNE", "1") == "0":  # first config of the list, no autotuning
        m, n, w, st = getattr(K, _DEFAULTS[name])[0]
        blocks = {"BLOCK_M": m, "BLOCK_N": n}
        getattr(K, name)[grid_fn(blocks)](*args, **meta, **blocks, num_warps=w, num_stages=st)
    else:
        getattr(K, name + "_tuned")[grid_fn](*args, **meta)


def _forward(q, k, v, causal: bool):
    B, H, N, D = q.shape
    q, k, v = _prep(q), _prep(k), _prep(v)
    o = _new_bnhd(B, H, N, D, q.dtype, q.device)
    lse = torch.empty(B * H, N, dtype=torch.float32, device=q.device)
    args = (q, k, v, o, lse, D ** -0.5, *_s(q), *_s(k), *_s(v), *_s(o), H, N)
    meta = dict(HEAD_DIM=D, CAUSAL=causal, EXP_MODE=_exp_mode(),
                ROWSUM_MMA=os.environ.get("GENLAB_TRITON_ATTN_ROWSUM", "fadd") == "mma")
    _launch("_attn_fwd", lambda m: (_cdiv(N, m["BLOCK_M"]), B * H), args, meta)
    return o, lse


def _backward(do, q, k, v, o, lse, causal: bool):
    B, H, N, D = q.shape
    q, k, v, o, do = _prep(q), _prep(k), _prep(v), _prep(o), _prep(do)
    delta = torch.empty(B * H, N, dtype=torch.float32, device=q.device)
    _kernels()._attn_bwd_preprocess[(_cdiv(N, 128), B * H)](o, do, delta, *_s(o), *_s(do), H, N, HEAD_DIM=D, BLOCK=128)
    dk = _new_bnhd(B, H, N, D, k.dtype, k.device)
    dv = _new_bnhd(B, H, N, D, v.dtype, v.device)
    sm_scale = D ** -0.5
    exp_mode = _exp_mode()
    mode = os.environ.get("GENLAB_TRITON_ATTN_BWD", "atomic")  # measured faster on H100 at D=16 (docs/benchmarks.md)
    if mode not in ("split", "atomic"):
        raise GenlabError(f"GENLAB_TRITON_ATTN_BWD must be split or atomic, got {mode!r}")
    atomic = mode == "atomic"
    # atomic: dQ partials add into an fp32 [B, N, H, D] buffer; split: the dQ kernel writes the result
    dq_acc = (torch.zeros(B, N, H, D, dtype=torch.float32, device=q.device).permute(0, 2, 1, 3) if atomic
              else _new_bnhd(B, H, N, D, q.dtype, q.device))
    args = (q, k, v, do, dq_acc, dk, dv, lse, delta, sm_scale, *_s(q), *_s(k), *_s(v), *_s(do), *_s(dq_acc),
            *_s(dk), H, N)
    meta = dict(HEAD_DIM=D, CAUSAL=causal, EXP_MODE=exp_mode, ATOMIC_DQ=atomic)
    _launch("_attn_bwd_dkdv", lambda m: (_cdiv(N, m["BLOCK_N"]), B * H), args, meta)
    if atomic:
        return dq_acc.to(q.dtype), dk, dv
    args = (q, k, v, do, dq_acc, lse, delta, sm_scale, *_s(q), *_s(k), *_s(v), *_s(do), *_s(dq_acc), H, N)
    meta = dict(HEAD_DIM=D, CAUSAL=causal, EXP_MODE=exp_mode)
    _launch("_attn_bwd_dq", lambda m: (_cdiv(N, m["BLOCK_M"]), B * H), args, meta)
    return dq_acc, dk, dv


def attach_backward(fwd_op, bwd_op, save_outputs: bool) -> None:
    """Autograd of a custom op (q, k, v, causal) -> out: bwd_op(do, q, k, v, *[fwd_op's outputs], causal) -> dq, dk, dv."""
    def setup(ctx, inputs, output):
        q, k, v, causal = inputs
        ctx.save_for_backward(q, k, v, *(output if save_outputs else ()))
        ctx.causal = causal

    def backward(ctx, do, *_):  # nothing flows back through the saved log-sum-exp
        return (*bwd_op(do, *ctx.saved_tensors, ctx.causal), None)
    fwd_op.register_autograd(backward, setup_context=setup)


# custom ops: opaque to torch.compile (dynamo does not trace into the launches), with autograd attached
@torch.library.custom_op("genlab::triton_attn_fwd", mutates_args=())
def _attn_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, causal)


@_attn_fwd_op.register_fake
def _(q, k, v, causal):
    B, H, N, D = q.shape
    return _new_bnhd(B, H, N, D, q.dtype, q.device), q.new_empty(B * H, N, dtype=torch.float32)


@torch.library.custom_op("genlab::triton_attn_bwd", mutates_args=())
def _attn_bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                 lse: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(do, q, k, v, o, lse, causal)


@_attn_bwd_op.register_fake
def _(do, q, k, v, o, lse, causal):
    B, H, N, D = q.shape
    return tuple(_new_bnhd(B, H, N, D, t.dtype, t.device) for t in (q, k, v))


attach_backward(_attn_fwd_op, _attn_bwd_op, save_outputs=True)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v for [B, H, N, D] bf16/fp16 tensors (self-attention: same N for q and k)."""
    if q.dtype not in (torch.float16, torch.bfloat16) or not (q.dtype == k.dtype == v.dtype):
        raise GenlabError(f"model.attention=triton needs bf16/fp16 q, k, v (got {q.dtype}, {k.dtype}, {v.dtype}); "
                          "train with train.precision=bf16 or fp16, or use model.attention=sdpa")
    if q.shape != k.shape or q.shape != v.shape:
        raise GenlabError(f"model.attention=triton needs equal q/k/v shapes [B, H, N, D], got "
                          f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    return _attn_fwd_op(q, k, v, causal)[0]


def _triton_attention(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
    if mask is not None or dropout_p > 0:
        raise GenlabError("model.attention=triton supports neither masks nor attention dropout; use sdpa or math")
    check_available(q.shape[-1], q.device)
    return flash_attention(q, k, v, causal)


def _sdpa_for_jvp(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
    """The same softmax attention where a JVP needs forward-mode AD (the Triton kernel has none); SDPA itself:
    importing genlab's attention module here would close an import cycle."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None, dropout_p=dropout_p)


attention_registry.register(  # check: called by Attention at build time (before training starts)
    "triton", "Triton flash attention tuned for small head dims (16/32/64), bf16/fp16, CUDA",
    check=check_available, forward_ad=False, jvp_fallback=_sdpa_for_jvp)(_triton_attention)
