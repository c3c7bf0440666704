"""Named conditions of the image and frame backbones, each embedded by a registered embedder: a method declares
a new one (a step size, a guidance scale) in `Method.conditions` as {name: embedder} and the backbone takes it as a
keyword input, `model(x_t, t, y, d=...)`, with no backbone edited (`ConditionSet`; docs/architecture.md)."""
from __future__ import annotations

import torch
import torch.nn as nn

from genlab.core.errors import GenlabError
from genlab.core.registry import Registry
from genlab.nn.embeddings import TimestepEmbedder, embed_flops

condition_registry = Registry("condition")


condition_registry.register("scalar", "a real number per sample in [0, 1] (a time, a step size, a guidance "
                                      "weight mapped to [0, 1]): sinusoidal features of 1000·v, then an MLP")(TimestepEmbedder)


@condition_registry.register("log2_scalar", "a positive real per sample embedded by its log2 (a step size 2^-k: the "
                                            "shortcut models' step index), sinusoidal features, then an MLP")
class Log2Embedder(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.inner = TimestepEmbedder(dim)

    def forward(self, v):
        # log2 of a step size in (0, 1] is in [-k, 0]: shift to a small positive range before the sin-cos features
        return self.inner((torch.log2(v.clamp_min(1e-6)) + 16.0) / 16.0)


def combine(embeddings: list[torch.Tensor]) -> torch.Tensor:
    """The adaLN vector: the embeddings added in order, starting from the first (a start value 0 would cost an extra
    kernel)."""
    return sum(embeddings[1:], embeddings[0])


class ConditionSet(nn.Module):
    """The embedders of a backbone's extra conditions, in declaration order (empty: no state-dict keys)."""

    def __init__(self, dim: int, conditions: dict[str, str] | tuple = ()):
        super().__init__()
        items = dict(conditions)
        for name in items:
            if not name.isidentifier() or name in ("t", "y", "x_t", "context"):
                raise GenlabError(f"condition name {name!r} must be a new Python identifier (not t, y, x_t, context)")
        self.embed = nn.ModuleDict({name: condition_registry.get(kind)(dim) for name, kind in items.items()})

    def forward(self, batch: int, **values) -> list[torch.Tensor]:
        """[B, D] embeddings of the given values, one per declared condition; a missing or unknown name fails."""
        unknown = sorted(set(values) - set(self.embed))
        missing = sorted(set(self.embed) - set(values))
        if unknown or missing:
            raise GenlabError(f"model conditions: unknown {unknown or 'none'}, missing {missing or 'none'} "
                              f"(built with {list(self.embed) or 'none'})")
        out = []
        for name, emb in self.embed.items():
            v = torch.as_tensor(values[name], device=next(emb.parameters()).device)
            v = v.to(torch.promote_types(v.dtype, torch.float32))  # float32 at least, float64 kept like the time
            out.append(emb(v.expand(batch) if v.ndim == 0 else v))
        return out

    def flops(self, dim: int) -> int:
        """Forward FLOPs of the embedders' MLPs for one sample (the sin-cos features are not matmuls)."""
        return sum(embed_flops(m, dim) for m in self.modules() if isinstance(m, TimestepEmbedder))
