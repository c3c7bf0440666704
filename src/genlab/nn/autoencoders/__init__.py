"""Image autoencoders for latent diffusion, chosen by a string NAME[:ARG] (registry `autoencoder`): each builds a
`LatentCodec` whose `encode` maps images in [-1, 1] to normalised latents z = (raw - shift) * scale and `decode`
inverts it (docs/latents.md). `unshuffle:F` (here) is the lossless, weight-free codec: the tests' exact reference.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.core.errors import GenlabError
from genlab.core.registry import Registry, Spec, spec_with_arg


@dataclass(frozen=True, kw_only=True)
class AutoencoderSpec(Spec):
    """An image autoencoder for latent diffusion, chosen by a string NAME[:ARG] (`genlab data encode --vae`,
    data.vae): builder(arg, device) -> genlab.nn.autoencoders.LatentCodec."""
    check: Callable | None = None          # check(arg): one-line GenlabError before any work (missing files...)
    arg: str = ""                          # what ARG names ("" = takes none)


autoencoder_registry = Registry("autoencoder", AutoencoderSpec)


class LatentCodec(nn.Module):
    """Frozen encoder/decoder pair with its normalisation. Subclasses implement encode_raw/decode_raw."""

    def __init__(self, spec: str, channels: int, latent_channels: int, factor: int, scale: float = 1.0,
                 shift: float = 0.0):
        super().__init__()
        self.spec, self.channels, self.latent_channels, self.factor = spec, channels, latent_channels, factor
        self.scale, self.shift = float(scale), float(shift)

    def encode_raw(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def decode_raw(self, z: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Images in [-1, 1] -> normalised latents (raw - shift) * scale."""
        return (self.encode_raw(x) - self.shift) * self.scale

    @torch.no_grad()
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Normalised latents -> images in [-1, 1] (clamped)."""
        return self.decode_raw(z / self.scale + self.shift).clamp(-1, 1)

    def latent_shape(self, c: int, h: int, w: int) -> tuple[int, int, int]:
        if c != self.channels:
            raise GenlabError(f"autoencoder '{self.spec}' takes {self.channels}-channel images, got {c}")
        if h % self.factor or w % self.factor:
            raise GenlabError(f"autoencoder '{self.spec}' downsamples by {self.factor}: image size {h}x{w} "
                              f"is not a multiple of it")
        return self.latent_channels, h // self.factor, w // self.factor

    def describe(self) -> dict:
        """What a latent dataset records: enough to rebuild this codec (load_autoencoder(d['spec']))."""
        return {"spec": self.spec, "channels": self.channels, "latent_channels": self.latent_channels,
                "factor": self.factor, "scale": self.scale, "shift": self.shift}


def check_autoencoder(value: str) -> tuple[str, AutoencoderSpec]:
    """(ARG, spec) of 'NAME[:ARG]'; a one-line GenlabError, before any work, for an unknown name or a missing file."""
    _, arg, spec = spec_with_arg(autoencoder_registry, value, "autoencoder")
    if spec.check is not None:
        spec.check(arg)
    return arg, spec


def load_autoencoder(value: str, device="cpu") -> LatentCodec:
    """Build the frozen codec named by `value` (eval mode, no grads) on `device`."""
    arg, spec = check_autoencoder(value)
    return spec.builder(arg, device).to(device).eval().requires_grad_(False)


class Unshuffle(LatentCodec):
    def encode_raw(self, x):
        return F.pixel_unshuffle(x, self.factor)

    def decode_raw(self, z):
        return F.pixel_shuffle(z, self.factor)

    def latent_shape(self, c, h, w):  # any channel count folds (channels = 0 in its description)
        _, h2, w2 = LatentCodec.latent_shape(self, self.channels, h, w)
        return c * self.factor ** 2, h2, w2


def _factor(arg: str) -> int:
    if not arg.isdigit() or int(arg) < 1:
        raise GenlabError(f"autoencoder unshuffle:F needs a positive integer factor F, got '{arg}'")
    return int(arg)


@autoencoder_registry.register("unshuffle", "fold F x F pixel patches into channels (lossless, no weights)",
                               arg="F", check=_factor)
def build_unshuffle(arg, device):
    f = _factor(arg)
    return Unshuffle(f"unshuffle:{f}", channels=0, latent_channels=0, factor=f)


# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan)
from genlab.nn.autoencoders import diffusers_vae  # noqa: F401,E402
