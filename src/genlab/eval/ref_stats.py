"""Reference statistics files of the standard FID protocol (eval.fid_ref), read (allow_pickle=False) and written by
`genlab data ref-stats`: ADM reference batches or clean-fid / torch-fidelity / pytorch-fid mu, sigma (docs/fid.md)."""
from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from genlab import __version__
from genlab.core import progress
from genlab.core.errors import GenlabError
from genlab.data.formats import read_image_dataset
from genlab.eval.inception import inception_outputs, load_fid_inception

IMAGES = "arr_0"
STAT_KEYS = {"inception": ("mu", "sigma"), "inception_spatial": ("mu_s", "sigma_s")}  # feature space -> keys
DIMS = {"inception": 2048, "inception_spatial": 2023}
EXPECTED = ("'mu' + 'sigma' (clean-fid / torch-fidelity / pytorch-fid statistics) or 'arr_0' uint8 images "
            "[N, H, W, 3] with optional mu, sigma, mu_s, sigma_s (ADM reference batch)")


def npz_headers(path) -> dict[str, tuple[tuple, np.dtype]]:
    """{array name: (shape, dtype)} of an .npz, read from the .npy headers only (no array data)."""
    out = {}
    with zipfile.ZipFile(path) as z:
        for name in (n for n in z.namelist() if n.endswith(".npy")):
            with z.open(name) as f:
                version = np.lib.format.read_magic(f)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
                shape, _, dtype = read(f)  # (3, 0) differs from (2, 0) only in the header's text encoding
            out[name[:-4]] = (tuple(shape), dtype)
    return out


@dataclass
class Reference:
    """A reference file's contents, checked; arrays are read when first asked for."""
    path: Path
    headers: dict
    _arrays: dict = field(default_factory=dict, repr=False)

    @property
    def has_images(self) -> bool:
        return IMAGES in self.headers

    def has_stats(self, space: str) -> bool:
        return space in STAT_KEYS and STAT_KEYS[space][0] in self.headers

    def can_serve(self, space: str) -> bool:
        return self.has_stats(space) or self.has_images

    def describe(self) -> str:
        parts = [f"{k} {list(s)}" for k, (s, _) in self.headers.items() if k in (IMAGES, "mu", "mu_s")]
        return f"eval.fid_ref {self.path.name} ({', '.join(parts)})"

    def _read(self, key):
        if key not in self._arrays:
            with np.load(self.path, allow_pickle=False) as z:
                self._arrays[key] = np.asarray(z[key])
        return self._arrays[key]

    def images(self) -> np.ndarray:
        """uint8 [N, H, W, C] reference images (arr_0)."""
        if not self.has_images:
            raise GenlabError(f"eval.fid_ref={self.path} holds no images (arr_0): precision/recall needs them; "
                              f"write a file with images by `genlab data ref-stats DATASET --images N`")
        return self._read(IMAGES)

    def stats(self, space: str) -> tuple[np.ndarray, np.ndarray]:
        mu, sigma = STAT_KEYS[space]
        return self._read(mu).astype(np.float64), self._read(sigma).astype(np.float64)


def _fail(path, msg):
    raise GenlabError(f"eval.fid_ref={path}: {msg}")


def load_reference(path) -> Reference:
    """Read and check a reference file's layout (headers only: cheap before sampling); one-line errors."""
    p = Path(str(path)).expanduser()
    if not p.is_file():
        _fail(path, "no such file")
    try:
        headers = npz_headers(p)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
        _fail(path, f"not a readable .npz file ({' '.join(str(e).split()) or type(e).__name__}); expected {EXPECTED}")
    found = ", ".join(f"{k} {d}{list(s)}" for k, (s, d) in headers.items()) or "no arrays"
    pickled = [k for k, (_, d) in headers.items() if d.hasobject]
    if pickled:
        _fail(path, f"arrays {', '.join(pickled)} hold Python objects (pickles), which genlab never loads")
    if IMAGES not in headers and "mu" not in headers:
        _fail(path, f"holds {found}; expected {EXPECTED}")
    for space, (mu, sigma) in STAT_KEYS.items():
        if (mu in headers) != (sigma in headers):
            _fail(path, f"holds {found}: '{mu}' and '{sigma}' come together")
        if mu in headers:
            d = DIMS[space]
            if headers[mu][0] != (d,) or headers[sigma][0] != (d, d):
                _fail(path, f"{mu} {list(headers[mu][0])} / {sigma} {list(headers[sigma][0])} are not the FID Inception's "
                            f"{'pool3' if space == 'inception' else 'spatial (mixed_6/conv[..., :7])'} statistics: "
                            f"expected [{d}] and [{d}, {d}]")
            if not all(np.issubdtype(headers[k][1], np.floating) for k in (mu, sigma)):
                _fail(path, f"{mu} / {sigma} must be floating point, got {headers[mu][1]} / {headers[sigma][1]}")
    if IMAGES in headers:
        shape, dtype = headers[IMAGES]
        if dtype != np.uint8 or len(shape) != 4 or shape[-1] not in (1, 3) or shape[0] < 2:
            _fail(path, f"arr_0 is {dtype}{list(shape)}; expected uint8 images [N >= 2, H, W, 3] (channels last, 0..255)")
    return Reference(p, headers)


