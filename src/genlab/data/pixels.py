"""The one mapping between stored pixels and model inputs: uint8 0..255 <-> float [-1, 1], x = u8 / 127.5 - 1.
Stored images and frames are channels-last [..., H, W, C]; models see channels-first [..., C, H, W]."""
from __future__ import annotations

import torch


def to_model(u8: torch.Tensor) -> torch.Tensor:
    """uint8 [..., H, W, C] -> float [..., C, H, W] in [-1, 1] (on u8's device)."""
    return u8.movedim(-1, -3).float().div_(127.5).sub_(1.0)


def to_pixels(x: torch.Tensor) -> torch.Tensor:
    """float [..., C, H, W] (clamped to [-1, 1]) -> uint8 [..., H, W, C], rounded to the nearest level."""
    return quantize_levels(x.detach()).to(torch.uint8).movedim(-3, -1)


def quantize_levels(x: torch.Tensor) -> torch.Tensor:
    """float in [-1, 1] (clamped) -> its uint8 level 0..255, still float and in x's layout."""
    return ((x.float().clamp(-1, 1) + 1) * 127.5).round()


def quantize(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the 256 levels that stored pixels can take, in [-1, 1], x's layout and dtype."""
    return (quantize_levels(x) / 127.5 - 1).to(x.dtype)
