"""A convolutional image autoencoder in the style of the Stable Diffusion VAE (LDM's `AutoencoderKL`; docs/latents.md):
bottleneck `kl` (a diagonal Gaussian) or `plain`. SD's VAE is model.size=sd with model.channel_mult=1,2,4,4.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.data.datasets import dataset_registry
from genlab.families.models import ModelExample, model_registry

LOGVAR_RANGE = (-30.0, 20.0)  # LDM's clamp of the posterior log-variance


class AeKeys(cf.Keys, section="model"):
    channel_mult: tuple[float, ...] = cf.F((1.0, 2.0, 2.0), "autoencoder_kl: width multiple of each resolution level (of model.dim); the "
                                                            "image side shrinks by 2^(levels - 1)", ge=1)
    latent_channels: int = cf.F(4, "autoencoder_kl: channels of the latent (SD: 4)", ge=1)
    bottleneck: str = cf.F("kl", "autoencoder_kl: kl = diagonal-Gaussian posterior (+ KL term), plain = deterministic latent",
                           choices=("kl", "plain"))


# model.size -> (base width model.dim, ResNet blocks per level model.depth, heads of the mid attention)
AE_SIZES = {"tiny": (32, 1, 1), "small": (64, 2, 1), "sd": (128, 2, 1)}


def groups(ch: int) -> int:
    """GroupNorm groups: SD's 32 where the width allows, else the largest common divisor."""
    return math.gcd(32, ch)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(groups(cin), cin, eps=1e-6), nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2, self.conv2 = nn.GroupNorm(groups(cout), cout, eps=1e-6), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


class AttnBlock(nn.Module):
    """SD's mid-block self-attention over the H*W positions (one or more heads), residual."""

    def __init__(self, ch: int, heads: int):
        super().__init__()
        if ch % heads:
            raise GenlabError(f"model.heads ({heads}) must divide the autoencoder's mid width ({ch})")
        self.heads = heads
        self.norm = nn.GroupNorm(groups(ch), ch, eps=1e-6)
        self.qkv, self.proj = nn.Conv2d(ch, 3 * ch, 1), nn.Conv2d(ch, ch, 1)

    def forward(self, x):
        B, C, H, W = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(B, 3, self.heads, C // self.heads, H * W).transpose(-1, -2).unbind(1)
        h = F.scaled_dot_product_attention(q, k, v)  # [B, heads, HW, C/heads]
        return x + self.proj(h.transpose(-1, -2).reshape(B, C, H, W))


class Resample(nn.Module):
    """SD's stride-2 conv down (after an asymmetric pad: side n -> n / 2 for even n), or nearest 2x up, then a conv."""

    def __init__(self, ch: int, down: bool):
        super().__init__()
        self.down = down
        self.conv = nn.Conv2d(ch, ch, 3, stride=2) if down else nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)) if self.down else F.interpolate(x, scale_factor=2.0, mode="nearest"))


def mid_block(ch: int, heads: int) -> nn.Sequential:
    return nn.Sequential(ResnetBlock(ch, ch), AttnBlock(ch, heads), ResnetBlock(ch, ch))


def out_head(ch: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.GroupNorm(groups(ch), ch, eps=1e-6), nn.SiLU(), nn.Conv2d(ch, cout, 3, padding=1))


def resnet_stages(cin: int, widths: list[int], depth: int, down: bool) -> tuple[nn.Sequential, int]:
    """(`depth` ResnetBlocks per width with a Resample between, as one Sequential: keys down.N / up.N; its width)."""
    layers = []
    for i, w in enumerate(widths):
        for _ in range(depth):
            layers.append(ResnetBlock(cin, w))
            cin = w
        if i < len(widths) - 1:
            layers.append(Resample(w, down))
    return nn.Sequential(*layers), cin


class Encoder(nn.Module):
    def __init__(self, channels, dim, mult, depth, heads, out_ch):
        super().__init__()
        widths = [dim * m for m in mult]
        self.conv_in = nn.Conv2d(channels, dim, 3, padding=1)
        self.down, cin = resnet_stages(dim, widths, depth, down=True)
        self.mid = mid_block(cin, heads)
        self.out = out_head(cin, out_ch)

    def forward(self, x):
        return self.out(self.mid(self.down(self.conv_in(x))))


class Decoder(nn.Module):
    def __init__(self, channels, dim, mult, depth, heads, latent_channels):
        super().__init__()
        widths = [dim * m for m in mult][::-1]
        self.conv_in = nn.Conv2d(latent_channels, widths[0], 3, padding=1)
        self.mid = mid_block(widths[0], heads)
        self.up, cin = resnet_stages(widths[0], widths, depth + 1, down=False)
        self.out = out_head(cin, channels)

    def forward(self, z):
        return self.out(self.up(self.mid(self.conv_in(z))))


