"""DiT: a diffusion transformer over image patches (Peebles & Xie 2023), and the stem, blocks and spec the other image
backbones share: (noisy image, t, class) -> an image-shaped output whose meaning the method gives.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.models import ModelExample, model_registry, model_size
from genlab.nn.attention import Attention
from genlab.nn.backbone import LongSkips, block_flops
from genlab.nn.conditions import ConditionSet, combine
from genlab.nn.embeddings import TimestepEmbedder, embed_flops
from genlab.nn.fused_final import final_kernel_registry
from genlab.nn.mlp import TokenGrid, mlp_registry
from genlab.nn.norm import norm_modulate_by, residual_ops_by, residual_registry
from genlab.nn.positions import build_position
from genlab.families.base import method_registry

# name -> (dim, depth, heads); S/B/L/XL as in the DiT paper, tiny/small extras for CPU work.
DIT_SIZES = {
    "tiny": (128, 4, 4),
    "small": (256, 6, 4),
    "S": (384, 12, 6),
    "B": (768, 12, 12),
    "L": (1024, 24, 16),
    "XL": (1152, 28, 16),
}


@dataclass
class DiTSpec:
    image_size: int
    channels: int
    num_classes: int
    dim: int
    depth: int
    heads: int
    patch_size: int = 2
    mlp_ratio: float = 4.0
    attention: str = "sdpa"
    qk_norm: bool = False
    adaln: str = "fused"
    qkv_kernel: str = "plain"     # registry `qkv_kernel`: the QKV split into heads (+ QK norm, RoPE)
    residual: str = "fp32"
    mlp: str = "gelu"             # registry `mlp`
    norm: str = "layernorm"       # registry `norm`: layernorm runs through `adaln`; others normalise, then modulate
    pos_emb: str = "sincos2d"     # registry `position` (2-D entries)
    long_skips: bool = False      # U-ViT long skips (nn/backbone.py)
    ln_placement: str = "pre"     # dit_incontext: pre-LN or post-LN blocks
    dual_blocks: int = 0          # mmdit: first k blocks dual-stream (0 = all)
    context_dim: int = 0          # mmdit: > 0 = a sequence of condition embeddings of this width (text-like)
    conditions: tuple = ()        # extra named conditions (name, embedder) a method adds (nn/conditions.py)
    final_kernel: str = "plain"   # dit: registry `final_kernel`, the final layer + flow loss (nn/fused_final.py)


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    """[B, C, H, W] -> [B, (H/p)*(W/p), p*p*C], patches in row-major order."""
    B, C, H, W = x.shape
    x = x.reshape(B, C, H // p, p, W // p, p)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(B, (H // p) * (W // p), p * p * C)


def depatchify(x: torch.Tensor, p: int, C: int, H: int, W: int) -> torch.Tensor:
    """Inverse of patchify."""
    B = x.shape[0]
    x = x.reshape(B, H // p, W // p, p, p, C)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(B, C, H, W)


class DiTBlock(nn.Module):
    """Pre-norm transformer block with adaLN-Zero conditioning (identity at init); its `pre` and `post` halves are
    one stream of an MMDiT joint block (mmdit.py), pre_only=True SD3's last context block."""

    eps = 1e-6

    def __init__(self, dim, heads, mlp_ratio=4.0, attention="sdpa", qk_norm=False, adaln="fused", mlp="gelu",
                 norm="layernorm", layer=0, kernel=True, pre_only=False, grid=True, qkv_kernel="plain"):
        super().__init__()
        self.pre_only = pre_only
        self.attn = Attention(dim, heads, backend=attention, qk_norm=qk_norm, layer=layer, kernel=kernel,
                              qkv_kernel=qkv_kernel)
        if pre_only:  # only its keys and values are read (its queries, like its outputs, would be discarded)
            self.attn.proj, self.attn.q_norm = nn.Identity(), nn.Identity()
        else:
            entry = mlp_registry.get(mlp)
            self.mlp = entry(dim, int(dim * mlp_ratio), **({} if grid or not mlp_registry.spec(mlp).needs_grid
                                                           else {"grid": False}))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(dim, (2 if pre_only else 6) * dim))
        self.norm_modulate = norm_modulate_by(norm, adaln, dim, self.eps)
        self.add_norm_modulate, self.gated_add = residual_ops_by(norm, adaln, self.norm_modulate)
        nn.init.zeros_(self.ada[1].weight)
        nn.init.zeros_(self.ada[1].bias)

    @classmethod
    def of(cls, s, layer: int, **options):
        """A block of an image backbone's spec `s` at depth index `layer`."""
        return cls(s.dim, s.heads, s.mlp_ratio, s.attention, s.qk_norm, s.adaln, s.mlp, s.norm, layer=layer,
                   qkv_kernel=s.qkv_kernel, **options)

    def modulated(self, x, c):
        """The attention input (LayerNorm + the first shift/scale) and the block's modulation chunks."""
        mod = self.ada(c).chunk(2 if self.pre_only else 6, dim=-1)
        return self.norm_modulate(x, mod[0], mod[1], self.eps), mod

    def pre(self, x, c, rope=None):
        h, mod = self.modulated(x, c)
        return self.attn.heads_qkv(h, rope), mod

    def post(self, x, o, mod, grid=None):
        _, _, g1, sh2, sc2, g2 = mod
        x, h = self.add_norm_modulate(x, self.attn.out(o), g1, sh2, sc2, self.eps)
        return self.gated_add(x, self.mlp(h, grid=grid), g2)

    def forward(self, x, c, rope=None, grid=None):
        h, mod = self.modulated(x, c)  # then attend_tokens: the entry's packed path where it has one
        return self.post(x, self.attn.attend_tokens(h, rope=rope), mod, grid)


