"""A small masked autoencoder of the dataset's images (He et al. 2021, arXiv:2111.06377) for REPA to align to
(`method.repa_encoder=run:RUN`). The backbone is MaskDiT's, already MAE's asymmetric encoder-decoder, with t = 1 and
the null class held constant; the loss is MAE's norm-pix reconstruction of the masked patches:

    loss = mean over masked patches p of |decoder(x)_p - norm(x_p)|^2,   norm: per patch zero mean, unit variance
"""
from __future__ import annotations

import torch

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.base import Method, method_registry
from genlab.families.baselines import Baseline, mean_element_variance, training_images
from genlab.families.image_flow.dit import patchify
from genlab.families.image_flow.maskdit import draw_keep, kept_tokens, normalised_patches
from genlab.families.models import model_registry
from genlab.runtime.parallel import unwrap


class MaeKeys(cf.Keys, section="method"):
    mae_mask_ratio: float = cf.F(0.75, "mae_encoder: share of patch tokens the encoder does not see (MAE: 0.75)", gt=0, lt=1)


class MAEEncoder(Method):
    batch_keys = ("image",)
    data_kinds, model_families = ("image",), ("image",)

    @staticmethod
    def check_config(cfg):
        check_mae_config(cfg)

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


def check_mae_config(cfg):
    if not model_registry.spec(cfg.model.name).masked_tokens:
        fits = [n for n, s in model_registry.specs() if s.masked_tokens]
        raise GenlabError(f"method.name=mae_encoder runs its encoder on the visible tokens only; model "
                          f"{cfg.model.name} cannot: use model.name={'|'.join(fits)}")


method_registry.register("mae_encoder", "a masked autoencoder of the dataset's images (MaskDiT backbone at t=1, "
                                        "null class; norm-pix loss on the masked patches): an encoder for "
                                        "method.repa_encoder=run:RUN", keys=MaeKeys)(MAEEncoder)
