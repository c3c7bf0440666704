"""Fair model-size comparisons: trade depth for width at a constant parameter count."""
from __future__ import annotations

import torch


def dit_param_count(depth: int, dim: int, heads: int, patch: int = 2, channels: int = 4, image_size: int = 32,
                    num_classes: int = 1000) -> int:
    """Exact parameter count of genlab's DiT, built on the meta device (no memory, no time)."""
    from genlab.config import ModelConfig
    from genlab.models.dit import build_dit
    mc = ModelConfig(size="B", dim=dim, depth=depth, heads=heads, patch_size=patch)
    spec = {"kind": "image", "image_size": image_size, "channels": channels, "num_classes": num_classes}
    with torch.device("meta"):
        model = build_dit(mc, spec)
    return sum(p.numel() for p in model.parameters())


def constant_param_dims(ref_depth: int, ref_dim: int, depths: list[int], head_dim: int = 64, **shape):
    """For each depth, the width (a multiple of head_dim) whose DiT has the parameter count closest to
    the reference (depth, dim). Returns [(depth, dim, heads, relative_param_error)].

    Block parameters grow as depth * dim^2, so dim ~ ref_dim * sqrt(ref_depth / depth) is the start;
    the neighbouring multiples of head_dim are then compared by exact count.
    """
    target = dit_param_count(ref_depth, ref_dim, max(1, ref_dim // head_dim), **shape)
    out = []
    for d in depths:
        guess = ref_dim * (ref_depth / d) ** 0.5
        base = max(1, round(guess / head_dim))
        best = None
        for m in range(max(1, base - 2), base + 3):
            w = m * head_dim
            n = dit_param_count(d, w, m, **shape)
            err = (n - target) / target
            if best is None or abs(err) < abs(best[3]):
                best = (d, w, m, err)
        out.append(best)
    return out
