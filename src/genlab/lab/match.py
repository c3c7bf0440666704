"""Parameter matching: the widths that give a backbone a reference model's parameter count (exact: each candidate built
on the meta device), so architectures, attention kernels and depths compare at equal size (docs/sweeps.md).
`match_params` moves the head count, then model.mlp_ratio; `constant_param_dims` trades depth for width.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from genlab.config.tree import ModelConfig
from genlab.core.errors import GenlabError
from genlab.families.image_flow.dit import dit_size
from genlab.families.models import model_registry
from genlab.nn.mlp import mlp_registry

# the data shape of the shipped DiT-B/2 ablations (synthetic 32x32x4 latents, 1000 classes): constant_param_dims'
# default, for base configs whose data shape is only known once the data is read
LATENT_SPEC = {"kind": "image", "image_size": 32, "channels": 4, "num_classes": 1000}


def param_count(cfg_model, data_spec: dict) -> int:
    """Exact parameter count of the model `cfg_model` describes, for data of `data_spec`'s shape."""
    with torch.device("meta"):
        model = model_registry.get(cfg_model.name)(cfg_model, data_spec)
    return sum(p.numel() for p in model.parameters())


def _nearest_heads(count, guess: int, radius: int, target: int) -> tuple[int, int]:
    """(heads, count(heads)) for the head count within `radius` of `guess` whose count is closest to `target`
    (the smaller one on a tie)."""
    counts = {h: count(h) for h in range(max(1, guess - radius), guess + radius + 1)}
    heads = min(counts, key=lambda h: abs(counts[h] - target))
    return heads, counts[heads]


def _ratio_for(hidden: int, dim: int) -> float:
    """An mlp_ratio whose int(dim * ratio) is exactly `hidden` (halfway, so float rounding cannot drop a unit)."""
    return (hidden + 0.5) / dim


def match_params(cfg_model, data_spec: dict, target: int, tol: float = 0.02) -> dict:
    """{dim, heads, depth, mlp_ratio} for cfg_model's backbone with ~`target` parameters (|error| <= tol),
    keeping its depth and head width (model.dim / model.heads). Raises GenlabError when no width gets there."""
    dim0, depth, heads0 = dit_size(cfg_model)
    head_dim = dim0 // heads0
    base = dataclasses.replace(cfg_model, depth=depth)

    def count(heads, ratio):
        return param_count(dataclasses.replace(base, dim=heads * head_dim, heads=heads, mlp_ratio=ratio), data_spec)

    r0 = cfg_model.mlp_ratio
    n0 = count(heads0, r0)
    guess = max(1, round(heads0 * math.sqrt(target / n0)))  # block weights grow as width^2
    heads, n = _nearest_heads(lambda h: count(h, r0), guess, 1, target)
    dim = heads * head_dim
    out = {"dim": dim, "heads": heads, "depth": depth, "mlp_ratio": r0}
    if abs(n - target) <= tol * target:
        return out
    # the count is affine in the MLP's own width (hidden_of of the GELU width int(dim * ratio)): one more build
    # gives the slope, then the GELU width whose hidden_of lands closest to the target is searched without builds
    hidden_of = mlp_registry.spec(cfg_model.mlp).hidden_of
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


def constant_param_dims(ref_depth: int, ref_dim: int, depths: list[int], head_dim: int = 64, model=None,
                        spec: dict | None = None):
    """[(depth, dim, heads, rel_error)]: for each depth, the width (a multiple of head_dim) whose DiT has the parameter
    count closest to the reference (ref_depth, ref_dim); `model` (default DiT-B) and `spec` (default LATENT_SPEC)."""
    base = dataclasses.replace(model if model is not None else ModelConfig(size="B"), name="dit")
    spec = spec or LATENT_SPEC

    def count(depth, dim, heads):
        return param_count(dataclasses.replace(base, dim=dim, depth=depth, heads=heads), spec)

    target = count(ref_depth, ref_dim, max(1, ref_dim // head_dim))
    out = []
    for d in depths:
        guess = max(1, round(ref_dim * (ref_depth / d) ** 0.5 / head_dim))  # block weights grow as depth * dim^2
        heads, n = _nearest_heads(lambda h: count(d, h * head_dim, h), guess, 2, target)
        out.append((d, heads * head_dim, heads, (n - target) / target))
    return out