class _Moments:
    """Mean and unbiased covariance accumulated over batches in float64, about the first batch's mean (a shifted
    sum of squares: no cancellation when the mean is large against the spread)."""

    def __init__(self):
        self.n, self.shift, self.s1, self.s2 = 0, None, None, None

    def add(self, x: np.ndarray):
        x = np.asarray(x, np.float64)
        if self.shift is None:
            self.shift = x.mean(0)
            self.s1, self.s2 = np.zeros_like(self.shift), np.zeros((x.shape[1],) * 2)
        y = x - self.shift
        self.n += len(x)
        self.s1 += y.sum(0)
        self.s2 += y.T @ y

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        m = self.s1 / self.n
        return self.shift + m, (self.s2 - self.n * np.outer(m, m)) / (self.n - 1)


def compute_reference(images, net, *, batch: int = 100, device="cpu", n_images: int = 10000, seed: int = 0,
                      desc: str = "ref-stats") -> dict:
    """The arrays of an ADM-layout reference file for uint8 [N, H, W, C] images: mu, sigma (pool3), mu_s,
    sigma_s (spatial) over all N, and arr_0, a fixed random subset of n_images (RGB) for precision/recall."""
    n = len(images)
    if n < 2:
        raise GenlabError(f"reference statistics need at least 2 images, got {n}")
    pool, spatial = _Moments(), _Moments()
    chunk = max(batch, 1000)  # images read from a memory map per step; the network sees `batch` at a time
    with progress.Task(desc, n, unit="img") as bar:
        for i in range(0, n, chunk):
            out = inception_outputs(net, np.asarray(images[i:i + chunk]), batch=batch, device=device,
                                    which=("pool3", "spatial"))
            pool.add(out["pool3"])
            spatial.add(out["spatial"])
            bar.update(min(chunk, n - i))
    arrays = dict(zip(("mu", "sigma"), pool.result())) | dict(zip(("mu_s", "sigma_s"), spatial.result()))
    if n_images > 0:
        idx = np.sort(np.random.default_rng(seed).permutation(n)[:n_images])
        sub = np.asarray(images[idx])
        arrays[IMAGES] = np.repeat(sub, 3, axis=-1) if sub.shape[-1] == 1 else sub  # the evaluator's graph reads RGB
    return arrays


def write_reference(out, arrays: dict, meta: dict) -> Path:
    """Atomic write of a new .npz (never overwrites): a temporary file in the same folder, then a rename."""
    out = Path(out).expanduser()
    if out.suffix != ".npz":
        raise GenlabError(f"--out {out}: a reference file is an .npz (name it {out.name}.npz)")
    if out.exists():
        raise GenlabError(f"--out {out} exists; genlab never overwrites a reference file (remove it or choose another name)")
    if not out.parent.is_dir():
        raise GenlabError(f"--out {out}: folder {out.parent} does not exist")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:  # a file object: numpy adds no second .npz suffix
            np.savez(f, **arrays, genlab_meta=np.array(json.dumps(meta, sort_keys=True)))
        if out.exists():  # another writer finished first
            raise GenlabError(f"--out {out} appeared while writing; genlab never overwrites a reference file")
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def reference_from_dataset(dataset, out, *, fid_weights: str = "", n_images: int = 10000, limit: int = 0,
                           batch: int = 100, device="cpu") -> Path:
    """`genlab data ref-stats`: every check (output name, dataset, weights) before the Inception pass, then one pass."""
    out = Path(out).expanduser()
    if out.suffix != ".npz" or out.exists() or not out.parent.is_dir():
        write_reference(out, {}, {})  # raises the one-line reason
    for flag, v in (("--images", n_images), ("--limit", limit)):
        if v < 0:
            raise GenlabError(f"{flag} must be >= 0, got {v}")
    if batch < 1:
        raise GenlabError(f"--batch must be >= 1, got {batch}")
    data = read_image_dataset(dataset)
    if data.images.shape[-1] not in (1, 3):
        raise GenlabError(f"{dataset}: images have {data.images.shape[-1]} channels; FID reads 1 (grey) or 3 (RGB)")
    images = data.images[:limit] if limit else data.images
    net = load_fid_inception(fid_weights, device)
    arrays = compute_reference(images, net, batch=batch, device=device, n_images=n_images)
    meta = {"source": str(Path(dataset).resolve()), "dataset_sha256": data.meta.get("sha256"), "images": len(images),
            "arr_0": int(len(arrays.get(IMAGES, ()))), "network": "FID Inception-v3 (2015-12-05), pt_inception weights",
            "preprocess": "pytorch-fid: bilinear resize to 299 (half-pixel centres), 2x-1",
            "generator": f"genlab {__version__} data ref-stats"}
    return write_reference(out, arrays, meta)