class FinalLayer(nn.Module):
    eps = 1e-6

    def __init__(self, dim, out_dim, adaln="fused", norm="layernorm"):
        super().__init__()
        self.norm_modulate = norm_modulate_by(norm, adaln, dim, self.eps)
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.linear = nn.Linear(dim, out_dim)
        for m in (self.ada[1], self.linear):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, x, c):
        shift, scale = self.ada(c).chunk(2, dim=-1)
        return self.linear(self.norm_modulate(x, shift, scale, self.eps))


class ImageBackbone(nn.Module):
    """What every image backbone shares: the input side (the same state-dict keys in each), its conditions, the
    block stack with its long skips, the weight init and the output's image layout."""

    def __init__(self, s: DiTSpec):
        super().__init__()
        p = s.patch_size
        if s.image_size % p:
            raise ValueError(f"image size {s.image_size} not divisible by patch size {p}")
        self.spec = s
        self.residual_dtype = residual_registry.get(s.residual)
        self.grid = s.image_size // p
        self.num_tokens = self.grid ** 2
        self.null_class = s.num_classes  # the extra embedding row used for unconditional (CFG) passes
        self.patch_embed = nn.Linear(p * p * s.channels, s.dim)
        self.pos = build_position(s.pos_emb, s.dim, s.heads, (self.grid, self.grid), "dit")
        self.t_embed = TimestepEmbedder(s.dim)
        self.y_embed = nn.Embedding(s.num_classes + 1, s.dim)
        self.cond_embed = ConditionSet(s.dim, s.conditions)

    def embed(self, x_t, t, y, extra: dict) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(patch tokens with positions in the residual dtype, [B, D] embeddings of time, class and every extra
        condition), the same way in every image backbone."""
        h = self.pos(self.patch_embed(patchify(x_t, self.spec.patch_size)).to(self.residual_dtype(x_t)))
        return h, [self.t_embed(t), self.y_embed(y), *self.cond_embed(t.shape[0], **extra)]

    def image(self, out: torch.Tensor) -> torch.Tensor:
        s = self.spec
        return depatchify(out, s.patch_size, s.channels, s.image_size, s.image_size)

    def stem_flops(self) -> int:
        """Forward FLOPs of the patch embedding and the condition MLPs."""
        s, D = self.spec, self.spec.dim
        return 2 * self.num_tokens * s.patch_size ** 2 * s.channels * D + embed_flops(self.t_embed, D) + self.cond_embed.flops(D)

    def _init_weights(self):
        for name, m in self.named_modules():
            if isinstance(m, nn.Linear) and not name.endswith(("ada.1", "final.linear")):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        nn.init.normal_(self.y_embed.weight, std=0.02)
        for m in self.t_embed.mlp:
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
        self.skips.reset_parameters()

    def run_blocks(self, h, *c, rope=None, grid=None):
        """The block stack with its long skips (MaskDiT: on the visible tokens; the in-context DiT: without `c`)."""
        saved = {}
        for i, block in enumerate(self.blocks):
            if i in self.skips.source:
                h = self.skips.merge(i, h, saved.pop(self.skips.source[i]))
            h = block(h, *c, rope=rope, grid=grid)
            if i in self.skips.sources:
                saved[i] = h
        return h


class DiT(ImageBackbone):
    def __init__(self, spec: DiTSpec):
        super().__init__(spec)
        s, p = spec, spec.patch_size
        self.blocks = nn.ModuleList(DiTBlock.of(s, i) for i in range(s.depth))
        self.skips = LongSkips(s.dim, s.depth, s.long_skips)
        self.final = FinalLayer(s.dim, p * p * s.channels, s.adaln, s.norm)
        self._init_weights()

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, y: torch.Tensor, loss_target: torch.Tensor | None = None,
                loss_weight: torch.Tensor | None = None, **conditions) -> torch.Tensor:
        """x_t: [B, C, H, W] noisy input; t: [B] in [0, 1]; y: [B] class ids (null_class = unconditional). With
        loss_target: the weighted flow loss through the `final_kernel` entry instead (nn/fused_final.py)."""
        s = self.spec
        h, embs = self.embed(x_t, t, y, conditions)
        c = combine(embs)
        h = self.run_blocks(h, c, rope=self.pos.rope(), grid=TokenGrid(0, self.grid, self.grid))
        if loss_target is not None:  # the target goes to the patch layout (no gradient), not the output to the image's
            return final_kernel_registry.get(s.final_kernel)(self.final, h, c, patchify(loss_target, s.patch_size),
                                                             loss_weight)
        return self.image(self.final(h, c))

    def flops_per_sample(self) -> int:
        """Forward FLOPs (2 per multiply-add) of one sample, as torch.utils.flop_counter counts (attention_flops)."""
        s, N, D = self.spec, self.num_tokens, self.spec.dim
        f = self.stem_flops() + s.depth * block_flops(s, N, N, ada=6)
        f += self.skips.flops(lambda j: N)
        return f + 2 * D * 2 * D + 2 * N * D * s.patch_size ** 2 * s.channels  # final adaLN + projection


def dit_size(cfg_model) -> tuple[int, int, int]:
    return model_size(cfg_model, DIT_SIZES, "DiT")


def spec_from_config(cfg_model, data_spec, **extra) -> DiTSpec:
    """The image-backbone spec of a model config (shared by every image backbone)."""
    dim, depth, heads = dit_size(cfg_model)
    k = DitKeys.of(cfg_model)
    return DiTSpec(image_size=data_spec["image_size"], channels=data_spec["channels"],
                   num_classes=data_spec["num_classes"], dim=dim, depth=depth, heads=heads,
                   patch_size=k.patch_size, mlp_ratio=cfg_model.mlp_ratio,
                   attention=cfg_model.attention, qk_norm=k.qk_norm, qkv_kernel=k.qkv_kernel,
                   adaln=k.adaln, residual=k.residual, mlp=k.mlp, norm=k.norm,
                   pos_emb="sincos2d" if k.pos_emb == "auto" else k.pos_emb, long_skips=k.long_skips,
                   conditions=tuple(data_spec.get("conditions", {}).items()), **extra)


# model.* keys of the DiT family (dit, dit_incontext and mmdit read them through spec_from_config)
class DitKeys(cf.Keys, section="model"):
    patch_size: int = cf.F(2, "dit: patch side in pixels; must divide the image size", ge=1)
    qk_norm: bool = cf.F(False, "dit: normalise queries and keys per head")
    qkv_kernel: str = cf.F("plain", "image backbones, gpt: the QKV split into heads with QK norm and RoPE (triton: one CUDA "
                                    "kernel, plain on CPU)", registry="qkv_kernel")
    adaln: str = cf.F("fused", "dit, mmdit: LayerNorm + adaLN modulation implementation", registry="adaln")
    residual: str = cf.F("fp32", "dit: dtype of the residual stream under autocast", registry="residual")
    pos_emb: str = cf.F("auto", "position encoding (auto: dit sincos2d, gpt learned; 2-D entries for dit, 1-D for gpt)", free="auto or a registry `position` entry that fits the model")
    norm: str = cf.F("layernorm", "normalisation layer (dit: layernorm runs through model.adaln)", registry="norm")
    mlp: str = cf.F("gelu", "MLP kind", registry="mlp")
    long_skips: bool = cf.F(False, "image backbones: U-ViT long skips, block depth-1-i input = Linear([x, output of block i])")


# model.* keys of the plain DiT alone (its subclasses and siblings keep calling the model for the output)
class DitFinalKeys(cf.Keys, section="model"):
    final_kernel: str = cf.F("plain", "dit, methods flow|repa: final layer + flow loss (triton: projection + squared error in "
                                      "one CUDA kernel, the velocity never materialised; plain on CPU)", registry="final_kernel")


def check_final_kernel(cfg) -> None:
    """A fused final layer + loss needs a method whose loss runs through it (Method.final_loss)."""
    kernel, method = DitFinalKeys.of(cfg.model).final_kernel, cfg.method.name
    if kernel != "plain" and not method_registry.get(method).final_loss:
        ok = [n for n, m in method_registry.items() if m.final_loss]
        raise GenlabError(f"model.final_kernel={kernel} fuses the final layer into the flow loss, which method.name="
                          f"{method} does not train with; use model.final_kernel=plain (or method.name={'|'.join(ok)})")


def image_backbone_example(options=None) -> ModelExample:
    """The contract test's instance of an image backbone: a tiny data spec, inputs, output shape, extra options."""
    return ModelExample(
        spec={"kind": "image", "image_size": 8, "channels": 3, "num_classes": 5},
        inputs=lambda spec, B, g: (torch.randn(B, spec["channels"], spec["image_size"], spec["image_size"], generator=g),
                                   torch.rand(B, generator=g), torch.randint(0, spec["num_classes"] + 1, (B,), generator=g)),
        output_shape=lambda spec, B: (B, spec["channels"], spec["image_size"], spec["image_size"]),
        option_cases={"long_skips": [True], "qk_norm": [True], **(options or {})})


# what an image backbone declares: the family flow/repa drive, sizes, a 2-D token grid, the layer keys it builds
IMAGE_BACKBONE = dict(family="image", sizes=DIT_SIZES, grid_rank=2, layer_keys=("attention", "mlp", "norm", "pos_emb"),
                      default_position="sincos2d")


@model_registry.register("dit", "DiT with adaLN-Zero, sizes tiny/small/S/B/L/XL, class-conditional with a null class",
                         keys=(DitKeys, DitFinalKeys), block_tokens=True, example=image_backbone_example(),
                         check=lambda cfg, dim, heads, depth: check_final_kernel(cfg), **IMAGE_BACKBONE)
def build_dit(cfg_model, data_spec) -> DiT:
    return DiT(spec_from_config(cfg_model, data_spec, final_kernel=DitFinalKeys.of(cfg_model).final_kernel))
