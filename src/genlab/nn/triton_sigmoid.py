"""Sigmoid attention in Triton (the CUDA path of ``model.attention=sigmoid``; docs/backbones.md):
``out_i = sum_j sigmoid(q_i.k_j / sqrt(D) - log M) v_j`` (Ramapuram et al. 2024), M keys, optionally causal
(query i sees keys j <= i + M - N), no normalisation. Forward ``P = 1 / (1 + 2^-(S c + b'))``, ``O += P V``: no
running max, no row sum, nothing saved but q, k, v. Backward (P recomputed): ``dV = P^T dO``,
``dS = (dO V^T) P (1 - P)``, ``dQ = dS K / sqrt(D)``, ``dK = dS^T Q / sqrt(D)``, no atomics. q ``[B, H, N, D]``,
k, v ``[B, H, M, D]``, D in 32/64/128, fp16/bf16/fp32 of one dtype. ``GENLAB_TRITON_SIGMOID_RCP=div``
(benchmarking) divides instead of the Newton reciprocal.
"""
from __future__ import annotations

import math
import os

import torch

from genlab.core.errors import GenlabError
from genlab.nn.triton_attention import (LOG2E, _cdiv, _kernels, _new_bnhd, _prep, _s, attach_backward,  # no triton import
                                        interpreting, missing_triton)

SUPPORTED_HEAD_DIMS = (32, 64, 128)


@torch.compiler.assume_constant_result
def triton_available() -> bool:
    """Whether the kernels can be imported (a constant to torch.compile: checked once, not traced)."""
    return _kernels("triton_sigmoid_kernels") is not None


def _shapes_ok(q, k, v) -> bool:
    return (q.dim() == k.dim() == v.dim() == 4 and k.shape == v.shape and k.shape[:2] == q.shape[:2]
            and k.shape[-1] == q.shape[-1] and q.shape[-1] in SUPPORTED_HEAD_DIMS and k.shape[-2] > 0)


def _dtypes_ok(q, k, v) -> bool:
    return q.dtype == k.dtype == v.dtype and q.dtype in (torch.float16, torch.bfloat16, torch.float32)


