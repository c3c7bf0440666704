"""Teacher pairs (`genlab data generate pairs`), the data of reflow: a prepared image folder plus the float32
samples.npy and noise.npy, unrounded (docs/data.md); evaluation compares with the teacher's data (PairData.reference).
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from genlab.core.errors import GenlabError
from genlab.data.datasets import PathKeys, build_dataset, dataset_registry, prepared_shape
from genlab.data.formats import ImageData, array_checksum, read_image_dataset, verifying, write_image_arrays
from genlab.data.loader import ImageLoader

PAIR_ARRAYS = ("samples", "noise")  # float32 [N, C, H, W] each, beside images.npy / labels.npy


@dataclass
class PairData(ImageData):
    samples: np.ndarray = None    # float32 [N, C, H, W]: the teacher's endpoints
    noise: np.ndarray = None      # float32 [N, C, H, W]: their start points

    @property
    def spec(self) -> dict:
        return {**super().spec, "batch_keys": ("image", "label", "noise")}

    def make_loader(self, cfg_data, batch_size, device, seed, rank, world):
        return PairLoader(self, batch_size, device, seed, rank, world, cfg_data.on_device, cfg_data.prefetch, cfg_data.pin_memory)

    def reference(self):
        """The teacher's training data (its data config, recorded in meta.json): what samples of a student trained on
        these pairs are compared with, so its scores stand beside the teacher's."""
        if getattr(self, "_reference", None) is not None:  # read once per process (each evaluation asks)
            return self._reference
        d = (self.meta.get("pairs") or {}).get("teacher_data")
        if not d:
            raise GenlabError("this pairs folder does not record the teacher's data (meta.json pairs.teacher_data); "
                              "regenerate it with `genlab data generate pairs`")
        try:
            self._reference = build_dataset(types.SimpleNamespace(**d))
            return self._reference
        except GenlabError as e:
            raise GenlabError(f"the teacher's data ({d.get('name')} {d.get('path', '')}) that students of these pairs "
                              f"are evaluated against cannot be read: {e}") from None


class PairLoader(ImageLoader):
    """Yields {"image": float [B, C, H, W], "label": long [B], "noise": float [B, C, H, W]} on `device` (the teacher's
    samples are already model inputs); the whole state is the stream position, as for the image loader."""

    fields = {"image": "samples", "label": "labels", "noise": "noise"}
    sized = ("samples", "noise")

    def finish(self, batch: dict) -> dict:
        return {**batch, "label": batch["label"].long()}


def read_pairs(path, verify: bool | None = None) -> PairData:
    base = read_image_dataset(path, verify)
    p = Path(path)
    if not all((p / f"{name}.npy").exists() for name in PAIR_ARRAYS):
        raise GenlabError(f"'{p}' holds images but no pairs (samples.npy, noise.npy); make pairs with "
                          f"`genlab data generate pairs RUN --out {p}`")
    try:
        samples, noise = (np.load(p / f"{name}.npy", mmap_mode="r") for name in PAIR_ARRAYS)
    except (OSError, ValueError) as e:
        raise GenlabError(f"pairs at '{p}' are corrupt: {e}") from None
    N, H, W, C = base.images.shape
    if samples.shape != (N, C, H, W) or noise.shape != (N, C, H, W):
        raise GenlabError(f"pairs at '{p}' are corrupt: samples {samples.shape}, noise {noise.shape}, images {base.images.shape}")
    want = (base.meta.get("pairs") or {}).get("sha256")
    if verifying(verify, samples, noise) and want and array_checksum(samples, noise) != want:
        raise GenlabError(f"pairs at '{p}' are corrupt: checksum mismatch with meta.json")
    return PairData(images=base.images, labels=base.labels, classes=base.classes, meta=base.meta,
                    samples=samples, noise=noise)


def write_pairs(tmp: Path, images_u8, labels, samples, noise, classes, meta_extra: dict) -> None:
    """The arrays of a pairs folder into `tmp` (an empty folder the caller renames into place). samples and noise
    may already be .npy memmaps inside tmp (written while sampling); they are flushed, not copied."""
    for name, a in (("samples", samples), ("noise", noise)):
        if isinstance(a, np.memmap):
            a.flush()
        else:
            np.save(tmp / f"{name}.npy", a)
    write_image_arrays(tmp, images_u8, labels, classes, "genlab data generate pairs",
                       {"pairs": {**meta_extra, "sha256": array_checksum(samples, noise)}})


@dataset_registry.register("pairs", "teacher (noise, image, label) triples written by `genlab data generate pairs` "
                                    "(data.path); batches image, label, noise", kind="image",
                           keys=PathKeys, needs_path=True, shape=lambda d: prepared_shape(d.path))
def pairs(cfg_data):
    return read_pairs(cfg_data.path)