class AutoencoderKL(nn.Module):
    """images [B, C, H, W] in [-1, 1] <-> raw latents [B, latent_channels, H/f, W/f]."""

    def __init__(self, channels: int, image_size: int, dim: int, mult: tuple[int, ...], depth: int, heads: int,
                 latent_channels: int, bottleneck: str):
        super().__init__()
        self.channels, self.image_size, self.latent_channels = channels, image_size, latent_channels
        self.mult, self.dim, self.depth, self.heads = tuple(mult), dim, depth, heads
        self.factor = 2 ** (len(mult) - 1)
        self.kl = bottleneck == "kl"
        moments = 2 * latent_channels if self.kl else latent_channels
        self.encoder = Encoder(channels, dim, mult, depth, heads, moments)
        self.quant_conv = nn.Conv2d(moments, moments, 1)
        self.post_quant_conv = nn.Conv2d(latent_channels, latent_channels, 1)
        self.decoder = Decoder(channels, dim, mult, depth, heads, latent_channels)
        self._flops = None

    def posterior(self, x):
        """(mean, log-variance) of q(z|x); the log-variance is None for the plain bottleneck."""
        h = self.quant_conv(self.encoder(x))
        if not self.kl:
            return h, None
        mean, logvar = h.chunk(2, dim=1)
        return mean, logvar.clamp(*LOGVAR_RANGE)

    def encode(self, x):
        """The posterior mean: deterministic latents for diffusion."""
        return self.posterior(x)[0]

    def decode(self, z):
        return self.decoder(self.post_quant_conv(z))

    def latent_shape(self, c: int, h: int, w: int) -> tuple[int, int, int]:
        return self.latent_channels, h // self.factor, w // self.factor

    def forward(self, x, noise=None, return_posterior: bool = False):
        """Reconstruction of x from mean + std * noise (noise given) or the mean; return_posterior: with mean, logvar."""
        mean, logvar = self.posterior(x)
        z = mean if noise is None or logvar is None else mean + torch.exp(0.5 * logvar) * noise.to(mean.dtype)
        rec = self.decode(z)
        return (rec, mean, logvar) if return_posterior else rec

    def flops_per_sample(self) -> int:
        """Forward FLOPs (encode + decode) of one image, counted by torch.utils.flop_counter on a meta-device copy."""
        if self._flops is None:
            from torch.utils.flop_counter import FlopCounterMode
            with torch.device("meta"):
                twin = AutoencoderKL(self.channels, self.image_size, self.dim, self.mult, self.depth, self.heads,
                                     self.latent_channels, "kl" if self.kl else "plain")
                x = torch.zeros(1, self.channels, self.image_size, self.image_size)
            with torch.no_grad(), FlopCounterMode(display=False) as fc:
                twin(x)
            self._flops = int(fc.get_total_flops())
        return self._flops


def channel_mult(cfg_model) -> tuple[int, ...]:
    keys = AeKeys.of(cfg_model)
    mult = tuple(keys.channel_mult)
    if not mult or any(m != int(m) for m in mult):
        raise GenlabError(f"model.channel_mult must be whole numbers >= 1 (e.g. 1,2,2), got {mult}")
    return tuple(int(m) for m in mult)


def check_image_size(side: int, mult) -> None:
    f = 2 ** (len(mult) - 1)
    if side % f:
        raise GenlabError(f"model.channel_mult has {len(mult)} levels (downsampling by {f}); the image size {side} is "
                          f"not a multiple of {f}: use fewer levels (e.g. model.channel_mult={','.join(['1'] + ['2'] * (len(mult) - 2))})")


def check_autoencoder_model(cfg, dim, heads, depth):
    """Before any work: whole-number multiples, and a data image size the downsampling divides."""
    mult = channel_mult(cfg.model)
    if (dim * mult[-1]) % heads:
        raise GenlabError(f"model.heads ({heads}) must divide the autoencoder's mid width ({dim * mult[-1]})")
    shape_of = dataset_registry.spec(cfg.data.name).shape
    shape = shape_of(cfg.data) if shape_of is not None else None
    if shape and shape.get("image_size"):
        check_image_size(shape["image_size"], mult)


AE_EXAMPLE = ModelExample(
    spec={"kind": "image", "image_size": 8, "channels": 3, "num_classes": 5},
    inputs=lambda spec, B, g: (torch.randn(B, spec["channels"], spec["image_size"], spec["image_size"], generator=g),),
    output_shape=lambda spec, B: (B, spec["channels"], spec["image_size"], spec["image_size"]),
    option_cases={"bottleneck": ["plain"], "channel_mult": [(1.0, 2.0)]})


@model_registry.register("autoencoder_kl", "SD-VAE-style conv autoencoder (ResNet blocks, GroupNorm, SiLU, mid "
                                           "attention), kl or plain bottleneck, factor 2^(levels-1): "
                                           "method.name=autoencoder", keys=AeKeys, family="autoencoder",
                         sizes=AE_SIZES, example=AE_EXAMPLE, check=check_autoencoder_model)
def build_autoencoder_kl(cfg_model, data_spec) -> AutoencoderKL:
    keys = AeKeys.of(cfg_model)
    mult = channel_mult(cfg_model)
    check_image_size(data_spec["image_size"], mult)
    dim, depth, heads = AE_SIZES.get(cfg_model.size, AE_SIZES["tiny"])
    dim, depth, heads = cfg_model.dim or dim, cfg_model.depth or depth, cfg_model.heads or heads
    return AutoencoderKL(data_spec["channels"], data_spec["image_size"], dim, mult, depth, heads,
                         keys.latent_channels, keys.bottleneck)
