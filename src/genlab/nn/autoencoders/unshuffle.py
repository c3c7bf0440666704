"""`unshuffle:F`: the lossless, weight-free 'autoencoder' that folds each F x F pixel patch into channels
(pixel_unshuffle). A reference point for latent runs (pixel-space diffusion with a patch-folded input) and the
exact-inverse codec the latent pipeline's tests check against."""
from __future__ import annotations

import torch.nn.functional as F

from genlab.core.errors import GenlabError
from genlab.nn.autoencoders import LatentCodec, autoencoder_registry


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
