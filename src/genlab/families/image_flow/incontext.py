"""In-context conditioning (DiT paper, Peebles & Xie 2023, sec. 3.2): the timestep and class embeddings are two
extra tokens in front of the patch tokens, treated like any other token and cut off before the output head.
No adaLN: the blocks are plain pre-LN (GPT-2, Xiong et al. 2020) or post-LN (Vaswani et al. 2017) blocks."""
from __future__ import annotations

import torch
import torch.nn as nn

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.models import model_registry
from genlab.nn.norm import norm_registry
from genlab.families.image_flow import dit
from genlab.nn.attention import Attention
from genlab.nn.backbone import LongSkips, block_flops, prefix_rope
from genlab.nn.mlp import TokenGrid, mlp_registry

PLACEMENTS = ("pre", "post")
COND_TOKENS = 2  # timestep, class


class PlainBlock(nn.Module):
    """pre: x + f(norm(x)) per sublayer; post: norm(x + f(x)). Norms with their own scale (and shift)."""

    def __init__(self, dim, heads, mlp_ratio=4.0, attention="sdpa", qk_norm=False, mlp="gelu", norm="layernorm",
                 placement="pre", layer=0, qkv_kernel="plain"):
        super().__init__()
        if placement not in PLACEMENTS:
            raise GenlabError(f"unknown model.ln_placement '{placement}'; valid choices: {', '.join(PLACEMENTS)}")
        self.post_ln = placement == "post"
        self.norm1 = norm_registry.get(norm)(dim, eps=1e-6)
        self.attn = Attention(dim, heads, backend=attention, qk_norm=qk_norm, layer=layer, qkv_kernel=qkv_kernel)
        self.norm2 = norm_registry.get(norm)(dim, eps=1e-6)
        self.mlp = mlp_registry.get(mlp)(dim, int(dim * mlp_ratio))

    def forward(self, x, rope=None, grid=None):
        if self.post_ln:
            x = self.norm1(x + self.attn(x, rope=rope))
            return self.norm2(x + self.mlp(x, grid=grid))
        x = x + self.attn(self.norm1(x), rope=rope)
        return x + self.mlp(self.norm2(x), grid=grid)


class InContextDiT(dit.ImageBackbone):
    def __init__(self, spec: dit.DiTSpec):
        super().__init__(spec)
        s, p = spec, spec.patch_size
        self.blocks = nn.ModuleList(PlainBlock(s.dim, s.heads, s.mlp_ratio, s.attention, s.qk_norm, s.mlp, s.norm,
                                               s.ln_placement, layer=i, qkv_kernel=s.qkv_kernel)
                                    for i in range(s.depth))
        self.skips = LongSkips(s.dim, s.depth, s.long_skips)
        # post-LN blocks end normalised; pre-LN needs the final norm (GPT-2)
        self.final_norm = nn.Identity() if s.ln_placement == "post" else norm_registry.get(s.norm)(s.dim, eps=1e-6)
        self.head = nn.Linear(s.dim, p * p * s.channels)
        self._init_weights()
        nn.init.zeros_(self.head.weight)  # zero velocity at init, as DiT's zero-initialised final layer

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, y: torch.Tensor, **conditions) -> torch.Tensor:
        h, embs = self.embed(x_t, t, y, conditions)
        cond = torch.stack(embs, dim=1).to(h.dtype)  # one token per condition
        k = cond.shape[1]
        h = torch.cat([cond, h], dim=1)
        rope, grid = prefix_rope(self.pos.rope(), k), TokenGrid(k, self.grid, self.grid)
        h = self.run_blocks(h, rope=rope, grid=grid)
        return self.image(self.head(self.final_norm(h[:, k:])))

    def flops_per_sample(self) -> int:
        """Forward FLOPs as torch.utils.flop_counter counts them (see DiT.flops_per_sample): N + 2 tokens per block."""
        s, N, D = self.spec, self.num_tokens, self.spec.dim
        n = N + COND_TOKENS + len(s.conditions)
        f = self.stem_flops() + s.depth * block_flops(s, n, N, ada=0) + self.skips.flops(lambda j: n)
        return f + 2 * N * D * s.patch_size ** 2 * s.channels


class IncontextKeys(cf.Keys, section="model"):
    ln_placement: str = cf.F("pre", "dit_incontext: pre-LN (x + f(norm(x))) or post-LN (norm(x + f(x))) blocks", choices=("pre", "post"))


@model_registry.register("dit_incontext", "DiT with in-context conditioning: timestep and class as two extra tokens, "
                                          "no adaLN; pre-LN or post-LN blocks (model.ln_placement)",
                         keys=IncontextKeys, reads=tuple(k for k in dit.DitKeys.dotted() if k != "model.adaln"),
                         example=dit.image_backbone_example({"ln_placement": ["post"]}), **dit.IMAGE_BACKBONE)
def build_incontext(cfg_model, data_spec) -> InContextDiT:
    return InContextDiT(dit.spec_from_config(cfg_model, data_spec, ln_placement=IncontextKeys.of(cfg_model).ln_placement))
