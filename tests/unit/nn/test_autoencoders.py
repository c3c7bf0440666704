"""The autoencoder registry's contract (genlab/autoencoders): normalised latents z = (raw - shift) * scale,
decode inverts encode, one-line errors for bad specs. The lossless unshuffle codec is the exact reference."""
from __future__ import annotations

import pytest
import torch

from genlab.core.errors import GenlabError
from genlab.nn.autoencoders import LatentCodec, load_autoencoder


def test_unshuffle_round_trip_is_exact_and_matches_a_naive_fold():
    codec = load_autoencoder("unshuffle:2")
    x = torch.rand(2, 3, 8, 6, generator=torch.Generator().manual_seed(0)) * 2 - 1
    z = codec.encode(x)
    assert z.shape == (2, 12, 4, 3) and codec.latent_shape(3, 8, 6) == (12, 4, 3)
    naive = torch.stack([x[:, c, i::2, j::2] for c in range(3) for i in range(2) for j in range(2)], 1)
    assert torch.equal(z, naive)
    assert torch.equal(codec.decode(z), x)


class _Affine(LatentCodec):
    def encode_raw(self, x):
        return 3 * x + 1

    def decode_raw(self, z):
        return (z - 1) / 3


def test_scale_and_shift_follow_the_sd_convention():
    codec = _Affine("affine", channels=1, latent_channels=1, factor=1, scale=0.5, shift=0.25)
    x = torch.linspace(-1, 1, 9, dtype=torch.float64).view(1, 1, 3, 3)
    assert torch.allclose(codec.encode(x), ((3 * x + 1) - 0.25) * 0.5)
    assert torch.allclose(codec.decode(codec.encode(x)), x)


@pytest.mark.parametrize("spec, msg", [("nope", "valid choices"), ("unshuffle", "needs F"),
                                       ("unshuffle:x", "positive integer")])
def test_bad_specs_are_one_line_errors(spec, msg):
    with pytest.raises(GenlabError, match=msg):
        load_autoencoder(spec)


def test_a_size_the_factor_does_not_divide_is_refused():
    with pytest.raises(GenlabError, match="multiple"):
        load_autoencoder("unshuffle:4").latent_shape(1, 6, 8)
