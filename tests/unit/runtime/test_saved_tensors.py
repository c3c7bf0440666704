"""The activation-memory measurement behind the FP8-activation figure (issue 33, genlab/runtime/saved_tensors.py),
against a model whose saved tensors are counted by hand."""
from __future__ import annotations

import torch
import torch.nn as nn

from genlab.runtime.saved_tensors import at_batch, fit_per_sample, measure_saved

A, H, C = 8, 16, 16  # in, hidden, out


class _Net(nn.Module):
    """Linear -> GELU -> Linear, plus sin(h) beside GELU(h): h is saved by two ops but stored once."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(A, H), nn.Linear(H, C)

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(nn.functional.gelu(h)) + h.sin()


def _step(net, batch, dtype=None):
    x = torch.randn(batch, A)

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            y = net(x)
        y.float().square().mean().backward()
    return run


def test_saved_bytes_match_the_hand_count_in_fp32():
    """fc1 saves x (B x A), GELU and sin both save h (B x H, one storage), fc2 saves gelu(h) (B x H), square saves y
    (B x C); fc2 saves its weight too (for gelu(h)'s gradient), a parameter reported apart; fc1 does not (x needs no
    gradient: autograd saves only what backward will use). float32: 4 bytes each."""
    torch.manual_seed(0)
    net, B = _Net(), 5
    s = measure_saved(_step(net, B), params=net.parameters())
    assert s.bytes_by_dtype == {"float32": 4 * B * (A + H + H + C)}
    assert s.param_bytes == 4 * H * C
    # FP8: one byte per element plus a 4-byte scale per group of 128 (ceil over each dtype's element count)
    n = B * (A + H + H + C)
    assert s.fp8_bytes() == n + 4 * -(-n // 128)
    assert s.total - s.fp8_bytes(group=n) == 3 * n - 4


def test_bf16_autocast_saves_bf16_activations_and_weight_copies():
    """Under bf16 autocast the linears save bf16 copies of x and gelu(h), and fc2 autocast's bf16 copy of its weight
    (not the parameter); h leaves fc1 in bf16, GELU and sin save that storage once; y = bf16 + float32 sin is float32,
    saved by square."""
    torch.manual_seed(0)
    net, B = _Net(), 6
    s = measure_saved(_step(net, B, torch.bfloat16), params=net.parameters())
    assert s.param_bytes == 0
    got = dict(s.bytes_by_dtype)
    assert got.pop("bfloat16") == 2 * (B * (A + H + H) + H * C)
    assert got == {"float32": 4 * B * C}


def test_fit_per_sample_separates_batch_sized_from_fixed_tensors():
    torch.manual_seed(0)
    net = _Net()
    s2, s7 = (measure_saved(_step(net, b, torch.bfloat16), params=net.parameters()) for b in (2, 7))
    fit = fit_per_sample((2, 7), (s2, s7))
    assert fit["per_sample"] == 2 * (A + H + H) + 4 * C
    assert fit["fixed"] == 2 * H * C  # the weight copy
    total, _ = at_batch(fit, 256)
    assert total == measure_saved(_step(net, 256, torch.bfloat16), params=net.parameters()).total