def supports(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `sigmoid_attention_triton` runs these inputs (CUDA or the interpreter, head dim, dtypes, shapes)."""
    return (q.is_cuda or interpreting()) and _shapes_ok(q, k, v) and _dtypes_ok(q, k, v) and triton_available()


# ----------------------------------------------------------------------------------------------
# host side. (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel and head dim; BLOCK_M counts query rows,
# BLOCK_N key rows. Picked so that the sm_90 builds of bf16/fp16 spill no registers where it could be avoided
# (ptxas resource usage; head dim 128 causal still spills a few bytes); not autotuned. fp32 multiplies without
# tensor cores (ieee dots are register hungry): small tiles, one stage. The interpreter runs 16x16 blocks.
_CONFIGS = {
    "fwd": {32: (128, 64, 4, 3), 64: (128, 64, 8, 3), 128: (128, 64, 8, 2)},
    "dkdv": {32: (64, 128, 8, 2), 64: (64, 128, 8, 2), 128: (32, 64, 8, 2)},
    "dq": {32: (128, 64, 8, 2), 64: (128, 64, 8, 2), 128: (64, 32, 4, 2)},
}
_FP32_CONFIGS = {
    "fwd": {32: (64, 32, 8, 1), 64: (64, 32, 8, 1), 128: (32, 32, 8, 1)},
    "dkdv": {32: (32, 32, 8, 1), 64: (32, 32, 8, 1), 128: (32, 32, 8, 1)},
    "dq": {32: (64, 32, 8, 1), 64: (64, 32, 8, 1), 128: (32, 32, 8, 1)},
}
_INTERP_CONFIG = (16, 16, 1, 1)


def _scales(q, k):
    """1 / sqrt(D), and the exp2 form's scale and bias: sigmoid(s / sqrt(D) - log M) = 1 / (1 + 2^-(s c + b))."""
    scale = q.shape[-1] ** -0.5
    return scale, scale * LOG2E, -math.log(k.shape[-2]) * LOG2E


def _launch(kernel, kind: str, q, k, causal: bool, *args):
    """`kernel` over (blocks of its rows: queries, or keys for dK/dV; batch * heads) with its config and constants."""
    (B, H, N, D), M = q.shape, k.shape[-2]
    interp = interpreting()
    bm, bn, warps, stages = _INTERP_CONFIG if interp else (_FP32_CONFIGS if q.dtype == torch.float32 else _CONFIGS)[kind][D]
    precision = "tf32" if q.dtype != torch.float32 or torch.backends.cuda.matmul.allow_tf32 else "ieee"
    # Newton steps of the reciprocal: 2 leave 7e-6 relative error (below bf16/fp16 rounding), 3 leave 1e-7
    rcp_iters = 0 if os.environ.get("GENLAB_TRITON_SIGMOID_RCP") == "div" else 3 if q.dtype == torch.float32 else 2
    kernel[(_cdiv(M, bn) if kind == "dkdv" else _cdiv(N, bm), B * H)](
        *args, H, N, M, HEAD_DIM=D, CAUSAL=causal, EVEN_M=N % bm == 0, EVEN_N=M % bn == 0, PRECISION=precision,
        RCP_ITERS=rcp_iters, BLOCK_M=bm, BLOCK_N=bn, **({} if interp else {"num_warps": warps, "num_stages": stages}))


def _check(q, k, v):
    K = _kernels("triton_sigmoid_kernels")
    if K is None:
        raise GenlabError(f"sigmoid attention's Triton path needs the 'triton' package "
                          f"{missing_triton('triton_sigmoid_kernels')}")
    if not _shapes_ok(q, k, v):
        raise GenlabError(f"sigmoid_attention_triton needs q [B, H, N, D] and k, v [B, H, M, D] with D in "
                          f"{SUPPORTED_HEAD_DIMS} and M > 0, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if not _dtypes_ok(q, k, v):
        raise GenlabError(f"sigmoid_attention_triton needs fp16/bf16/fp32 q, k, v of one dtype, got "
                          f"{q.dtype}, {k.dtype}, {v.dtype}")
    return K


def _forward(q, k, v, causal: bool):
    K = _check(q, k, v)
    B, H, N, D = q.shape
    q, k, v = _prep(q), _prep(k), _prep(v)
    o = _new_bnhd(B, H, N, D, q.dtype, q.device)
    if N == 0 or B * H == 0:
        return o
    _launch(K._sigmoid_fwd, "fwd", q, k, causal, q, k, v, o, *_scales(q, k)[1:], *_s(q), *_s(k), *_s(v), *_s(o))
    return o


def _backward(do, q, k, v, causal: bool):
    K = _check(q, k, v)
    B, H, N, D = q.shape
    M = k.shape[-2]
    q, k, v, do = _prep(q), _prep(k), _prep(v), _prep(do)
    dq = _new_bnhd(B, H, N, D, q.dtype, q.device)
    dk = _new_bnhd(B, H, M, D, k.dtype, k.device)
    dv = _new_bnhd(B, H, M, D, v.dtype, v.device)
    if N == 0 or B * H == 0:
        return dq, dk.zero_(), dv.zero_()
    strides = (*_s(q), *_s(k), *_s(v), *_s(do))
    _launch(K._sigmoid_bwd_dkdv, "dkdv", q, k, causal, q, k, v, do, dk, dv, *_scales(q, k), *strides, *_s(dk))
    _launch(K._sigmoid_bwd_dq, "dq", q, k, causal, q, k, v, do, dq, *_scales(q, k), *strides, *_s(dq))
    return dq, dk, dv


# custom ops: opaque to torch.compile (dynamo does not trace into the launches), with autograd attached
@torch.library.custom_op("genlab::triton_sigmoid_attn_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return _forward(q, k, v, causal)


@_fwd_op.register_fake
def _(q, k, v, causal):
    B, H, N, D = q.shape
    return _new_bnhd(B, H, N, D, q.dtype, q.device)


@torch.library.custom_op("genlab::triton_sigmoid_attn_bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(do, q, k, v, causal)


@_bwd_op.register_fake
def _(do, q, k, v, causal):
    B, H, N, D = q.shape
    M = k.shape[-2]
    return (_new_bnhd(B, H, N, D, q.dtype, q.device), _new_bnhd(B, H, M, D, k.dtype, k.device),
            _new_bnhd(B, H, M, D, v.dtype, v.device))


attach_backward(_fwd_op, _bwd_op, save_outputs=False)  # P is recomputed from q and k: nothing else to keep


def sigmoid_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """sigmoid(q k^T / sqrt(D) - log M) v for q [B, H, N, D], k/v [B, H, M, D] (CUDA, or TRITON_INTERPRET=1)."""
    return _fwd_op(q, k, v, causal)
