"""MaskDiT (Zheng et al. 2023): flow matching on a random subset of the patch tokens, its MAE term and unmasked fine-tune;
and `mae_encoder`, the same backbone as a plain MAE for REPA to align to (docs/image_flow.md). The backbone: a DiT
encoder over the visible tokens `keep` [B, K], then a small DiT decoder over every position with a learned mask token at
the dropped ones; keep=None runs the whole grid (sampling, other methods).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.baselines import Baseline, mean_element_variance, training_images
from genlab.families.image_flow import dit
from genlab.families.image_flow.dit import patchify
from genlab.families.image_flow.flow import FLOW_KEYS, FlowMatching, check_flow_config
from genlab.families.models import model_registry
from genlab.nn.backbone import block_flops
from genlab.nn.conditions import combine
from genlab.nn.mlp import TokenGrid, mlp_registry
from genlab.nn.positions import build_position
from genlab.families.base import Method, method_registry
from genlab.runtime.parallel import unwrap


def kept_tokens(tokens: int, mask_ratio: float) -> int:
    """Tokens each sample keeps: MaskDiT's int(N * (1 - r)), at least one."""
    return int(tokens * (1 - mask_ratio))


def draw_keep(batch: int, tokens: int, keep: int, generator, device) -> torch.Tensor:
    """[B, keep] sorted indices of a uniform random subset per sample (MAE's argsort of noise: no host sync)."""
    noise = torch.rand(batch, tokens, generator=generator, device=device)
    return noise.argsort(dim=1)[:, :keep].sort(dim=1).values


def check_masked_tokens(cfg, method: str) -> None:
    """The backbone runs its encoder on the visible tokens alone (ModelSpec.masked_tokens)."""
    if not model_registry.spec(cfg.model.name).masked_tokens:
        fits = [n for n, s in model_registry.specs() if s.masked_tokens]
        raise GenlabError(f"method.name={method}; model {cfg.model.name} cannot: use model.name={'|'.join(fits)}")


def normalised_patches(x: torch.Tensor, p: int) -> torch.Tensor:
    """MAE's norm_pix target: each patch of x [B, C, H, W] -> [B, N, p*p*C] at zero mean, unit variance."""
    t = patchify(x, p).float()
    return (t - t.mean(-1, keepdim=True)) / (t.var(-1, keepdim=True) + 1e-6).sqrt()


