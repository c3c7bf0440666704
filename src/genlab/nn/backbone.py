"""Parts every image backbone shares beyond the layer registries: U-ViT long skips, rotary tables for sequences
with conditioning tokens in front of the patch grid, and the analytic FLOP count of a block."""
from __future__ import annotations

import torch
import torch.nn as nn

from genlab.nn.attention import attention_flops
from genlab.nn.mlp import mlp_flops


class LongSkips(nn.Module):
    """U-ViT long skips (Bao et al. 2023; docs/backbones.md): block depth-1-i gets Linear([x, output of block i]) for
    i < (depth - 1) // 2, starting as [I | 0]. `receivers` limits the receiving blocks (MMDiT's dual blocks)."""

    def __init__(self, dim: int, depth: int, enabled: bool = True, receivers=None):
        super().__init__()
        pairs = {depth - 1 - i: i for i in range((depth - 1) // 2)} if enabled else {}
        self.source = {j: i for j, i in pairs.items() if receivers is None or j in receivers}
        self.sources = set(self.source.values())
        self.dim = dim
        self.proj = nn.ModuleDict({str(j): nn.Linear(2 * dim, dim) for j in self.source})
        self.reset_parameters()

    def reset_parameters(self):
        for lin in self.proj.values():
            with torch.no_grad():
                lin.weight.zero_()
                lin.weight[:, :self.dim].copy_(torch.eye(self.dim))
                lin.bias.zero_()

    def merge(self, j: int, x, saved):
        return self.proj[str(j)](torch.cat([x, saved.to(x.dtype)], dim=-1))

    def flops(self, tokens_of) -> int:
        """FLOPs of the projections; tokens_of(j) = tokens entering receiving block j."""
        return sum(2 * tokens_of(j) * 2 * self.dim * self.dim for j in self.source)


def prefix_rope(rope, prefix: int):
    """Rotary tables for `prefix` conditioning tokens in front of the patch grid: they sit at position 0 (no
    rotation), as Flux gives its text tokens position id 0; the grid keeps its 2-D rotations."""
    if rope is None or prefix == 0:
        return rope
    cos, sin = rope
    return (torch.cat([cos.new_ones(prefix, cos.shape[-1]), cos]), torch.cat([sin.new_zeros(prefix, sin.shape[-1]), sin]))


def block_flops(s, n: int, grid_tokens: int, ada: int = 6, kernel: bool = True, pre_only: bool = False) -> int:
    """One block's forward FLOPs over n tokens (grid_tokens of them on the patch grid) with spec s: q/k/v and output
    projections, the attention kernel (kernel=False: a stream of a joint block, whose kernel the block counts once),
    the MLP, and `ada` x dim adaLN modulation outputs (0: no adaLN). pre_only: only the modulation and q/k/v."""
    D = s.dim
    f = 2 * n * D * 3 * D + 2 * D * ada * D
    if pre_only:
        return f
    f += 2 * n * D * D + mlp_flops(s.mlp, n, D, int(D * s.mlp_ratio), grid_tokens)
    if kernel:
        f += attention_flops(s.attention, n, n, s.heads, D // s.heads)
    return f
