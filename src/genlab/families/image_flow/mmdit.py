"""MMDiT (Esser et al. 2024, SD3, arXiv:2403.03206) and the DiT + MMDiT hybrid (model.dual_blocks; docs/backbones.md):
image and conditioning tokens keep their own block weights and meet in one attention.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.models import model_registry
from genlab.families.image_flow import dit
from genlab.nn.attention import attention_flops
from genlab.nn.backbone import LongSkips, block_flops, prefix_rope
from genlab.nn.conditions import combine
from genlab.nn.mlp import TokenGrid

NO_GRID = TokenGrid(0, 0, 0)  # conditioning tokens: an image backbone's tokens without grid positions


class JointBlock(nn.Module):
    """SD3's MMDiT block. The context stream borrows the image stream's attention kernel (one differential lambda
    per block); in SD3's last block its output is discarded, so it only projects keys and values (pre_only)."""

    token_streams = 2  # forward(x, ctx, ...) -> (x, ctx): what layer analysis passes through a skipped block

    def __init__(self, s: dit.DiTSpec, layer: int, last: bool = False):
        super().__init__()
        self.x = dit.DiTBlock.of(s, layer)
        self.ctx = dit.DiTBlock.of(s, layer, kernel=False, pre_only=last, grid=False)

    def forward(self, x, ctx, c, rope=None, grid=None):
        qkv_x, mod_x = self.x.pre(x, c, rope)
        qkv_c, mod_c = self.ctx.pre(ctx, c)  # conditioning tokens: no rotation (position 0)
        L = ctx.shape[1]
        k, v = (torch.cat([a, b], dim=2) for a, b in zip(qkv_c[1:], qkv_x[1:]))
        if self.ctx.pre_only:  # the context's output is discarded: only the image tokens query
            return self.x.post(x, self.x.attn.kernel(qkv_x[0], k, v), mod_x, grid), ctx
        o = self.x.attn.kernel(torch.cat([qkv_c[0], qkv_x[0]], dim=2), k, v)
        return self.x.post(x, o[:, :, L:], mod_x, grid), self.ctx.post(ctx, o[:, :, :L], mod_c, NO_GRID)


class MMDiT(dit.ImageBackbone):
    def __init__(self, spec: dit.DiTSpec):
        s, p = spec, spec.patch_size
        if not 0 <= s.dual_blocks <= s.depth:
            raise GenlabError(f"model.dual_blocks ({s.dual_blocks}) must be between 0 and model.depth ({s.depth})")
        super().__init__(s)
        self.dual = s.dual_blocks or s.depth
        self.context_embed = nn.Linear(s.context_dim, s.dim) if s.context_dim else None
        self.blocks = nn.ModuleList(
            JointBlock(s, i, last=i == s.depth - 1) if i < self.dual else dit.DiTBlock.of(s, i) for i in range(s.depth))
        self.skips = LongSkips(s.dim, s.depth, s.long_skips)                               # image / joint tokens
        self.ctx_skips = LongSkips(s.dim, s.depth, s.long_skips, receivers=range(self.dual))  # context, dual blocks
        self.final = dit.FinalLayer(s.dim, p * p * s.channels, s.adaln, s.norm)
        self._init_weights()
        self.ctx_skips.reset_parameters()

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, y: torch.Tensor, context: torch.Tensor | None = None,
                **conditions):
        """x_t [B, C, H, W], t [B], y [B] class ids (null_class = unconditional); context [B, L, context_dim] optional."""
        s = self.spec
        x, embs = self.embed(x_t, t, y, conditions)
        c = combine(embs)
        if context is not None and self.context_embed is None:  # ctx: the class and time tokens, or the context's
            raise GenlabError("this MMDiT was built without context_dim: it takes class and timestep tokens only")
        ctx = (torch.stack([embs[1], embs[0]], dim=1) if context is None else self.context_embed(context)).to(x.dtype)
        L = ctx.shape[1]
        rope, grid = self.pos.rope(), TokenGrid(0, self.grid, self.grid)
        joint_rope, joint_grid = prefix_rope(rope, L), TokenGrid(L, self.grid, self.grid)
        saved = {}
        for i, block in enumerate(self.blocks):
            if i < self.dual:
                if i in self.skips.source:
                    px, pc = saved.pop(self.skips.source[i])
                    x, ctx = self.skips.merge(i, x, px), self.ctx_skips.merge(i, ctx, pc)
                x, ctx = block(x, ctx, c, rope=rope, grid=grid)
                if i in self.skips.sources:
                    saved[i] = (x, ctx)
                continue
            if i == self.dual:
                h = torch.cat([ctx, x], dim=1)
            if i in self.skips.source:
                src = saved.pop(self.skips.source[i])
                h = self.skips.merge(i, h, torch.cat([src[1], src[0]], dim=1) if isinstance(src, tuple) else src)
            h = block(h, c, rope=joint_rope, grid=joint_grid)
            if i in self.skips.sources:
                saved[i] = h
        if self.dual < s.depth:
            x = h[:, L:]
        return self.image(self.final(x, c))

    def flops_per_sample(self, context_len: int = 2) -> int:
        """Forward FLOPs as DiT.flops_per_sample counts them, for context_len conditioning tokens."""
        s, N, D, L = self.spec, self.num_tokens, self.spec.dim, context_len
        f = self.stem_flops()
        if self.context_embed is not None and context_len:
            f += 2 * L * s.context_dim * D
        for i in range(s.depth):
            if i < self.dual:
                last = i == s.depth - 1
                f += block_flops(s, N, N, kernel=False) + block_flops(s, L, 0, ada=2 if last else 6, kernel=False,
                                                                       pre_only=last)
                f += attention_flops(s.attention, N if last else N + L, N + L, s.heads, D // s.heads)
            else:
                f += block_flops(s, N + L, N)
        f += self.skips.flops(lambda j: N if j < self.dual else N + L) + self.ctx_skips.flops(lambda j: L)
        return f + 2 * D * 2 * D + 2 * N * D * s.patch_size ** 2 * s.channels


class MmditKeys(cf.Keys, section="model"):
    dual_blocks: int = cf.F(0, "mmdit: the first k blocks are dual-stream, the rest DiT blocks over the joint sequence "
                                   "(0 = all dual: SD3's MMDiT)", ge=0)


def _check_mmdit(cfg, dim: int, heads: int, depth: int):
    keys = MmditKeys.of(cfg.model)
    if keys.dual_blocks > depth:
        raise GenlabError(f"model.dual_blocks ({keys.dual_blocks}) must be at most model.depth ({depth}); "
                          f"0 = all blocks dual-stream")


@model_registry.register("mmdit", "MMDiT (SD3): image and conditioning streams with their own weights, joint attention, "
                                  "adaLN from the pooled condition; model.dual_blocks=k: k dual blocks, then DiT blocks",
                         keys=MmditKeys, reads=dit.DitKeys.dotted(), check=_check_mmdit,
                         example=dit.image_backbone_example({"dual_blocks": [1]}), **dit.IMAGE_BACKBONE)
def build_mmdit(cfg_model, data_spec) -> MMDiT:
    return MMDiT(dit.spec_from_config(cfg_model, data_spec, dual_blocks=MmditKeys.of(cfg_model).dual_blocks))