class MaskDiTFlow(FlowMatching):
    flow_metric = "flow_loss"  # on random visible patches: flow's mean-predictor loss in expectation (trivial_baselines)

    @staticmethod
    def check_config(cfg):
        check_flow_config(cfg)
        check_masked_tokens(cfg, "maskdit drops tokens inside the backbone")
        pos = model_registry.spec(cfg.model.name).default_position if cfg.model.pos_emb == "auto" else cfg.model.pos_emb
        if pos.startswith("rope"):
            raise GenlabError(f"method.name=maskdit needs additive positions (model.pos_emb=sincos2d|learned); "
                              f"model.pos_emb={pos} rotates by position inside attention")
        if mlp_registry.spec(cfg.model.mlp).needs_grid:
            raise GenlabError(f"method.name=maskdit: model.mlp={cfg.model.mlp} convolves over the patch grid, which the "
                              f"visible tokens no longer form; use another model.mlp")
        m = cfg.method
        keys = MaskditMethodKeys.of(m)
        if m.timestep_sampler == "adaptive":
            raise GenlabError("method.name=maskdit does not run the adaptive sampler's probe; choose another "
                              "method.timestep_sampler")
        if keys.unmask_steps > cfg.train.steps:
            raise GenlabError(f"method.unmask_steps ({keys.unmask_steps}) must be at most train.steps ({cfg.train.steps})")
        if not 0 <= keys.mask_ratio < 1:  # also declared; a method built outside load_config checks it here
            raise GenlabError(f"method.mask_ratio must be in [0, 1), got {keys.mask_ratio}")

    def __init__(self, cfg, data_spec):
        super().__init__(cfg, data_spec)
        MaskDiTFlow.check_config(cfg)
        m = MaskditMethodKeys.of(cfg)
        self.patch = cfg.model.patch_size
        self.tokens = (data_spec["image_size"] // self.patch) ** 2
        self.keep = kept_tokens(self.tokens, m.mask_ratio)
        if self.keep < 1:
            raise GenlabError(f"method.mask_ratio={m.mask_ratio} keeps no token of {self.tokens}; "
                              f"use a ratio below {1 - 1 / self.tokens:.4g}")
        self.mae_weight, self.unmask_steps, self.norm_pix = m.mae_weight, m.unmask_steps, m.mae_norm_pix

    def masked_at(self, step: int, total_steps: int) -> bool:
        """True in the masked stage; the last unmask_steps steps (and mask_ratio 0, which keeps all) are unmasked."""
        return self.keep < self.tokens and step < total_steps - self.unmask_steps

    def train_flops_per_sample(self, model, total_steps: int) -> int:
        """The run's mean: forward + backward (3x) with K encoder tokens in the masked steps, N in the others."""
        masked = max(total_steps - self.unmask_steps, 0) if self.keep < self.tokens else 0
        mean = (masked * model.flops_per_sample(self.keep) + (total_steps - masked) * model.flops_per_sample())
        return 3 * mean // max(total_steps, 1)

    def loss(self, model, batch, ctx):
        if not self.masked_at(ctx.step, ctx.total_steps):
            flow, metrics = super().loss(model, batch, ctx)
            zero = flow.detach() * 0
            return flow, {**metrics, "flow_loss": flow.detach(), "mae_loss": zero, "visible": zero + 1}
        generator, data, y = ctx.generator, batch["image"], batch["label"]
        B = data.shape[0]
        t, noise, x_t, y = self.noised(model, data, y, generator, ctx.step)
        keep = draw_keep(B, self.tokens, self.keep, generator, data.device)
        v = model(x_t, t, y, keep=keep)
        flow, mae = self.masked_losses(v, data, noise, x_t, t, keep)
        total = flow + self.mae_weight * mae if self.mae_weight > 0 else flow
        return total, {"flow_loss": flow.detach(), "mae_loss": mae.detach(),
                       "visible": torch.full((), self.keep / self.tokens, device=flow.device)}  # a fill, no host copy

    def masked_losses(self, v, data, noise, x_t, t, keep):
        """(flow loss on the visible patches, MAE loss on the masked ones), per-sample means, then the batch mean."""
        p = self.patch
        err = (patchify(v.float(), p) - patchify((data - noise).float(), p)).square().mean(-1)  # [B, N]
        per_sample = err.gather(1, keep).mean(1)
        flow = per_sample.mean() if self.mcfg.loss_weighting == "none" else \
            (self.weight(t.float(), self.mcfg) * per_sample).mean()
        visible = torch.zeros_like(err, dtype=torch.bool).scatter_(1, keep, True)
        target = normalised_patches(x_t, p) if self.norm_pix else patchify(x_t.float(), p)
        rec = (patchify(v.float(), p) - target).square().mean(-1)
        mae = rec.masked_fill(visible, 0).sum(1).div(self.tokens - self.keep).mean()
        return flow, mae


class MaskditMethodKeys(cf.Keys, section="method"):
    mask_ratio: float = cf.F(0.5, "maskdit: share of each sample's patch tokens dropped in the masked stage (keeps "
                                  "int(N*(1-r)) tokens; MaskDiT: 0.5)", ge=0, lt=1)
    mae_weight: float = cf.F(0.1, "maskdit: weight of the MAE loss on the masked tokens (MaskDiT: 0.1; 0 = off)", ge=0)
    mae_norm_pix: bool = cf.F(True, "maskdit: MAE target = each masked patch of x_t normalised to zero mean, unit variance "
                                    "(MaskDiT's norm_pix_loss); false = the raw x_t patch")
    unmask_steps: int = cf.F(0, "maskdit: the last N steps train unmasked (all tokens, no MAE loss): MaskDiT's fine-tune",
                             ge=0)


method_registry.register("maskdit", "flow matching on a random share of the patch tokens (MaskDiT: encoder on the "
                                    "visible tokens, decoder on all, MAE loss on the masked; method.mask_ratio, "
                                    "mae_weight, unmask_steps)",
                         keys=MaskditMethodKeys, reads=cf.dotted_of(FLOW_KEYS))(MaskDiTFlow)


class MaeKeys(cf.Keys, section="method"):
    mae_mask_ratio: float = cf.F(0.75, "mae_encoder: share of patch tokens the encoder does not see (MAE: 0.75)", gt=0, lt=1)


class MAEEncoder(Method):
    batch_keys = ("image",)
    data_kinds, model_families = ("image",), ("image",)

    @staticmethod
    def check_config(cfg):
        check_masked_tokens(cfg, "mae_encoder runs its encoder on the visible tokens only")

    def __init__(self, cfg, data_spec):
        keys = MaeKeys.of(cfg.method)
        self.cfg, self.spec = cfg, data_spec
        self.patch = cfg.model.patch_size
        self.tokens = (data_spec["image_size"] // self.patch) ** 2
        self.keep = kept_tokens(self.tokens, keys.mae_mask_ratio)
        if self.keep < 1:
            raise GenlabError(f"method.mae_mask_ratio={keys.mae_mask_ratio} keeps no token of {self.tokens}")

    def loss(self, model, batch, ctx):
        x = batch["image"]
        B = x.shape[0]
        keep = draw_keep(B, self.tokens, self.keep, ctx.generator, x.device)
        t = torch.ones(B, device=x.device, dtype=x.dtype)
        y = torch.full((B,), unwrap(model).null_class, device=x.device, dtype=torch.long)
        pred = patchify(model(x, t, y, keep=keep), self.patch).float()
        masked = torch.ones(B, self.tokens, device=x.device).scatter(1, keep, 0.0)  # 1 on the tokens the encoder missed
        err = ((pred - normalised_patches(x, self.patch)) ** 2).mean(-1)
        loss = (err * masked).sum() / masked.sum()
        return loss, {"mae_loss": loss.detach()}

    def trivial_baselines(self, data, generator):
        # the masked tokens are uniform over positions, so the best constant is each position's mean normalised patch
        x = torch.from_numpy(training_images(data, generator, self.cfg.data.hflip)).float()
        patches = normalised_patches(x, self.patch).double()
        return [Baseline("loss", mean_element_variance(patches.numpy()), "MSE of the mean normalised patch")]

    def train_flops_per_sample(self, model, total_steps: int) -> int:
        return 3 * unwrap(model).flops_per_sample(self.keep)


method_registry.register("mae_encoder", "a masked autoencoder of the dataset's images (MaskDiT backbone at t=1, "
                                        "null class; norm-pix loss on the masked patches): an encoder for "
                                        "method.repa_encoder=run:RUN", keys=MaeKeys)(MAEEncoder)


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
        self.decoder_blocks = nn.ModuleList(dit.DiTBlock.of(self.dec, s.depth + j) for j in range(decoder_depth))
        self.final = dit.FinalLayer(Dd, s.patch_size ** 2 * s.channels, s.adaln, s.norm)
        self._init_weights()  # again: the decoder's linears as DiT's (xavier; adaLN and the output zero)
        nn.init.normal_(self.mask_token, std=0.02)  # as MAE and MaskDiT

    def forward(self, x_t: torch.Tensor, t: torch.Tensor, y: torch.Tensor, keep: torch.Tensor | None = None,
                **conditions) -> torch.Tensor:
        """keep: [B, K] long, the visible tokens of each sample (row-major patch indices); None = all tokens."""
        h, embs = self.embed(x_t, t, y, conditions)
        c = combine(embs)
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
        return self.image(self.final(h, c_dec))

    def flops_per_sample(self, visible: int | None = None) -> int:
        """Forward FLOPs of one sample with `visible` tokens through the encoder (None = all), counted like DiT's."""
        s, N, D, Dd = self.spec, self.num_tokens, self.spec.dim, self.dec.dim
        K = N if visible is None else visible
        pd = s.patch_size ** 2 * s.channels
        f = self.stem_flops()                                                          # patch embed on every patch
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
