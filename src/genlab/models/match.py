"""Parameter matching: the width (and, to close the last gap, the MLP width) that gives a backbone the parameter
count of a reference model, so architectures and attention kernels are compared at equal size.

Depth and head width stay those of the config: the number of heads moves in steps of one (a width step of one
head width), then model.mlp_ratio moves the MLP width until the count is within `tol` of the target (the MLP
is about 2/3 of a block's weights, so it can absorb the remainder of a head-width step: at DiT-S/B widths a few
percent of mlp_ratio). Counts are exact: each candidate is built on the meta device (no memory, no init cost).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from genlab.errors import GenlabError
from genlab.registry import mlp_registry, model_registry


def param_count(cfg_model, data_spec: dict) -> int:
    """Exact parameter count of the model `cfg_model` describes, for data of `data_spec`'s shape."""
    with torch.device("meta"):
        model = model_registry.get(cfg_model.name)(cfg_model, data_spec)
    return sum(p.numel() for p in model.parameters())


def _shape(cfg_model):
    from genlab.models.dit import dit_size
    return dit_size(cfg_model)


def _ratio_for(hidden: int, dim: int) -> float:
    """An mlp_ratio whose int(dim * ratio) is exactly `hidden` (halfway, so float rounding cannot drop a unit)."""
    return (hidden + 0.5) / dim


def match_params(cfg_model, data_spec: dict, target: int, tol: float = 0.02) -> dict:
    """{dim, heads, depth, mlp_ratio} for cfg_model's backbone with ~`target` parameters (|error| <= tol),
    keeping its depth and head width (model.dim / model.heads). Raises GenlabError when no width gets there."""
    dim0, depth, heads0 = _shape(cfg_model)
    head_dim = dim0 // heads0
    base = dataclasses.replace(cfg_model, depth=depth)

    def count(heads, ratio):
        return param_count(dataclasses.replace(base, dim=heads * head_dim, heads=heads, mlp_ratio=ratio), data_spec)

    r0 = cfg_model.mlp_ratio
    n0 = count(heads0, r0)
    guess = max(1, round(heads0 * math.sqrt(target / n0)))  # block weights grow as width^2
    cands = {h: count(h, r0) for h in range(max(1, guess - 1), guess + 2)}
    heads = min(cands, key=lambda h: abs(cands[h] - target))
    dim, n = heads * head_dim, cands[heads]
    out = {"dim": dim, "heads": heads, "depth": depth, "mlp_ratio": r0}
    if abs(n - target) <= tol * target:
        return out
    # the count is affine in the MLP's own width (hidden_of of the GELU width int(dim * ratio)): one more build
    # gives the slope, then the GELU width whose hidden_of lands closest to the target is searched without builds
    hidden_of = mlp_registry.get(cfg_model.mlp).hidden_of
    h0 = int(dim * r0)
    h1 = next(h for h in range(h0 + 1, 4 * h0 + 64) if hidden_of(h) != hidden_of(h0))
    slope = (count(heads, _ratio_for(h1, dim)) - n) / (hidden_of(h1) - hidden_of(h0))
    best = min(range(max(1, h0 // 4), 4 * h0), key=lambda h: abs(n + slope * (hidden_of(h) - hidden_of(h0)) - target))
    out["mlp_ratio"] = _ratio_for(best, dim)
    n = count(heads, out["mlp_ratio"])
    if abs(n - target) > tol * target:
        raise GenlabError(f"no width of model {cfg_model.name} (depth {depth}, head width {head_dim}) has "
                          f"{target:,} parameters within {100 * tol:g}% (closest: {n:,}); change model.depth or the "
                          f"head width, or use a larger reference")
    return out


def reference_params(cfg_model, data_spec: dict) -> int:
    """Parameters of the reference: a plain DiT (sdpa, GELU MLP, no long skips) of cfg_model's size and shape."""
    ref = dataclasses.replace(cfg_model, name="dit", attention="sdpa", mlp="gelu", long_skips=False)
    return param_count(ref, data_spec)


def matched_overrides(cfg_model, data_spec: dict, target: int, tol: float = 0.02) -> list[str]:
    """match_params as `model.key=value` overrides (what the sweeps append to a variant)."""
    m = match_params(cfg_model, data_spec, target, tol)
    return [f"model.{k}={v}" for k, v in m.items()]
