"""Latent datasets (data.name=latents, a folder written by `genlab data encode`): image methods train on latents as
images; the spec carries the codec and pixel shape, evaluation compares with the source pixels (docs/latents.md).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from genlab.core.errors import GenlabError
from genlab.data.datasets import ImageKeys, PathKeys, dataset_registry
from genlab.data.encode import FORMAT, read_source
from genlab.data.formats import VERIFY_LIMIT_BYTES, array_checksum
from genlab.data.loader import IndexStream, StreamPosition, gather


@dataclass
class LatentData:
    latents: np.ndarray           # float16|float32 [N, V, c, h, w], a memmap
    labels: np.ndarray            # int64 [N]
    classes: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @property
    def variants(self) -> int:
        return self.latents.shape[1]

    @property
    def spec(self) -> dict:
        N, _, c, h, _ = self.latents.shape
        return {"kind": "image", "image_size": h, "channels": c, "num_classes": len(self.classes), "num_samples": N,
                "classes": list(self.classes), "batch_keys": ("image", "label"), "codec": dict(self.meta["codec"]),
                "pixel_shape": list(self.meta["pixel_shape"])}

    def __len__(self):
        return len(self.latents)

    def make_loader(self, cfg_data, batch_size, device, seed, rank=0, world=1):
        return LatentLoader(self, batch_size, device, seed, rank, world, cfg_data.on_device, cfg_data.pin_memory,
                            cfg_data.hflip)

    def pixel_reference(self):
        """The source image set these latents were encoded from (meta.json source): what evaluation compares decoded
        samples with. A one-line GenlabError when it is gone or changed."""
        if getattr(self, "_reference", None) is None:  # read once per process (each evaluation asks)
            self._reference = read_reference(self.meta)
        return self._reference


def read_reference(meta: dict):
    src = meta.get("source") or {}
    where = src.get("path", "?")
    try:
        data = read_source(where)
    except GenlabError as e:
        raise GenlabError(f"the source images of these latents ({where}), which evaluation compares decoded samples "
                          f"with, cannot be read: {e}") from None
    if src.get("sha256") and data.meta.get("sha256") != src["sha256"]:
        raise GenlabError(f"the source images at {where} changed since they were encoded (sha256 differs from the "
                          f"latents' meta.json); re-encode them with `genlab data encode`")
    return data


class VariantStream(IndexStream):
    """The seeded sample order of IndexStream, as flat indices into latents viewed as [N * stride, c, h, w]: each
    draw's variant is drawn per epoch from (seed, epoch) beside the permutation, among the first `choices` variants."""

    def __init__(self, n: int, seed: int, stride: int, choices: int):
        super().__init__(n, seed)
        self.stride, self.choices = stride, choices
        self._vepoch, self._var = -1, None

    def _variants_for(self, epoch):
        if epoch != self._vepoch:
            self._vepoch = epoch
            self._var = np.random.default_rng([self.seed, epoch, 1]).integers(0, self.choices, self.n)
        return self._var

    def take(self, k: int) -> np.ndarray:
        pos0 = self.pos
        idx = super().take(k) * self.stride
        if self.choices > 1:
            epoch, off = np.divmod(np.arange(pos0, pos0 + k), self.n)
            for e in np.unique(epoch):
                m = epoch == e
                idx[m] += self._variants_for(int(e))[off[m]]
        return idx


