"""REPA: representation alignment (Yu et al. 2024, docs/image_flow.md): the flow loss plus a projection of block k's
tokens aligned to a frozen encoder (repa_encoders.py). No host reads, so the step can be one CUDA graph.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.base import Extra, method_registry
from genlab.families.image_flow.dit import dit_size
from genlab.families.image_flow.flow import FLOW_KEYS, FlowMatching, check_flow_config, unwrap
from genlab.families.image_flow.repa_encoders import build_encoder, check_encoder
from genlab.families.models import model_registry


class Projector(nn.Module):
    """REPA's 3-layer MLP with SiLU, applied to every token."""

    def __init__(self, dim: int, hidden: int, out_dim: int, tokens: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, out_dim))
        self.tokens = tokens

    def forward(self, h):
        return self.net(h)

    def flops_per_sample(self) -> int:
        return 2 * self.tokens * sum(m.in_features * m.out_features for m in self.net if isinstance(m, nn.Linear))


class FeatureTap:
    """Forward hooks on a model's blocks (1-based): their output tokens, in block order, of gradient-enabled passes only."""

    def __init__(self, blocks: tuple[int, ...]):
        self.blocks, self.kept, self._hooked = blocks, [], None

    def _keep(self, module, args, out):
        if torch.is_grad_enabled():
            self.kept.append(out)

    def hook(self, model):
        """Hooks the blocks of `model` (once per model) and empties `kept`."""
        base = unwrap(model)
        if self._hooked is not base:
            # compiled code sees the hooks: genlab compiles with hook guards (switches.guard_module_hooks)
            for b in self.blocks:
                base.blocks[b - 1].register_forward_hook(self._keep)
            self._hooked = base
        self.kept.clear()

    def __call__(self, teacher, x, t, y) -> list[torch.Tensor]:
        self.hook(teacher)
        with torch.enable_grad():
            teacher(x, t, y)
        feats = list(self.kept)
        self.kept.clear()  # the same list object every step: compiled hooks guard on it
        return feats


def alignment_loss(projected: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """REPA's term 1 - mean cos(projected, target) over samples and patches (the paper's -cos shifted by 1)."""
    return 1 - F.cosine_similarity(projected.float(), target.float(), dim=-1).mean()


def aligned_block(cfg_block: int, depth: int) -> int:
    """method.repa_block, 0 = a third of the depth (the paper: block 8 of SiT-XL's 28, 4 of SiT-B's 12)."""
    return cfg_block or max(1, depth // 3)


class REPA(FlowMatching):
    data_kinds = ("image",)  # the encoder it aligns to reads pixels
    final_loss = graph_step = True
    flow_metric = "flow_loss"  # the loss adds the alignment term (a negative cosine): its baseline is flow's part's

    @staticmethod
    def check_config(cfg):
        keys = RepaKeys.of(cfg.method)
        check_flow_config(cfg)
        if not model_registry.spec(cfg.model.name).block_tokens:
            raise GenlabError(f"method.name=repa aligns the patch tokens a block outputs; model {cfg.model.name} has no such "
                              f"blocks: use a model whose blocks output them (genlab list: model.dit)")
        depth = dit_size(cfg.model)[1]
        if keys.repa_block > depth:
            raise GenlabError(f"method.repa_block must be in 1..{depth} (the model depth; 0 = a third), got {keys.repa_block}")
        check_encoder(cfg)

    def __init__(self, cfg, data_spec):
        super().__init__(cfg, data_spec)
        REPA.check_config(cfg)  # also for methods built outside the CLI (tests, the API)
        m = RepaKeys.of(cfg)
        dim, depth, _ = dit_size(cfg.model)
        grid = data_spec["image_size"] // cfg.model.patch_size
        self.block, self.weight, self.lr = aligned_block(m.repa_block, depth), m.repa_weight, m.repa_lr or None
        self.encoder = build_encoder(cfg, data_spec, grid)
        self.projector = Projector(dim, m.repa_hidden, self.encoder.out_dim, grid * grid)
        self.tap = FeatureTap((self.block,))

    def extra_modules(self):
        return {**super().extra_modules(), "projector": Extra(self.projector, trainable=True, lr=self.lr),
                "encoder": Extra(self.encoder, trainable=False)}

    def loss(self, model, batch, ctx):
        self.tap.hook(model)
        flow, metrics = super().loss(model, batch, ctx)
        h = self.tap.kept.pop()
        with torch.no_grad():
            target = ctx.extras["encoder"](batch["image"])
        align = alignment_loss(ctx.extras["projector"](h), target)
        return flow + self.weight * align, {**metrics, "flow_loss": flow.detach(), "repa_align": align.detach()}


class RepaKeys(cf.Keys, section="method"):
    repa_weight: float = cf.F(0.5, "repa: lambda of the alignment term 1 - cos(projector(h_k), encoder(x)) (paper: 0.5)", ge=0)
    repa_block: int = cf.F(0, "repa: DiT block (1-based) whose output tokens are aligned (0 = depth // 3; paper: 8 of 28)", ge=0)
    repa_encoder: str = cf.F("random", "repa: frozen encoder NAME[:ARG] of registry repa_encoder: random, classifier, "
                                       "run:RUN (e.g. a mae_encoder run), timm:MODEL (+ method.repa_encoder_path)",
                             free="NAME[:ARG] of registry repa_encoder (genlab list)")
    repa_encoder_path: str = cf.F("", "repa, timm encoder: its weights (.safetensors, or .pt/.pth/.bin loaded weights-only)",
                                  free="a weights file path")
    repa_encoder_size: int = cf.F(0, "repa, timm encoder: input side the images are resized to (0 = the model's pretrained_cfg)",
                                  ge=0)
    repa_encoder_mean: str = cf.F("", "repa, timm encoder: input normalisation mean, comma-separated (empty = pretrained_cfg)",
                                  free="comma-separated numbers")
    repa_encoder_std: str = cf.F("", "repa, timm encoder: input normalisation std, comma-separated (empty = pretrained_cfg)",
                                 free="comma-separated numbers")
    repa_hidden: int = cf.F(2048, "repa: width of the trainable 3-layer MLP projector (paper: 2048)", ge=1)
    repa_lr: float = cf.F(0.0, "repa: projector learning rate (0 = optim.lr)", ge=0)


method_registry.register("repa", "flow matching + REPA alignment of a DiT block to frozen encoder features "
                                 "(trainable projector, frozen encoder; method.repa_*)",
                         keys=RepaKeys, reads=cf.dotted_of(FLOW_KEYS))(REPA)
