"""The real images that generated samples are compared with, and the real-vs-real floor (docs/evaluation.md).
Held-out: eval.val_path's images (the dataset's test split), else a fixed half of the training images (seed 0). The
train subset, n training images disjoint from it, gives the floor: FD(train subset, held-out) at that sample count."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from genlab.core.errors import GenlabError
from genlab.data.formats import read_image_dataset


@dataclass
class RealSplit:
    held_out: np.ndarray         # uint8 [R, H, W, C]: the reference set of every distance
    held_out_labels: np.ndarray  # int64 [R]
    train: np.ndarray            # uint8 [min(n, pool), H, W, C]: training images disjoint from held_out
    source: str                  # what 'held-out' is for this dataset


def _take(images, idx):
    return np.ascontiguousarray(np.asarray(images[np.sort(idx)]))


def real_split(data, val_path: str, n: int, ref_samples: int, seed: int = 0) -> RealSplit:
    rng = np.random.default_rng(seed)
    if val_path:
        val = read_image_dataset(val_path)
        if val.images.shape[1:] != data.images.shape[1:]:
            raise GenlabError(f"eval.val_path images are {list(val.images.shape[1:])}, the training images "
                              f"{list(data.images.shape[1:])}")
        ref = np.sort(rng.permutation(len(val))[:ref_samples])
        train = rng.permutation(len(data))[:n]
        return RealSplit(_take(val.images, ref), np.asarray(val.labels)[ref], _take(data.images, train),
                         f"eval.val_path ({len(ref)} of {len(val)} held-out images)")
    if len(data) < 4:
        raise GenlabError(f"the dataset has {len(data)} images; the real-vs-real floor needs at least 4")
    perm = rng.permutation(len(data))
    half = len(data) // 2
    ref = np.sort(perm[:half][:ref_samples])
    return RealSplit(_take(data.images, ref), np.asarray(data.labels)[ref], _take(data.images, perm[half:][:n]),
                     f"a fixed half of the training images ({len(ref)} of {half}; no eval.val_path)")
