"""MaskDiT's backbone: a DiT encoder over the visible tokens `keep` [B, K], then a small DiT decoder over every position
with a learned mask token at the dropped ones; keep=None runs the whole grid (sampling, other methods).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.models import model_registry
from genlab.families.image_flow import dit
from genlab.nn.backbone import block_flops
from genlab.nn.conditions import combine
from genlab.nn.embeddings import embed_flops
from genlab.nn.mlp import TokenGrid
from genlab.nn.positions import build_position


class MaskDiT(dit.DiT):
    def __init__(self, spec, decoder_depth: int = 2, decoder_dim: int = 0):
        super().__init__(spec)
        s = spec
        Dd = decoder_dim or s.dim
        self.dec = dataclasses.replace(s, dim=Dd, depth=decoder_depth, long_skips=False)
        # MaskDiT's DecoderLayer: adaLN-modulated norm, then a projection to the decoder width
        self.decoder_in = dit.FinalLayer(s.dim, Dd, s.adaln, s.norm)
        self.decoder_cond = nn.Linear(s.dim, Dd) if Dd != s.dim else nn.Identity()  # the adaLN vector at Dd
        self.mask_token = nn.Parameter(torch.zeros(1, 1, Dd))
        self.decoder_pos = build_position("sincos2d", Dd, s.heads, (self.grid, self.grid), "dit")
        self.decoder_blocks = nn.ModuleList(dit.DiTBlock(Dd, s.heads, s.mlp_ratio, s.attention, s.qk_norm, s.adaln, s.mlp,
                                                         s.norm, layer=s.depth + j, qkv_kernel=s.qkv_kernel)
                                            for j in range(decoder_depth))
        self.final = dit.FinalLayer(Dd, s.patch_size ** 2 * s.channels, s.adaln, s.norm)
        self._init_weights()  # again: the decoder's linears as DiT's (xavier; adaLN and the output zero)
        nn.init.normal_(self.mask_token, std=0.02)  # as MAE and MaskDiT

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, y: torch.Tensor, keep: torch.Tensor | None = None,
                **conditions) -> torch.Tensor:
        """keep: [B, K] long, the visible tokens of each sample (row-major patch indices); None = all tokens."""
        s = self.spec
        h = self.pos(self.patch_embed(dit.patchify(x_t, s.patch_size)).to(self.residual_dtype(x_t)))
        c = combine(dit.embed_conditions(self, t, y, conditions))
        rope, grid = self.pos.rope(), TokenGrid(0, self.grid, self.grid)
        if keep is not None:
            if rope is not None:
                raise GenlabError("MaskDiT drops tokens per sample; rotary positions (model.pos_emb=rope2d) would need "
                                  "per-sample tables: use sincos2d or learned")
            h = h.gather(1, keep.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
            grid = None  # the visible tokens are no longer a grid (a grid MLP is refused by the method's check)
        h = self.run_blocks(h, c, rope=rope, grid=grid)
        h = self.decoder_in(h, c).to(self.residual_dtype(x_t))  # the decoder's residual stream in the encoder's dtype
        if keep is not None:
            full = self.mask_token.to(h.dtype).expand(h.shape[0], self.num_tokens, -1)
            h = full.scatter(1, keep.unsqueeze(-1).expand(-1, -1, h.shape[-1]), h)
        h = self.decoder_pos(h)
        c_dec = self.decoder_cond(c)
        if keep is None:  # the mask token stays in the graph with a zero gradient (DDP expects every parameter to
            c_dec = c_dec + 0 * self.mask_token[0].to(c_dec.dtype)  # get one; MaskDiT's code adds 0 * mask_token.sum())
        grid = TokenGrid(0, self.grid, self.grid)
        for block in self.decoder_blocks:
            h = block(h, c_dec, rope=None, grid=grid)
        out = self.final(h, c_dec)
        return dit.depatchify(out, s.patch_size, s.channels, s.image_size, s.image_size)

    def flops_per_sample(self, visible: int | None = None) -> int:
        """Forward FLOPs of one sample with `visible` tokens through the encoder (None = all), counted like DiT's."""
        s, N, D, Dd = self.spec, self.num_tokens, self.spec.dim, self.dec.dim
        K = N if visible is None else visible
        pd = s.patch_size ** 2 * s.channels
        f = 2 * N * pd * D + embed_flops(self.t_embed, D) + self.cond_embed.flops(D)   # patch embed on every patch
        f += s.depth * block_flops(s, K, K if visible is None else 0, ada=6) + self.skips.flops(lambda j: K)
        f += 2 * D * 2 * D + 2 * K * D * Dd + (2 * D * Dd if Dd != D else 0)        # decoder_in, decoder_cond
        f += self.dec.depth * block_flops(self.dec, N, N, ada=6)
        return f + 2 * Dd * 2 * Dd + 2 * N * Dd * pd                                  # final adaLN + projection


class MaskditKeys(cf.Keys, section="model"):
    decoder_depth: int = cf.F(2, "maskdit: DiT blocks of the decoder, which sees every position (MaskDiT: 8 after DiT-XL's 28)",
                              ge=1)
    decoder_dim: int = cf.F(0, "maskdit: decoder width (0 = model.dim; MaskDiT: 512 after DiT-XL's 1152)", ge=0)


def _check_maskdit(cfg, dim: int, heads: int, depth: int):
    keys = MaskditKeys.of(cfg.model)
    Dd = keys.decoder_dim or dim
    if Dd % heads or Dd % 4:
        raise GenlabError(f"model.decoder_dim ({Dd}) must be a multiple of model.heads ({heads}) and of 4 "
                          f"(the decoder's sin-cos positions)")


@model_registry.register("maskdit", "MaskDiT backbone: DiT encoder over the visible tokens, a small DiT decoder over all "
                                    "positions (mask token for the dropped ones); model.decoder_depth, model.decoder_dim",
                         keys=MaskditKeys, reads=dit.DitKeys.dotted(), check=_check_maskdit,
                         block_tokens=True, masked_tokens=True,
                         example=dataclasses.replace(dit.image_backbone_example({"decoder_dim": [16], "decoder_depth": [1]}),
                                                     idle_params=("mask_token",)),
                         **dit.IMAGE_BACKBONE)
def build_maskdit(cfg_model, data_spec) -> MaskDiT:
    keys = MaskditKeys.of(cfg_model)
    return MaskDiT(dit.spec_from_config(cfg_model, data_spec), keys.decoder_depth, keys.decoder_dim)
