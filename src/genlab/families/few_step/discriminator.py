"""A discriminator on the frozen teacher's token features at re-noised inputs, for LADD and PCM (docs/few_step.md); its
guard counters (adv_nonfinite, adv_collapsed) are buffers of the heads, so they survive resume.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.base import Extra
from genlab.families.image_flow.dit import dit_size
from genlab.families.image_flow.repa import FeatureTap
from genlab.families.models import model_registry
from genlab.families.world.objectives import finite_or_zero
from genlab.nn.embeddings import TimestepEmbedder
from genlab.runtime.parallel import unwrap

COLLAPSE_RATIO = 0.5  # a student batch with under half the real batch's spread counts as a collapsed step
T_FREQ = 64  # sinusoidal features of the re-noising time in each head's condition


class DiscKeys(cf.Keys, section="method"):
    tdisc_blocks: str = cf.F("", "pcm, ladd: teacher blocks (1-based, comma-separated) whose output tokens feed a "
                                "discriminator head (empty = 4 spread over the depth, the last included)",
                            free="comma-separated block numbers in 1..depth, or empty")
    tdisc_hidden: int = cf.F(128, "pcm, ladd: width of each discriminator head", ge=1)
    tdisc_lr: float = cf.F(0.0, "pcm, ladd: learning rate of the discriminator heads' own optimizer (0 = optim.lr)", ge=0)
    tdisc_betas: tuple[float, ...] = cf.F((0.0, 0.99), "pcm, ladd: Adam betas of the discriminator heads' own optimizer (GAN practice: "
                                                       "beta1 = 0, so the critic follows the moving student without momentum)", ge=0, lt=1)
    tdisc_t_mean: float = cf.F(-1.0, "pcm, ladd: re-noising time t' = t_end - w (1 - s), s = sigmoid(N(mean, std)) (w: 1 for "
                                    "ladd, one phase for pcm); < 0 shifts it toward noise (LADD: m=1, s=1 with t=1 noise)",
                              ge=-10, le=10)
    tdisc_t_std: float = cf.F(1.0, "pcm, ladd: standard deviation of logit(s) of the re-noising time", gt=0)


def parse_blocks(text: str, depth: int) -> tuple[int, ...]:
    """method.tdisc_blocks as sorted unique 1-based block numbers; empty = 4 spread over the depth, the last included."""
    if not str(text).strip():
        n = min(4, depth)
        return tuple(sorted({round(depth * (i + 1) / n) for i in range(n)}))
    try:
        blocks = sorted({int(b) for b in str(text).split(",")})
    except ValueError:
        raise GenlabError(f"method.tdisc_blocks must be comma-separated block numbers (e.g. 3,6,9,12), got {text!r}") from None
    if blocks[0] < 1 or blocks[-1] > depth:
        raise GenlabError(f"method.tdisc_blocks must be in 1..{depth} (the teacher's depth), got {text!r}")
    return tuple(blocks)


def check_disc_config(cfg) -> None:
    """Before any work: the backbone's blocks output tokens, and method.tdisc_blocks parses."""
    keys = DiscKeys.of(cfg.method)
    if not model_registry.spec(cfg.model.name).block_tokens:
        raise GenlabError(f"method {cfg.method.name}'s discriminator reads the tokens a block outputs; model "
                          f"{cfg.model.name} has no such blocks (genlab list: model.dit)")
    parse_blocks(keys.tdisc_blocks, dit_size(cfg.model)[1])
    if len(keys.tdisc_betas) != 2:
        raise GenlabError(f"method.tdisc_betas must hold two numbers, got {list(keys.tdisc_betas)}")


class TokenHead(nn.Module):
    """Tokens [B, N, D] of one teacher block -> a logit per token [B, N], projection-conditioned on class and t'."""

    def __init__(self, dim: int, hidden: int, num_classes: int):
        super().__init__()
        sn = nn.utils.parametrizations.spectral_norm
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)  # the residual stream's scale varies by block
        self.inp = sn(nn.Linear(dim, hidden))
        self.conv = sn(nn.Conv1d(hidden, hidden, 3, padding=1))
        self.out = sn(nn.Linear(hidden, 1))
        self.embed = nn.Embedding(num_classes, hidden)
        self.t_embed = TimestepEmbedder(hidden, freq_dim=T_FREQ)
        self.scale = 1 / math.sqrt(hidden)

    def forward(self, h, y, t):
        h = F.leaky_relu(self.inp(self.norm(h)), 0.2)
        h = h + F.leaky_relu(self.conv(h.transpose(1, 2)).transpose(1, 2), 0.2)
        c = self.embed(y) + self.t_embed(t.float())
        return self.out(h).squeeze(-1) + self.scale * (h * c[:, None]).sum(-1)


