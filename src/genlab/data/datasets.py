"""Dataset registry: `(cfg.data) -> ImageData` (or another data object with `.spec`)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from genlab.data.formats import ImageData, array_checksum, read_image_dataset
from genlab.errors import GenlabError
from genlab.registry import dataset_registry


def load_digits_uint8() -> ImageData:
    """scikit-learn's bundled 8x8 digits (1797 images, values 0..16) as uint8 [N, 8, 8, 1]."""
    pixels, labels = _read_digits_csv()
    images = np.round(pixels.reshape(-1, 8, 8) * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)[..., None]
    labels = labels.astype(np.int64)
    meta = {"source": "sklearn.datasets.load_digits", "sha256": array_checksum(images, labels)}
    return ImageData(images=images, labels=labels, classes=[str(i) for i in range(10)], meta=meta)


def _read_digits_csv():
    """The digits file that ships inside scikit-learn, read without importing scikit-learn (its import, scipy
    included, costs ~3 s of every run's start-up); falls back to sklearn's loader if the file moves."""
    import importlib.util
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits
        d = load_digits()
        return d.data, d.target
    table = np.loadtxt(path, delimiter=",")  # 64 pixel columns, then the label
    return table[:, :-1], table[:, -1]


@dataset_registry.register("digits", "scikit-learn's bundled 8x8 digits, embedded: needs no files")
def digits(cfg_data):
    return load_digits_uint8()


@dataset_registry.register("images", "a folder written by `genlab data prepare` (data.path)")
def images(cfg_data):
    if not cfg_data.path:
        raise GenlabError("data.name=images needs data.path (a folder made by `genlab data prepare`)")
    return read_image_dataset(cfg_data.path)


@dataset_registry.register("synthetic", "random uint8 images of data.image_size/channels/num_classes (benchmarks)")
def synthetic(cfg_data):
    rng = np.random.default_rng(0)
    n, s, c = cfg_data.size, cfg_data.image_size, cfg_data.channels
    images = rng.integers(0, 256, size=(n, s, s, c), dtype=np.uint8)
    labels = rng.integers(0, cfg_data.num_classes, size=n).astype(np.int64)
    return ImageData(images=images, labels=labels, classes=[str(i) for i in range(cfg_data.num_classes)],
                     meta={"source": "synthetic"})


def build_dataset(cfg_data):
    return dataset_registry.get(cfg_data.name)(cfg_data)
