"""Next-frame DiT (DIAMOND, Alonso et al. 2024): the target frame's patches with L context frames on its channels or as
tokens; actions, diffusion time and context noise level go into the adaLN conditioning.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.image_flow.dit import DIT_SIZES, DiTBlock, FinalLayer, depatchify, dit_size, patchify
from genlab.families.models import ModelExample, model_registry
from genlab.nn.attention import attention_flops
from genlab.nn.conditions import ConditionSet, combine
from genlab.nn.embeddings import TimestepEmbedder
from genlab.nn.positions import sincos_2d

CONTEXT_MODES = ("channels", "tokens")


class WorldDiT(nn.Module):
    def __init__(self, image_size: int, channels: int, context: int, num_actions: int, action_dim: int,
                 dim: int, depth: int, heads: int, patch_size: int = 4, mlp_ratio: float = 4.0,
                 context_mode: str = "channels", attention: str = "sdpa", qk_norm: bool = False, adaln: str = "fused",
                 action_emb: int = 64, conditions: dict | None = None):
        super().__init__()
        if context_mode not in CONTEXT_MODES:
            raise GenlabError(f"unknown model.context_mode '{context_mode}'; valid choices: {', '.join(CONTEXT_MODES)}")
        if image_size % patch_size:
            raise GenlabError(f"frame size {image_size} is not divisible by model.patch_size {patch_size}")
        if (num_actions > 0) == (action_dim > 0):
            raise ValueError("exactly one of num_actions (discrete) and action_dim (continuous) must be set")
        self.image_size, self.channels, self.context, self.p = image_size, channels, context, patch_size
        self.context_mode, self.dim, self.depth = context_mode, dim, depth
        self.num_actions, self.action_dim = num_actions, action_dim
        self.grid = image_size // patch_size
        self.num_tokens = self.grid ** 2
        pd = patch_size ** 2 * channels
        stacked = context_mode == "channels"
        self.patch_embed = nn.Linear(pd * (context + 1) if stacked else pd, dim)
        self.ctx_embed = None if stacked else nn.Linear(pd, dim)
        self.frame_embed = None if stacked else nn.Parameter(torch.zeros(context, dim))
        self.register_buffer("pos_embed", torch.from_numpy(sincos_2d(dim, self.grid, self.grid))[None], persistent=False)
        self.t_embed = TimestepEmbedder(dim)
        self.noise_embed = TimestepEmbedder(dim)  # the context noise level, so the model can discount noisy frames
        self.cond_embed = ConditionSet(dim, conditions or {})  # extra named conditions a method adds
        self.action_embed = nn.Embedding(num_actions, action_emb) if num_actions else nn.Linear(action_dim, action_emb)
        self.action_proj = nn.Sequential(nn.Linear(context * action_emb, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.attention, self.heads = attention, heads
        self.blocks = nn.ModuleList(DiTBlock(dim, heads, mlp_ratio, attention, qk_norm, adaln, layer=i)
                                    for i in range(depth))
        self.final = FinalLayer(dim, pd, adaln)
        self.mlp_ratio = mlp_ratio
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear) and not name.endswith(("ada.1", "final.linear")) and "embed.mlp" not in name:
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        if self.frame_embed is not None:
            nn.init.normal_(self.frame_embed, std=0.02)

    def forward(self, x_t, t, context, actions, ctx_noise, action_keep=None, **conditions):
        """x_t [B,C,H,W] noisy target; t [B]; context [B,L,C,H,W]; actions [B,L] or [B,L,D]; ctx_noise [B]; action_keep
        [B] (optional): 0 drops a sample's actions (the null action). Returns [B,C,H,W]."""
        B, L = context.shape[:2]
        p = self.p
        if self.context_mode == "channels":
            h = self.patch_embed(patchify(torch.cat([x_t, context.flatten(1, 2)], 1), p)) + self.pos_embed
        else:
            tgt = self.patch_embed(patchify(x_t, p)) + self.pos_embed
            ctx = self.ctx_embed(patchify(context.flatten(0, 1), p)).view(B, L, self.num_tokens, self.dim)
            ctx = ctx + self.pos_embed[:, None] + self.frame_embed[None, :, None]
            h = torch.cat([tgt, ctx.flatten(1, 2)], 1)
        a = self.action_embed(actions if self.num_actions else actions.to(self.action_embed.weight.dtype))
        act = self.action_proj(a.flatten(1))
        if action_keep is not None:
            act = act * action_keep.to(act.dtype)[:, None]
        c = combine([self.t_embed(t) + self.noise_embed(ctx_noise) + act,
                 *self.cond_embed(t.shape[0], **conditions)])
        for block in self.blocks:
            h = block(h, c)
        out = self.final(h[:, :self.num_tokens], c)
        return depatchify(out, p, self.channels, self.image_size, self.image_size)

    def flops_per_sample(self) -> int:
        """Forward matmul FLOPs (2 per multiply-add), attention included, as torch.utils.flop_counter counts."""
        N, D, L = self.num_tokens, self.dim, self.context
        pd = self.p ** 2 * self.channels
        hidden = int(D * self.mlp_ratio)
        n = N if self.context_mode == "channels" else N * (L + 1)
        f = 2 * N * pd * (L + 1) * D                               # patch embeds (target + context)
        f += 2 * 2 * (self.t_embed.freq_dim * D + D * D) + self.cond_embed.flops(D)  # time, noise-level, condition MLPs
        f += 2 * (self.action_proj[0].in_features * D + D * D)     # action projection
        if not self.num_actions:
            f += 2 * L * self.action_dim * self.action_embed.out_features
        attn = attention_flops(self.attention, n, n, self.heads, D // self.heads)
        per_block = 2 * n * D * 4 * D + attn + 2 * 2 * n * D * hidden + 2 * D * 6 * D
        f += self.depth * per_block
        f += 2 * D * 2 * D + 2 * N * D * pd
        return f


class WorldDitKeys(cf.Keys, section="model"):
    context_mode: str = cf.F("channels", "world_dit: context frames stacked on the target's channels, or as extra tokens", choices=("channels", "tokens"))


WORLD_DIT_EXAMPLE = ModelExample(  # a tiny episode spec; it reads model.attention
    spec={"kind": "episodes", "image_size": 8, "channels": 3, "context": 2, "num_actions": 4, "action_dim": 0},
    inputs=lambda spec, B, g: (
        torch.randn(B, spec["channels"], spec["image_size"], spec["image_size"], generator=g), torch.rand(B, generator=g),
        torch.randn(B, spec["context"], spec["channels"], spec["image_size"], spec["image_size"], generator=g),
        torch.randint(0, spec["num_actions"], (B, spec["context"]), generator=g), torch.rand(B, generator=g)),
    output_shape=lambda spec, B: (B, spec["channels"], spec["image_size"], spec["image_size"]))


@model_registry.register("world_dit", "next-frame DiT: target patches + L context frames (channels|tokens) + action conditioning",
                         family="world_dit", keys=WorldDitKeys, reads=("model.patch_size", "model.qk_norm", "model.adaln"),
                         sizes=DIT_SIZES, layer_keys=("attention",), example=WORLD_DIT_EXAMPLE)
def build_world_dit(cfg_model, data_spec) -> WorldDiT:
    keys = WorldDitKeys.of(cfg_model)
    if data_spec.get("kind") != "episodes":
        raise GenlabError("model.name=world_dit needs episode data (data.name=episodes)")
    dim, depth, heads = dit_size(cfg_model)
    return WorldDiT(data_spec["image_size"], data_spec["channels"], data_spec["context"], data_spec["num_actions"],
                    data_spec["action_dim"], dim, depth, heads, cfg_model.patch_size, cfg_model.mlp_ratio,
                    keys.context_mode, cfg_model.attention, cfg_model.qk_norm, cfg_model.adaln,
                    conditions=data_spec.get("conditions"))
