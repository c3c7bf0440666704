"""Trivial baselines: the loss (or metric) a predictor that ignores its input reaches on a run's own data, which the
stall watcher (training/stall.py) compares the logged values with. Pure functions of arrays, in float64.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

MAX_TOKENS = 1 << 24      # tokens counted for the entropies: all of them up to this, else evenly spaced chunks
TOKEN_CHUNK = 1 << 16
MAX_IMAGES = 4096         # images the per-pixel statistics are counted over (a random subset beyond)


@dataclass(frozen=True)
class Baseline:
    metric: str                     # a logged value: "loss" (the training loss of the log line), a loss metric or an eval key
    value: float                    # in that metric's units
    what: str                       # a few words: "unigram entropy of the training tokens"
    higher_is_better: bool = False  # PSNR, accuracy
    scale: float | None = None      # the stall margin is relative to this (None: |value|); 1 makes it absolute (accuracy)


def entropy_nats(counts: np.ndarray) -> float:
    """Plug-in entropy (nats) of a histogram."""
    c = np.asarray(counts, dtype=np.float64)
    p = c[c > 0] / c.sum()
    return float(-(p * np.log(p)).sum())


def unigram_entropy(tokens) -> float:
    """Entropy (nats/token) of the token frequencies (all of them, or evenly spaced chunks of a large corpus): the loss
    of a predictor that sees no context."""
    if len(tokens) > MAX_TOKENS:
        starts = np.linspace(0, len(tokens) - TOKEN_CHUNK, MAX_TOKENS // TOKEN_CHUNK).astype(np.int64)
        tokens = np.concatenate([np.asarray(tokens[s:s + TOKEN_CHUNK]) for s in starts])
    return entropy_nats(np.bincount(np.asarray(tokens).astype(np.int64)))


def position_byte_entropy(images_u8) -> float:
    """Mean over positions of each position's byte entropy (nats): a byte model that knows only where it is."""
    x = np.asarray(images_u8).reshape(len(images_u8), -1)
    return float(np.mean([entropy_nats(np.bincount(x[:, j], minlength=256)) for j in range(x.shape[1])]))


def mean_element_variance(x, weight=None) -> float:
    """Mean over elements of each element's variance across samples [N, ...]: the MSE of predicting the mean. With
    weights shaped like x: the weighted MSE of the best constant, each element's weighted mean."""
    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    if weight is None:
        return float(x.var(0).mean())
    w = np.asarray(weight, dtype=np.float64).reshape(x.shape)
    mean = (w * x).sum(0) / np.maximum(w.sum(0), 1e-12)
    return float((w * (x - mean) ** 2).sum() / w.sum())


def mean_image_l1(x) -> float:
    """Mean absolute error of predicting every sample [N, ...] by the per-element mean sample."""
    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    return float(np.abs(x - x.mean(0)).mean())


def subset_index(n: int, generator: torch.Generator | None = None) -> np.ndarray:
    """Sorted indices of up to MAX_IMAGES of n samples (all of them when n is smaller)."""
    if n <= MAX_IMAGES:
        return np.arange(n)
    return torch.randperm(n, generator=generator)[:MAX_IMAGES].sort().values.numpy()


def training_images(data, generator: torch.Generator | None = None, hflip: bool = False) -> np.ndarray:
    """float64 [n, C, H, W]: up to MAX_IMAGES samples in the units the loader yields, mirrored too under data.hflip."""
    idx = subset_index(len(data), generator)
    if getattr(data, "latents", None) is not None:  # [N, variants, c, h, w]: variant 0, or all of them under hflip
        lat = np.asarray(data.latents[idx], dtype=np.float64)
        return (lat if hflip else lat[:, :1]).reshape(-1, *lat.shape[2:])
    if getattr(data, "samples", None) is not None:  # teacher pairs: the samples are the loader's "image"
        return np.asarray(data.samples[idx], dtype=np.float64)
    x = np.asarray(data.images[idx], dtype=np.float64).transpose(0, 3, 1, 2) / 127.5 - 1  # as data/pixels.py loads them
    return np.concatenate([x, x[..., ::-1]]) if hflip else x
