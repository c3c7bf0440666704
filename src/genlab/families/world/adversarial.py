"""The adversarial term of the world method (method.adv_weight > 0): a patch discriminator on (frame, last context
frame) and the non-saturating GAN losses (softplus), added to whichever objective trains the denoiser."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class PatchDiscriminator(nn.Module):
    """Small PatchGAN (Isola et al. 2017) on (frame, last context frame); spectral norm keeps it Lipschitz,
    which is what stops the NaN blow-ups of an unconstrained discriminator."""

    def __init__(self, channels: int, width: int = 32):
        super().__init__()
        sn = nn.utils.parametrizations.spectral_norm
        self.net = nn.Sequential(
            sn(nn.Conv2d(2 * channels, width, 4, 2, 1)), nn.LeakyReLU(0.2),
            sn(nn.Conv2d(width, 2 * width, 4, 2, 1)), nn.LeakyReLU(0.2),
            sn(nn.Conv2d(2 * width, 1, 3, 1, 1)))

    def forward(self, frame, last_context):
        with torch.autocast(frame.device.type, enabled=False):  # logits in fp32
            return self.net(torch.cat([frame, last_context], 1).float())


def finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    """A non-finite loss term becomes 0 (no host sync); the counter metric says how often it happened."""
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


def adversarial_losses(disc: nn.Module, est: torch.Tensor, target: torch.Tensor, last: torch.Tensor):
    """(generator term, discriminator loss, metrics) for the estimated and the real frame, both conditioned on the
    clean last context frame. The discriminator loss is for the trainer to apply to the discriminator only."""
    # one discriminator forward for both losses: spectral norm updates its power-iteration vector in place
    # on every training forward, which would invalidate the graph of an earlier call
    fake, real = disc(torch.cat([est, target]), torch.cat([last, last])).chunk(2)
    adv = finite_or_zero(F.softplus(-fake).mean())
    d_loss = F.softplus(-real).mean() + F.softplus(fake).mean()
    metrics = {"adv": adv.detach(), "disc_loss": d_loss.detach(), "disc_nonfinite": (~torch.isfinite(d_loss)).float()}
    return adv, finite_or_zero(d_loss), metrics
