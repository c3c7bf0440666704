"""Dataset registry: `(cfg.data) -> ImageData` (or another data object with `.spec`)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from genlab.config.check import read_keys
from genlab.config.fields import F, Keys
from genlab.core.errors import GenlabError
from genlab.core.registry import Registry, Spec
from genlab.data.formats import ImageData, array_checksum, read_image_dataset


@dataclass(frozen=True, kw_only=True)
class DatasetSpec(Spec):
    kind: str                              # image | token | episodes
    needs_path: bool = False               # reads a folder written by `genlab data ...` (data.path)
    synthetic: bool = False                # random data for benchmarks: `shape` gives its whole data spec
    shape: Callable | None = None          # shape(cfg_data) -> {kind, image_size, channels, num_classes} or None,
                                           # known without loading the data
    check: Callable | None = None          # check(cfg_data): its own option checks
    eval_check: Callable | None = None     # eval_check(cfg): files its evaluation reads (a latent set's source
                                           # pixels), before training or evaluation starts


dataset_registry = Registry("dataset", DatasetSpec)

# data.path: read by every dataset made by `genlab data ...` (images, tokens, episodes)
class PathKeys(Keys, section="data"):
    path: str = F("", "folder written by `genlab data ...` (data.name=images|shards|latents|tokens|pairs|episodes)", free="a folder path")


class ImageKeys(Keys, section="data"):
    hflip: bool = F(False, "random horizontal flip of images, applied on the device")


class SyntheticKeys(Keys, section="data"):
    image_size: int = F(32, "synthetic images: height = width in pixels", ge=1)
    channels: int = F(4, "synthetic images: channels", ge=1)
    num_classes: int = F(1000, "synthetic images: number of classes", ge=1)
    size: int = F(4096, "synthetic data: number of samples (images or sequences)", ge=1)


def load_digits_uint8() -> ImageData:
    """scikit-learn's bundled 8x8 digits (1797 images, values 0..16) as uint8 [N, 8, 8, 1], read from the file inside
    scikit-learn without importing it (its import, scipy included, costs ~3 s of every run's start-up); sklearn's
    loader if the file moves."""
    import importlib.util
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits
        d = load_digits()
        pixels, labels = d.data, d.target
    else:
        table = np.loadtxt(path, delimiter=",")  # 64 pixel columns, then the label
        pixels, labels = table[:, :-1], table[:, -1]
    images = np.round(pixels.reshape(-1, 8, 8) * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)[..., None]
    labels = labels.astype(np.int64)
    meta = {"source": "sklearn.datasets.load_digits", "sha256": array_checksum(images, labels)}
    return ImageData(images=images, labels=labels, classes=[str(i) for i in range(10)], meta=meta)


def prepared_shape(path) -> dict | None:
    """The shape of a prepared folder from the header of images.npy and meta.json (None when missing or
    unreadable: the dataset reader reports that)."""
    try:
        n, h, w, c = np.load(Path(path) / "images.npy", mmap_mode="r").shape
        classes = json.loads((Path(path) / "meta.json").read_text()).get("classes", [])
        return {"kind": "image", "image_size": int(h), "channels": int(c), "num_classes": len(classes)}
    except Exception:  # noqa: BLE001
        return None


def check_data_on_disk(cfg) -> None:
    """Files a config names that must exist before training starts (the trainer calls this before it creates the run
    folder; load_config does not, so presets that name a folder you prepare later still load)."""
    keys, spec = PathKeys.of(cfg.data), dataset_registry.spec(cfg.data.name)
    if spec.needs_path and not Path(keys.path).exists():
        raise GenlabError(f"no dataset at '{keys.path}' (no such folder); data.name={cfg.data.name} reads a folder "
                          "made by `genlab data` (prepare, encode, collect, generate)")
    if cfg.eval.val_path and cfg.eval.num_samples > 0 and "eval.val_path" in read_keys(cfg):
        if prepared_shape(cfg.eval.val_path) is None:  # found now, not after training
            raise GenlabError(f"eval.val_path '{cfg.eval.val_path}' is not a folder made by `genlab data prepare` "
                              f"(no readable images.npy + meta.json)")
    if spec.eval_check is not None and cfg.eval.num_samples > 0:
        spec.eval_check(cfg)


def synthetic_spec(d) -> dict:
    """The data spec of data.name=synthetic without generating it (benchmarks at large data.size)."""
    return {"kind": "image", "image_size": d.image_size, "channels": d.channels, "num_classes": d.num_classes,
            "num_samples": d.size, "classes": [str(i) for i in range(d.num_classes)], "batch_keys": ("image", "label")}


@dataset_registry.register("digits", "scikit-learn's bundled 8x8 digits, embedded: needs no files", kind="image",
                           keys=ImageKeys, shape=lambda d: {"kind": "image", "image_size": 8, "channels": 1, "num_classes": 10})
def digits(cfg_data):
    return load_digits_uint8()


@dataset_registry.register("images", "a folder written by `genlab data prepare` (data.path)", kind="image",
                           keys=(PathKeys, ImageKeys), needs_path=True, shape=lambda d: prepared_shape(d.path))
def images(cfg_data):
    return read_image_dataset(cfg_data.path)


@dataset_registry.register("synthetic", "random uint8 images of data.image_size/channels/num_classes (benchmarks)",
                           kind="image", keys=(ImageKeys, SyntheticKeys), synthetic=True, shape=lambda d: synthetic_spec(d))
def synthetic(cfg_data):
    rng = np.random.default_rng(0)
    n, s, c = cfg_data.size, cfg_data.image_size, cfg_data.channels
    images = rng.integers(0, 256, size=(n, s, s, c), dtype=np.uint8)
    labels = rng.integers(0, cfg_data.num_classes, size=n).astype(np.int64)
    return ImageData(images=images, labels=labels, classes=[str(i) for i in range(cfg_data.num_classes)],
                     meta={"source": "synthetic"})


def build_dataset(cfg_data):
    return dataset_registry.get(cfg_data.name)(cfg_data)
