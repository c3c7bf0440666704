"""On-disk image format: images.npy uint8 [N, H, W, C] + labels.npy int64 [N] + meta.json.

Files are memory-mapped on read; a folder is written under a temporary name and renamed into
place, so a failed conversion never leaves a half-written dataset.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from genlab.core.errors import GenlabError

VERIFY_LIMIT_BYTES = 2 << 30   # checksums of larger datasets are checked by `genlab data verify` only


def verifying(verify: bool | None, *arrays) -> bool:
    """verify as asked; by default (None) only arrays small enough to checksum at every read."""
    return sum(a.nbytes for a in arrays) < VERIFY_LIMIT_BYTES if verify is None else verify


def array_checksum(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()


@dataclass
class ImageData:
    images: np.ndarray            # uint8 [N, H, W, C], possibly a memmap
    labels: np.ndarray            # int64 [N]
    classes: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @property
    def spec(self) -> dict:
        N, H, W, C = self.images.shape
        return {"kind": "image", "image_size": H, "channels": C, "num_classes": len(self.classes),
                "num_samples": N, "classes": list(self.classes), "batch_keys": ("image", "label")}

    def __len__(self):
        return len(self.images)


@contextmanager
def atomic_folder(out):
    """Yield a temporary folder beside `out`; rename it to `out` on success, remove it and the parent folders it made
    on any failure."""
    out = Path(out)
    if (out / "index.json").exists() or (out / "meta.json").exists():
        raise GenlabError(f"{out} already holds a dataset; remove it or choose another --out")
    made = next((p for p in reversed(out.parents) if not p.exists()), None)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))  # its own per writer: two never share one
    try:
        yield tmp
        if out.exists():
            out.rmdir()  # only an empty folder can be here
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(made or tmp, ignore_errors=True)
        raise


def write_image_dataset(out_dir, images: np.ndarray, labels: np.ndarray, classes: list, source: str, extra: dict | None = None) -> Path:
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(f"images must be uint8 [N,H,W,C], got {images.dtype} {images.shape}")
    labels = np.asarray(labels, dtype=np.int64)
    if len(labels) != len(images):
        raise ValueError("images and labels differ in length")
    with atomic_folder(out_dir) as tmp:
        write_image_arrays(tmp, images, labels, classes, source, extra)
    return Path(out_dir)


def write_image_arrays(folder: Path, images: np.ndarray, labels: np.ndarray, classes: list, source: str, extra=None):
    """images.npy, labels.npy and meta.json (last) into `folder`, checked by the caller."""
    np.save(folder / "images.npy", images)
    np.save(folder / "labels.npy", labels)
    meta = {"format": "genlab-images-v1", "source": source, "num_samples": int(len(images)),
            "shape": list(images.shape[1:]), "classes": list(classes),
            "sha256": array_checksum(images, labels), **(extra or {})}
    (folder / "meta.json").write_text(json.dumps(meta, indent=2))


def read_image_dataset(path, verify: bool | None = None) -> ImageData:
    p = Path(path)
    if not (p / "meta.json").exists():
        raise GenlabError(f"no dataset at '{p}' (meta.json missing); create one with `genlab data prepare`")
    try:
        meta = json.loads((p / "meta.json").read_text())
        images = np.load(p / "images.npy", mmap_mode="r")
        labels = np.load(p / "labels.npy", mmap_mode="r")
    except (OSError, ValueError, json.JSONDecodeError) as e:
        raise GenlabError(f"dataset at '{p}' is corrupt: {e}") from None
    if images.dtype != np.uint8 or images.ndim != 4 or len(labels) != len(images):
        raise GenlabError(f"dataset at '{p}' is corrupt: images {images.dtype}{images.shape}, labels {labels.shape}")
    if list(images.shape[1:]) != meta.get("shape") or len(images) != meta.get("num_samples"):
        raise GenlabError(f"dataset at '{p}' is corrupt: arrays do not match meta.json")
    if verifying(verify, images) and meta.get("sha256") and array_checksum(images, labels) != meta["sha256"]:
        raise GenlabError(f"dataset at '{p}' is corrupt: checksum mismatch with meta.json")
    return ImageData(images=images, labels=labels, classes=meta.get("classes", []), meta=meta)