class TeacherHeads(nn.Module):
    """One TokenHead per tapped teacher block; logits [B, heads, N] in fp32. Also holds the run's guard counters."""

    def __init__(self, dim: int, hidden: int, num_classes: int, blocks: tuple[int, ...], tokens: int):
        super().__init__()
        self.blocks, self.tokens, self.dim, self.hidden = tuple(blocks), tokens, dim, hidden
        self.heads = nn.ModuleList(TokenHead(dim, hidden, num_classes) for _ in blocks)
        self.register_buffer("nonfinite", torch.zeros((), dtype=torch.long))
        self.register_buffer("collapsed", torch.zeros((), dtype=torch.long))

    def forward(self, feats, y, t):
        with torch.autocast(y.device.type, enabled=False):  # logits in fp32
            return torch.stack([head(f.float(), y, t) for head, f in zip(self.heads, feats)], 1)

    def flops_per_sample(self) -> int:
        D, H, N = self.dim, self.hidden, self.tokens
        return len(self.heads) * (2 * N * (D * H + 3 * H * H + 2 * H) + 2 * (T_FREQ * H + H * H))


def renoise_time(t_end: torch.Tensor, width, generator, mcfg) -> torch.Tensor:
    """t' = t_end - width (1 - s), s = sigmoid(N(tdisc_t_mean, tdisc_t_std)): within `width` below t_end, toward noise."""
    keys = DiscKeys.of(mcfg)
    s = torch.sigmoid(keys.tdisc_t_mean + keys.tdisc_t_std * torch.randn(t_end.shape, generator=generator,
                                                                       device=t_end.device))
    return t_end - width * (1 - s)


def renoise(x: torch.Tensor, t_end: torch.Tensor, t_new: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The flow path's transition from t_end to t_new <= t_end, (t_new/t_end) x + s noise: a sample of the path's
    marginal at t_end lands on its marginal at t_new (t_end = 1: t' x + (1-t') noise)."""
    shape = (-1, *([1] * (x.ndim - 1)))
    a = (t_new / t_end).view(shape)
    s = ((1 - t_new) ** 2 - (t_new * (1 - t_end) / t_end) ** 2).clamp_min(0).sqrt().view(shape)
    return a.to(x.dtype) * x + s.to(x.dtype) * noise


def hinge_losses(fake_logits: torch.Tensor, real_logits: torch.Tensor):
    """(G term, D loss) of the hinge GAN over every logit."""
    d = F.relu(1 - real_logits).mean() + F.relu(1 + fake_logits).mean()
    return -fake_logits.mean(), d


def batch_spread(x: torch.Tensor) -> torch.Tensor:
    return x.detach().float().flatten(1).std(0).mean()


class Adversary:
    """The method's side of the game: one teacher pass over [fake; real] at t', the heads, hinge losses, guards."""

    def __init__(self, blocks: tuple[int, ...]):
        self.tap = FeatureTap(blocks)

    def __call__(self, teacher, heads, fake_t, real_t, t, y, fake_clean, real_clean):
        """fake_t / real_t: the re-noised samples at t' = t [B]; fake_clean / real_clean: before re-noising (signals).
        Returns (G term for the model's loss, D loss for the heads' optimizer, metrics)."""
        yy = torch.cat([y, y])
        tt = torch.cat([t, t])
        logits = heads(self.tap(teacher, torch.cat([fake_t, real_t.to(fake_t.dtype)]), tt, yy), yy, tt)
        fake, real = logits.chunk(2)
        g, d = hinge_losses(fake, real)
        bad = ~(torch.isfinite(g) & torch.isfinite(d))
        ratio = batch_spread(fake_clean) / batch_spread(real_clean).clamp_min(1e-8)
        base = unwrap(heads)
        base.nonfinite += bad.long()
        base.collapsed += (ratio < COLLAPSE_RATIO).long()
        fs, rs = fake.detach().flatten(1).mean(1), real.detach().flatten(1).mean(1)
        metrics = {"adv_g": g.detach(), "adv_d": d.detach(), "disc_acc_real": (rs > 0).float().mean(),
                   "disc_acc_fake": (fs < 0).float().mean(), "diversity_ratio": ratio,
                   "adv_nonfinite": base.nonfinite.clone(), "adv_collapsed": base.collapsed.clone()}
        return finite_or_zero(g), finite_or_zero(d), metrics


def add_discriminator(extras: dict, mcfg, num_classes: int) -> Adversary:
    """Heads on the teacher's features as the trainable extra "disc" (own optimizer); returns the Adversary."""
    keys, base = DiscKeys.of(mcfg), unwrap(extras["teacher"].module)
    heads = TeacherHeads(base.spec.dim, keys.tdisc_hidden, num_classes, parse_blocks(keys.tdisc_blocks, len(base.blocks)),
                         base.num_tokens)
    extras["disc"] = Extra(heads, trainable=True, optimizer="disc", lr=keys.tdisc_lr or None, betas=tuple(keys.tdisc_betas))
    return Adversary(heads.blocks)
