"""EDM preconditioning and noise schedule (families/world/objectives.py) against Karras et al. 2022, table 1."""
from __future__ import annotations

import math

import pytest
import torch

from genlab.families.world.objectives import karras_sigmas, preconditioning


@pytest.mark.parametrize("sigma_data", [0.5, 1.0])
def test_preconditioning_matches_the_closed_form_of_table_1(sigma_data):
    sigmas = [2e-3, 0.05, 0.5, 1.0, 5.0, 80.0]
    c_skip, c_out, c_in, c_noise = preconditioning(torch.tensor(sigmas, dtype=torch.float64), sigma_data)
    for i, s in enumerate(sigmas):
        norm = s * s + sigma_data * sigma_data
        assert c_skip[i].item() == pytest.approx(sigma_data ** 2 / norm, rel=1e-12)
        assert c_out[i].item() == pytest.approx(s * sigma_data / math.sqrt(norm), rel=1e-12)
        assert c_in[i].item() == pytest.approx(1 / math.sqrt(norm), rel=1e-12)
        assert c_noise[i].item() == pytest.approx(math.log(s) / 4, rel=1e-12)


def test_preconditioning_gives_unit_variance_input_and_target():
    """What table 1 is designed for: with data of std sigma_data, the network's input c_in·(y + σn) and its
    training target (y - c_skip·x) / c_out both have unit variance at every noise level."""
    sigma_data, g = 0.5, torch.Generator().manual_seed(0)
    y = sigma_data * torch.randn(200_000, generator=g, dtype=torch.float64)
    n = torch.randn(200_000, generator=g, dtype=torch.float64)
    for s in (0.01, 0.3, 2.0, 20.0):
        c_skip, c_out, c_in, _ = preconditioning(torch.tensor(s, dtype=torch.float64), sigma_data)
        x = y + s * n
        assert (c_in * x).std().item() == pytest.approx(1.0, abs=0.01)
        assert ((y - c_skip * x) / c_out).std().item() == pytest.approx(1.0, abs=0.01)


def test_denoiser_is_the_identity_at_zero_noise():
    c_skip, c_out, _, _ = preconditioning(torch.tensor([1e-8]), 0.5)
    assert c_skip.item() == pytest.approx(1.0) and c_out.item() == pytest.approx(0.0, abs=1e-7)


def test_karras_schedule_runs_from_sigma_max_to_sigma_min_then_zero():
    sig = karras_sigmas(5, 2e-3, 5.0, 7.0).double()
    assert sig.shape == (6,) and sig[-1] == 0
    assert sig[0].item() == pytest.approx(5.0, rel=1e-6) and sig[-2].item() == pytest.approx(2e-3, rel=1e-5)
    r = 1 / 7.0
    ref = [(5.0 ** r + i / 4 * (2e-3 ** r - 5.0 ** r)) ** 7.0 for i in range(5)]
    assert sig[:-1].tolist() == pytest.approx(ref, rel=1e-5)
    assert (sig[1:] < sig[:-1]).all()
    assert karras_sigmas(1, 2e-3, 5.0, 7.0).tolist() == pytest.approx([5.0, 0.0])  # one step: from sigma_max to 0
