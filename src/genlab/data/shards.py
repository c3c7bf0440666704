"""Sharded image format and its dataset (data.name=shards) for image sets too large for one array: plain .npy
shards, labels.npy and index.json, memory-mapped (docs/data.md: the layout, and why not webdataset & co.).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from genlab.core.errors import GenlabError
from genlab.data.datasets import ImageKeys, PathKeys, dataset_registry
from genlab.data.formats import ImageData, array_checksum, verifying
from genlab.data.loader import ImageLoader

FORMAT = "genlab-shards-v1"


def shard_name(i: int) -> str:
    return f"images-{i:05d}.npy"


class ShardedArray:
    """A read-only uint8 [N, H, W, C] spread over memory-mapped shards; indexing gathers shard by shard."""

    ndim = 4

    def __init__(self, arrays: list):
        self.arrays = arrays
        self.offsets = np.cumsum([0] + [len(a) for a in arrays])
        self.shape = (int(self.offsets[-1]),) + tuple(arrays[0].shape[1:])
        self.dtype = arrays[0].dtype
        self.nbytes = int(sum(a.nbytes for a in arrays))

    def __len__(self):
        return self.shape[0]

    def _gather(self, idx: np.ndarray) -> np.ndarray:
        n = len(self)
        idx = np.where(idx < 0, idx + n, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise IndexError(f"index out of range for {n} samples")
        out = np.empty((len(idx),) + self.shape[1:], dtype=self.dtype)
        order = np.argsort(idx, kind="stable")  # read in file order, shard by shard
        sidx = idx[order]
        shard = np.searchsorted(self.offsets, sidx, side="right") - 1
        for part in np.split(np.arange(len(sidx)), np.flatnonzero(np.diff(shard)) + 1):
            if part.size:
                s = shard[part[0]]
                out[order[part]] = self.arrays[s][sidx[part] - self.offsets[s]]
        return out

    def __getitem__(self, key):
        if isinstance(key, tuple):  # images[i, y, x, c]: samples first, then the rest on the gathered block
            head = self[key[0]]
            return head[key[1:]] if np.ndim(key[0]) == 0 and not isinstance(key[0], slice) else head[(slice(None),) + key[1:]]
        if isinstance(key, (int, np.integer)):
            return self._gather(np.array([int(key)]))[0]
        if isinstance(key, slice):
            return self._gather(np.arange(*key.indices(len(self))))
        idx = np.asarray(key)
        return self._gather(np.flatnonzero(idx) if idx.dtype == bool else idx.astype(np.int64))

    def __array__(self, dtype=None, copy=None):  # np.asarray: the whole set, only where code asks for it
        a = self[:]
        return a if dtype is None else a.astype(dtype)


@dataclass
class ShardData(ImageData):
    """ImageData whose images are a ShardedArray; its loader streams from the shards and never makes the set resident."""

    def make_loader(self, cfg_data, batch_size, device, seed, rank=0, world=1):
        # worker threads gather each batch from the memory maps ahead of use (data.prefetch batches)
        return ImageLoader(self, batch_size, device, seed=seed, rank=rank, world=world, on_device="no",
                           prefetch=cfg_data.prefetch, pin_memory=cfg_data.pin_memory, hflip=cfg_data.hflip)


def write_index(folder: Path, shards: list[dict], labels: np.ndarray, classes: list, shape, shard_size: int,
                source: str, extra: dict | None = None):
    labels = np.asarray(labels, dtype=np.int64)
    if sum(s["count"] for s in shards) != len(labels):
        raise ValueError("shard counts and labels differ in length")
    np.save(folder / "labels.npy", labels)
    index = {"format": FORMAT, "source": source, "num_samples": int(len(labels)), "shape": [int(x) for x in shape],
             "shard_size": int(shard_size), "classes": list(classes), "shards": shards,
             "labels_sha256": array_checksum(labels), **(extra or {})}
    # one digest of the whole set (caches keyed by a dataset's sha256, e.g. the eval classifier)
    index["sha256"] = hashlib.sha256("".join([s["sha256"] for s in shards] + [index["labels_sha256"]]).encode()).hexdigest()
    (folder / "index.json").write_text(json.dumps(index, indent=1))


def save_shard(path: Path, images: np.ndarray) -> dict:
    np.save(path, images)
    return {"file": Path(path).name, "count": int(len(images)), "sha256": array_checksum(images)}


def _index(p: Path) -> dict:
    if not (p / "index.json").exists():
        raise GenlabError(f"no shard dataset at '{p}' (index.json missing); create one with `genlab data prepare shards`")
    try:
        index = json.loads((p / "index.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise GenlabError(f"shard dataset at '{p}' is corrupt: {e}") from None
    if index.get("format") != FORMAT:
        raise GenlabError(f"'{p}/index.json' is not a {FORMAT} index (format {index.get('format')!r})")
    return index


def read_shards(path, verify: bool | None = None) -> ShardData:
    p = Path(path)
    index = _index(p)
    shape = tuple(index["shape"])
    try:
        arrays = [np.load(p / s["file"], mmap_mode="r", allow_pickle=False) for s in index["shards"]]
        labels = np.load(p / "labels.npy", mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, KeyError) as e:
        raise GenlabError(f"shard dataset at '{p}' is corrupt: {e}") from None
    for s, a in zip(index["shards"], arrays):
        if a.dtype != np.uint8 or a.shape != (s["count"],) + shape:
            raise GenlabError(f"shard dataset at '{p}' is corrupt: {s['file']} is {a.dtype}{a.shape}, index.json "
                              f"says uint8{(s['count'],) + shape}")
    if not arrays or len(labels) != index["num_samples"] or sum(len(a) for a in arrays) != len(labels):
        raise GenlabError(f"shard dataset at '{p}' is corrupt: labels and shards do not match index.json")
    images = ShardedArray(arrays)
    if verifying(verify, images):
        bad = [s["file"] for s, a in zip(index["shards"], arrays) if array_checksum(a) != s["sha256"]]
        if bad or array_checksum(np.asarray(labels)) != index["labels_sha256"]:
            raise GenlabError(f"shard dataset at '{p}' is corrupt: checksum mismatch in {', '.join(bad) or 'labels.npy'}")
    return ShardData(images=images, labels=labels, classes=index.get("classes", []), meta=index)


def shard_shape(path) -> dict | None:
    """The data shape from index.json alone (None when missing: the reader reports that)."""
    try:
        index = _index(Path(path))
        h, w, c = index["shape"]
        return {"kind": "image", "image_size": int(h), "channels": int(c), "num_classes": len(index["classes"])}
    except Exception:  # noqa: BLE001
        return None


def _check(d):
    if d.on_device == "yes":
        raise GenlabError("data.name=shards streams from its shards and is never resident on the device; use "
                          "data.on_device=auto|no (or data.name=images for a set that fits on the device)")


@dataset_registry.register("shards", "image shards written by `genlab data prepare shards` (data.path); streamed from "
                           "memory maps, never resident", kind="image", keys=(PathKeys, ImageKeys), needs_path=True,
                           shape=lambda d: shard_shape(d.path), check=_check)
def shards(cfg_data):
    return read_shards(cfg_data.path)