class LatentLoader(StreamPosition):
    """Yields {"image": float32 latents [B, c, h, w], "label": long [B]} on `device`; the state is the stream position."""

    def __init__(self, data: LatentData, batch_size, device, seed=0, rank=0, world=1, on_device="auto",
                 pin_memory="auto", hflip=False):
        V = data.variants
        if hflip and V < 2:
            raise GenlabError(no_flip_message(data.meta.get("path", "these latents")))
        self.data, self.V = data, V
        self.setup(VariantStream(len(data), seed, stride=V, choices=V if hflip else 1), batch_size, device, rank, world,
                   data.latents.nbytes, on_device, pin_memory)
        N, _, c, h, w = data.latents.shape
        self.flat = data.latents.reshape(N * V, c, h, w)  # a view of the memmap
        if self.resident:
            self.latents = self.to_resident(self.flat)
            self.labels = self.to_resident(data.labels).long()

    def next(self) -> dict:
        t0 = time.perf_counter()
        k = self.take_rank_slice()
        if self.resident:
            idx = torch.from_numpy(k).to(self.device, non_blocking=True)
            x, y = self.latents[idx], self.labels[idx // self.V]
        else:
            x = self.to_device(torch.from_numpy(gather(self.flat, k)))
            y = self.to_device(torch.from_numpy(np.asarray(self.data.labels[k // self.V], dtype=np.int64)))
        self.wait_time += time.perf_counter() - t0
        return {"image": x.float(), "label": y}


def no_flip_message(where) -> str:
    return (f"data.hflip=true but {where} holds no flipped variants (encoded with --no-flip); set data.hflip=false "
            f"or re-encode without --no-flip")


def read_latents(path, verify: bool | None = None) -> LatentData:
    p = Path(path)
    meta = _meta(p)
    try:
        latents = np.load(p / "latents.npy", mmap_mode="r", allow_pickle=False)
        labels = np.load(p / "labels.npy", mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise GenlabError(f"latents at '{p}' are corrupt: {e}") from None
    want = (meta.get("num_samples"), meta.get("variants"), *meta.get("shape", ()))
    if latents.ndim != 5 or latents.shape != want or str(latents.dtype) != meta.get("dtype") or len(labels) != len(latents):
        raise GenlabError(f"latents at '{p}' are corrupt: latents {latents.dtype}{latents.shape}, labels {labels.shape}, "
                          f"meta.json says {meta.get('dtype')}{want}")
    if verify is None:
        verify = latents.nbytes < VERIFY_LIMIT_BYTES
    if verify and array_checksum(latents, np.asarray(labels)) != meta.get("sha256"):
        raise GenlabError(f"latents at '{p}' are corrupt: checksum mismatch with meta.json")
    return LatentData(latents=latents, labels=labels, classes=meta.get("classes", []), meta={**meta, "path": str(p)})


def _meta(p: Path) -> dict:
    if not (p / "meta.json").exists():
        hint = " (an unfinished encoding is in its .partial folder: rerun the same `genlab data encode` to finish it)" \
            if p.with_name(p.name + ".partial").exists() else ""
        raise GenlabError(f"no latents at '{p}' (meta.json missing); make them with `genlab data encode`{hint}")
    try:
        meta = json.loads((p / "meta.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise GenlabError(f"latents at '{p}' are corrupt: {e}") from None
    if meta.get("format") != FORMAT:
        raise GenlabError(f"'{p}' is not a latents folder (format {meta.get('format')!r}, want {FORMAT}); make one "
                          f"with `genlab data encode`")
    return meta


def latent_shape(path) -> dict | None:
    """The model's input shape from meta.json alone (None when missing: the reader reports that)."""
    try:
        meta = _meta(Path(path))
        c, h, w = meta["shape"]
        return {"kind": "image", "image_size": int(h), "channels": int(c), "num_classes": len(meta["classes"])}
    except Exception:  # noqa: BLE001
        return None


def _check(d):
    """Before any work: square latents (the image backbones' grid), and flipped variants where data.hflip asks."""
    try:
        meta = _meta(Path(d.path))
    except GenlabError:  # not made yet: presets may name a folder encoded later; the reader reports it
        return
    c, h, w = meta["shape"]
    if h != w:
        raise GenlabError(f"latents at '{d.path}' are {h}x{w}; the image models take square inputs")
    if d.hflip and meta.get("variants", 1) < 2:
        raise GenlabError(no_flip_message(d.path))


def _check_reference(cfg):
    """Evaluation decodes samples and compares them with the source pixels: that folder must be readable before
    training or sampling starts."""
    if cfg.eval.num_samples > 0 and cfg.data.path:
        read_reference(_meta(Path(cfg.data.path)))


@dataset_registry.register("latents", "autoencoder latents written by `genlab data encode` (data.path); image methods "
                                      "train on them, samples are decoded", kind="latent",
                           keys=(PathKeys, ImageKeys), needs_path=True, shape=lambda d: latent_shape(d.path),
                           check=lambda d: _check(d), eval_check=lambda cfg: _check_reference(cfg))
def latents(cfg_data):
    return read_latents(cfg_data.path)
