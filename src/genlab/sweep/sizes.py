"""Fair model-size comparisons: trade depth for width at a constant parameter count."""
from __future__ import annotations

import dataclasses

import torch

# the shape of the shipped DiT-B/2 ablations: synthetic 32x32x4 latents, 1000 classes
DEFAULT_SPEC = {"kind": "image", "image_size": 32, "channels": 4, "num_classes": 1000}


def dit_param_count(depth: int, dim: int, heads: int, model=None, spec: dict | None = None) -> int:
    """Exact parameter count of genlab's DiT, built on the meta device (no memory, no time).

    `model` is a ModelConfig whose other fields (patch size, MLP ratio, qk-norm) are kept; `spec` the data shape.
    """
    from genlab.config import ModelConfig
    from genlab.models.dit import build_dit
    base = model if model is not None else ModelConfig(size="B")
    mc = dataclasses.replace(base, dim=dim, depth=depth, heads=heads)
    with torch.device("meta"):
        m = build_dit(mc, spec or DEFAULT_SPEC)
    return sum(p.numel() for p in m.parameters())


def constant_param_dims(ref_depth: int, ref_dim: int, depths: list[int], head_dim: int = 64, model=None,
                        spec: dict | None = None):
    """For each depth, the width (a multiple of head_dim, heads = width / head_dim) whose DiT has the
    parameter count closest to the reference (ref_depth, ref_dim). Returns [(depth, dim, heads, rel_error)].

    Block parameters grow as depth * dim^2 (12 dim^2 for attention + MLP, 6 dim^2 for adaLN), so
    dim ~ ref_dim * sqrt(ref_depth / depth) is the start; neighbouring multiples are compared by exact count.
    """
    target = dit_param_count(ref_depth, ref_dim, max(1, ref_dim // head_dim), model, spec)
    out = []
    for d in depths:
        guess = ref_dim * (ref_depth / d) ** 0.5
        base = max(1, round(guess / head_dim))
        best = None
        for m in range(max(1, base - 2), base + 3):
            n = dit_param_count(d, m * head_dim, m, model, spec)
            err = (n - target) / target
            if best is None or abs(err) < abs(best[3]):
                best = (d, m * head_dim, m, err)
        out.append(best)
    return out
