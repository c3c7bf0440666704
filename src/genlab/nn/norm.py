"""Normalisation layers (registry `norm`) and LayerNorm + adaLN modulation, y = LN(x) * (1 + scale) + shift
(registry `adaln`), with `norm_modulate_by` choosing between them for a block; the dtype an image backbone's residual
stream is kept in under autocast (registry `residual`: input tensor -> dtype)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.core.registry import Registry
from genlab.nn.kernels import KernelSpec, compute_dtype


@dataclass(frozen=True, kw_only=True)
class AdalnSpec(KernelSpec):
    # fused forms of the two residual steps around it in a DiT block (residual_ops_by); None = plain
    add_norm: Callable | None = None       # (x, y, gate, shift, scale, eps) -> (x + gate*y, norm_modulate(that))
    gated_add: Callable | None = None      # (x, y, gate) -> x + gate*y


adaln_registry = Registry("adaln", AdalnSpec)
norm_registry = Registry("norm")
residual_registry = Registry("residual")


# norm entries: (dim, bias, affine, eps) -> module; affine=False for adaLN, which brings its own scale and shift
@norm_registry.register("layernorm", "LayerNorm (Ba et al. 2016)")
def layernorm(dim: int, bias: bool = True, affine: bool = True, eps: float | None = None) -> nn.Module:
    return nn.LayerNorm(dim, eps=eps or 1e-5, elementwise_affine=affine, bias=bias and affine)


@norm_registry.register("rmsnorm", "RMSNorm (Zhang & Sennrich 2019): no mean subtraction, no bias")
def rmsnorm(dim: int, bias: bool = True, affine: bool = True, eps: float | None = None) -> nn.Module:
    return nn.RMSNorm(dim, eps=eps, elementwise_affine=affine)


def modulate(x, shift, scale):
    return x * (1 + scale[:, None]) + shift[:, None]


@adaln_registry.register("unfused", "nn.LayerNorm, then x*(1+scale)+shift as separate ops (fp32 output under autocast)")
def norm_modulate_unfused(x, shift, scale, eps):
    return modulate(F.layer_norm(x, x.shape[-1:], eps=eps), shift, scale)


@adaln_registry.register("fused", "LayerNorm + modulation in one fp32 expression, output in the compute dtype "
                                  "(one kernel under torch.compile; LayerNorm + addcmul in eager)")
def norm_modulate_fused(x, shift, scale, eps):
    """Same function as `unfused`; the statistics and the modulation are computed in fp32 (at least) and the result is
    cast once to the autocast dtype (what the next matmul would cast it to), so nothing fp32 is written."""
    out_dtype = compute_dtype(x)
    with torch.autocast(x.device.type, enabled=False):
        cdt = torch.promote_types(x.dtype, torch.float32)  # fp32, or fp64 when the model is fp64
        xf, shift, scale = x.to(cdt), shift.to(cdt)[:, None], scale.to(cdt)[:, None]
        if torch.compiler.is_compiling():  # inductor fuses these into one reduction kernel
            var, mean = torch.var_mean(xf, dim=-1, keepdim=True, correction=0)
            y = (xf - mean) * torch.rsqrt(var + eps) * (1 + scale) + shift
        else:
            y = torch.addcmul(shift, F.layer_norm(xf, xf.shape[-1:], eps=eps), 1 + scale)
        return y.to(out_dtype)


def gated_add(x, y, gate):
    return x + gate[:, None] * y


def add_norm_modulate(norm_modulate):
    """The plain composition: r = x + gate * y, then norm_modulate(r) (what a fused `add_norm` entry computes)."""
    def run(x, y, gate, shift, scale, eps):
        r = gated_add(x, y, gate)
        return r, norm_modulate(r, shift, scale, eps)
    return run


def residual_ops_by(norm: str, adaln: str, norm_modulate):
    """(add_norm, gated_add) of a DiT block: the `adaln` entry's fused forms where it has them (LayerNorm only), else
    the plain composition around `norm_modulate`."""
    spec = adaln_registry.spec(adaln) if norm == "layernorm" else None
    return ((spec and spec.add_norm) or add_norm_modulate(norm_modulate)), ((spec and spec.gated_add) or gated_add)


def norm_modulate_by(norm: str, adaln: str, dim: int, eps: float):
    """LayerNorm goes through the tuned `adaln` entries; any other norm is its module (no affine), then x*(1+scale)+shift."""
    if norm == "layernorm":
        return adaln_registry.get(adaln)
    module = norm_registry.get(norm)(dim, affine=False, eps=eps)
    return lambda x, shift, scale, eps: modulate(module(x), shift, scale)


@residual_registry.register("fp32", "residual stream in the input dtype (fp32 under bf16 autocast, as in the DiT reference)")
def residual_fp32(x):
    return x.dtype


residual_registry.register("compute", "residual stream in the autocast dtype (bf16): half the bytes of every "
                                     "residual add, LayerNorm read and residual gradient; LayerNorm stats stay fp32")(compute_dtype)
