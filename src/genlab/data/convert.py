"""`genlab data prepare`: the standard public dataset files (read as published, md5-checked unless told not to), an
image class folder or file list (shards), or video frames -> genlab's memory-mapped formats, written atomically."""
from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import os
import pickle
import shutil
import tarfile
import urllib.request
from pathlib import Path

import numpy as np

from genlab.core.errors import GenlabError
from genlab.core.progress import Task
from genlab.data.datasets import load_digits_uint8
from genlab.data.formats import atomic_folder, write_image_dataset
from genlab.data.shards import save_shard, shard_name, write_index
from genlab.data.text import prepare_text

# Published md5s (the datasets' own pages; torchvision lists the same).
IDX_FILES = {
    "mnist": {
        "url": "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "classes": [str(i) for i in range(10)],
        "train": (("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
                  ("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432")),
        "test": (("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
                 ("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c")),
    },
    "fashion-mnist": {
        "url": "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
        "classes": ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"],
        "train": (("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
                  ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe")),
        "test": (("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
                 ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310")),
    },
}

CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
CIFAR10_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f", "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751", "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb", "test_batch": "40351d587109b95175f43aff81a1287e",
    "batches.meta": "5ff9c542aee3614f3951f8cda6e48888",
}
CIFAR10_SPLITS = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}

KINDS = ("digits", "mnist", "fashion-mnist", "cifar10", "imagefolder", "frames", "text", "shards")


def check_md5(name: str, data: bytes, expected: str, verify: bool):
    got = hashlib.md5(data).hexdigest() if verify else expected
    if got != expected:
        raise GenlabError(f"checksum mismatch for {name}: md5 {got}, expected {expected} "
                          f"(corrupt or not the official file; --no-verify skips the check)")


def download(url: str, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as f:
            shutil.copyfileobj(r, f)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise GenlabError(f"could not download {url}: {e}") from None
    tmp.replace(dest)
    return dest


def _src_dir(src, kind: str, download_ok: bool) -> Path:
    if src:
        p = Path(src)
        if not p.exists():
            raise GenlabError(f"--src '{p}' does not exist")
        return p
    if download_ok:
        return Path.home() / ".cache" / "genlab" / "downloads" / kind
    raise GenlabError(f"`data prepare {kind}` needs --src DIR holding the public files (or --download)")


# MNIST / Fashion-MNIST: idx files
def parse_idx(raw: bytes, name: str) -> np.ndarray:
    """The idx format: 2 zero bytes, dtype code, ndim, big-endian int32 dims, then the data."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise GenlabError(f"{name} is not an idx file of unsigned bytes")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">i4", count=ndim, offset=4)
    offset = 4 + 4 * ndim
    count = int(np.prod(dims))
    if len(raw) - offset != count:
        raise GenlabError(f"{name} is truncated: {len(raw) - offset} bytes of data for shape {tuple(dims)}")
    return np.frombuffer(raw, dtype=np.uint8, offset=offset).reshape(tuple(int(d) for d in dims))


def prepare_idx(kind: str, src, out, split: str, verify: bool, download_ok: bool) -> Path:
    info = IDX_FILES[kind]
    folder = _src_dir(src, kind, download_ok)
    arrays = []
    for fname, md5 in info[split]:
        path = folder / fname
        if not path.exists() and download_ok:
            download(info["url"] + fname, path)
        if not path.exists():
            raise GenlabError(f"missing {path}; {kind} needs {', '.join(f for f, _ in info[split])} in --src")
        raw = path.read_bytes()
        check_md5(fname, raw, md5, verify)
        try:
            arrays.append(parse_idx(gzip.decompress(raw), fname))
        except (OSError, EOFError) as e:
            raise GenlabError(f"{path} is not a valid gzip file: {e}") from None
    images, labels = arrays
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise GenlabError(f"{kind} {split}: images {images.shape} and labels {labels.shape} do not match")
    return write_image_dataset(out, images[..., None].copy(), labels.astype(np.int64), info["classes"],
                               source=f"{kind} {split} (idx files)", extra={"split": split})


# CIFAR-10: python pickle batches
def _cifar_members(folder: Path, names: list[str], download_ok: bool) -> dict[str, bytes]:
    """Read batch files from a folder (extracted or not) or from cifar-10-python.tar.gz in it."""
    found = {n: next((c for c in (folder / n, folder / "cifar-10-batches-py" / n) if c.exists()), None) for n in names}
    out = {n: p.read_bytes() for n, p in found.items() if p is not None}
    missing = [n for n in names if n not in out]
    if not missing:
        return out
    archive = folder / "cifar-10-python.tar.gz"
    if not archive.exists() and download_ok:
        download(CIFAR10_URL, archive)
    if not archive.exists():
        raise GenlabError(f"missing CIFAR-10 files {', '.join(missing)} in '{folder}' (nor cifar-10-python.tar.gz)")
    with tarfile.open(archive, "r:gz") as tar:
        for n in missing:
            try:
                out[n] = tar.extractfile(f"cifar-10-batches-py/{n}").read()
            except KeyError:
                raise GenlabError(f"{archive} has no cifar-10-batches-py/{n}") from None
    return out


# The only globals the official batches reference (numpy arrays: written by Python 2 numpy as
# numpy.core.multiarray, by numpy >= 2 as numpy._core.multiarray); dicts, lists, ints and strings need none.
CIFAR_GLOBALS = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                 ("numpy", "ndarray"), ("numpy", "dtype")}


class _CifarUnpickler(pickle.Unpickler):
    """Admits only what a CIFAR-10 batch contains, so a crafted file cannot run code on load."""

    def find_class(self, module, name):
        if (module, name) in CIFAR_GLOBALS:
            return super().find_class(module, name)
        raise _Refused(f"{module}.{name}")


class _Refused(Exception):
    pass


def _unpickle(raw: bytes, name: str) -> dict:
    try:
        d = _CifarUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except _Refused as e:
        raise GenlabError(f"refused to load {name}: it asks for {e}, which CIFAR-10 batches never contain") from None
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a corrupt file
        raise GenlabError(f"{name} is not a CIFAR-10 pickle: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if not isinstance(d, dict):
        raise GenlabError(f"{name} is not a CIFAR-10 pickle (holds a {type(d).__name__}, not a dict)")
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in d.items()}


def prepare_cifar10(src, out, split: str, verify: bool, download_ok: bool) -> Path:
    folder = _src_dir(src, "cifar10", download_ok)
    names = CIFAR10_SPLITS[split] + ["batches.meta"]
    raw = _cifar_members(folder, names, download_ok)
    for n in names:
        check_md5(n, raw[n], CIFAR10_MD5[n], verify)
    meta = _unpickle(raw["batches.meta"], "batches.meta")
    if "label_names" not in meta:
        raise GenlabError("batches.meta is not a CIFAR-10 meta batch (no label_names)")
    classes = [c.decode() if isinstance(c, bytes) else c for c in meta["label_names"]]
    images, labels = [], []
    for n in CIFAR10_SPLITS[split]:
        d = _unpickle(raw[n], n)
        if "data" not in d or "labels" not in d:
            raise GenlabError(f"{n} is not a CIFAR-10 batch (needs data and labels)")
        data = np.asarray(d["data"], dtype=np.uint8)
        if data.ndim != 2 or data.shape[1] != 3072:
            raise GenlabError(f"{n}: data has shape {data.shape}, expected [N, 3072]")
        # rows hold 1024 red, then 1024 green, then 1024 blue values, each 32x32 row-major
        images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.append(np.asarray(d["labels"], dtype=np.int64))
    return write_image_dataset(out, np.ascontiguousarray(np.concatenate(images)), np.concatenate(labels), classes,
                               source=f"cifar10 {split} (python pickle batches)", extra={"split": split})


# image sources: a class folder (one subfolder per class, ImageNet's train layout) or a CSV/JSON file list
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


def list_class_folder(root: Path) -> tuple[list, list]:
    """(file, class index) of every image under root/<class>/ (sorted), and the sorted class names."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    files = [(f, ci) for ci, c in enumerate(classes) for f in sorted((root / c).rglob("*")) if f.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise GenlabError(f"no images found under '{root}/<class>/' (suffixes: {', '.join(sorted(IMAGE_SUFFIXES))})")
    return files, classes


def list_file(src: Path) -> tuple[list, list]:
    """(path, label) rows of a .csv (header with `path` and `label` columns) or .json (a list of
    {"path", "label"} objects); relative paths are relative to the list's folder. Labels that are all
    integers are class ids (classes "0".."max"); otherwise class names, numbered in sorted order."""
    try:
        if src.suffix.lower() == ".json":
            rows = json.loads(src.read_text())
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise GenlabError(f"{src}: expected a JSON list of {{\"path\": ..., \"label\": ...}} objects")
        else:
            with open(src, newline="") as f:
                rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, csv.Error) as e:
        raise GenlabError(f"cannot read file list {src}: {e}") from None
    if not rows:
        raise GenlabError(f"file list {src} is empty")
    for i, r in enumerate(rows):
        if r.get("path") in (None, "") or r.get("label") in (None, ""):
            raise GenlabError(f"{src}: row {i + 1} needs both 'path' and 'label' (got {sorted(k for k in r if k)})")
    raw = [str(r["label"]).strip() for r in rows]
    if all(x.lstrip("-").isdigit() for x in raw):
        ids = [int(x) for x in raw]
        if min(ids) < 0:
            raise GenlabError(f"{src}: integer labels must be >= 0, got {min(ids)}")
        classes = [str(i) for i in range(max(ids) + 1)]
    else:
        classes = sorted(set(raw))
        number = {c: i for i, c in enumerate(classes)}
        ids = [number[x] for x in raw]
    files = [(Path(r["path"]) if Path(r["path"]).is_absolute() else src.parent / r["path"], c) for r, c in zip(rows, ids)]
    return files, classes


def list_source(src) -> tuple[list, list]:
    if not src:
        raise GenlabError("`data prepare shards` needs --src: a folder with one subfolder per class, or a .csv/.json file list")
    p = Path(src)
    if not p.exists():
        raise GenlabError(f"--src '{p}' does not exist")
    files, classes = list_class_folder(p) if p.is_dir() else list_file(p)
    missing = [str(f) for f, _ in files if not f.is_file()]
    if missing:
        raise GenlabError(f"{len(missing)} listed image(s) missing, first: {missing[0]}")
    return files, classes


def load_image(path, channels: int, crop) -> np.ndarray:
    """An image file as uint8 [H, W, channels], cropped and resized by crop(PIL image) -> array."""
    from PIL import Image
    try:
        with Image.open(path) as im:
            a = crop(im.convert("L" if channels == 1 else "RGB"))
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:  # PIL: SyntaxError = a broken file
        raise GenlabError(f"cannot read image {path}: {e}") from None
    return np.ascontiguousarray(a[..., None] if a.ndim == 2 else a)


# a folder of images, one subfolder per class
def center_square(im, size: int) -> np.ndarray:
    """imagefolder's preprocessing: the central square, BICUBIC-resized to size x size (size 0: as it is)."""
    from PIL import Image
    if size:
        w, h = im.size
        s = min(w, h)
        im = im.crop(((w - s) // 2, (h - s) // 2, (w - s) // 2 + s, (h - s) // 2 + s)).resize((size, size), Image.BICUBIC)
    return np.asarray(im, dtype=np.uint8)


def prepare_imagefolder(src, out, size: int, channels: int) -> Path:
    if not src:
        raise GenlabError("`data prepare imagefolder` needs --src DIR with one subfolder of images per class")
    root = Path(src)
    if not root.is_dir():
        raise GenlabError(f"--src '{root}' is not a folder")
    if channels not in (1, 3):
        raise GenlabError(f"--channels must be 1 or 3, got {channels}")
    files, classes = list_class_folder(root)
    images = [load_image(f, channels, lambda im: center_square(im, size)) for f, _ in files]
    shapes = {a.shape for a in images}
    if len(shapes) > 1:
        raise GenlabError(f"images under '{root}' have different sizes {sorted(shapes)[:3]}...; pass --size N to resize")
    if images[0].shape[0] != images[0].shape[1]:
        raise GenlabError(f"images are {images[0].shape[1]}x{images[0].shape[0]}, not square; pass --size N to crop and resize")
    return write_image_dataset(out, np.stack(images), np.array([c for _, c in files]), classes,
                               source=f"imagefolder {root}", extra={"files": len(files)})


# shards: ADM's resize-and-centre-crop, in parallel; checked before anything is written
def center_crop_arr(im, size: int) -> np.ndarray:
    """ADM/DiT preprocessing (guided-diffusion's image_datasets.py): while the short side is at least twice
    `size`, halve the image with a BOX filter (an exact 2x2 mean, so large downscales do not alias); then
    BICUBIC-resize so the short side is `size`; then take the central size x size crop."""
    from PIL import Image
    while min(im.size) >= 2 * size:
        im = im.resize(tuple(x // 2 for x in im.size), resample=Image.BOX)
    scale = size / min(im.size)
    im = im.resize(tuple(round(x * scale) for x in im.size), resample=Image.BICUBIC)
    a = np.asarray(im)
    top, left = (a.shape[0] - size) // 2, (a.shape[1] - size) // 2
    return a[top:top + size, left:left + size]


def _convert_shard(job) -> dict:
    """One pool task: decode, crop and save one shard; returns its index entry."""
    path, files, size, channels = job
    return save_shard(Path(path), np.stack([load_image(f, channels, lambda im: center_crop_arr(im, size)) for f in files]))


def _run_pool(jobs, workers: int):
    """Shards in parallel processes; the first failure cancels the rest. fork where the OS has it: the
    workers use only PIL and numpy (no torch threads), and spawn would re-import the caller's __main__."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    pool = ProcessPoolExecutor(workers, mp_context=ctx)
    try:
        yield from pool.map(_convert_shard, jobs)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def prepare_shards(src, out, size: int, channels: int = 3, shard_size: int = 1000, workers: int = 0) -> Path:
    if size < 1:
        raise GenlabError("`data prepare shards` needs --size N (images are resized and centre-cropped to N x N)")
    if channels not in (1, 3):
        raise GenlabError(f"--channels must be 1 or 3, got {channels}")
    if shard_size < 1:
        raise GenlabError(f"--shard-size must be >= 1, got {shard_size}")
    files, classes = list_source(src)
    workers = workers or os.cpu_count() or 1
    with atomic_folder(out) as tmp:
        jobs = [(str(tmp / shard_name(i)), [str(f) for f, _ in files[s:s + shard_size]], size, channels)
                for i, s in enumerate(range(0, len(files), shard_size))]
        task = Task(f"prepare shards {Path(out).name}", len(jobs), unit="shards")
        serial = workers == 1 or len(jobs) == 1
        shards = []
        for entry in (map(_convert_shard, jobs) if serial else _run_pool(jobs, min(workers, len(jobs)))):
            shards.append(entry)
            task.update(1)
        write_index(tmp, shards, np.array([c for _, c in files]), classes, (size, size, channels), shard_size,
                    source=f"{'class folder' if Path(src).is_dir() else 'file list'} {src}",
                    extra={"preprocess": "adm_center_crop"})
        task.close()  # on success only: a failure's one-line error stays the last line
    return Path(out)


# video frames (frames.npy uint8 [T, H, W, C], e.g. Atari episodes) -> images, for long byte sequences
SPLITS = ("train", "test", "all")


def resize_frames(frames: np.ndarray, size: int, channels: int) -> np.ndarray:
    """uint8 [T, H, W, C] -> uint8 [T, size, size, channels]; box filter (each output pixel is the mean
    of the input pixels it covers), aspect ratio not kept (Atari's 210x160 squeezes like DQN's 84x84)."""
    from PIL import Image
    mode = "L" if channels == 1 else "RGB"
    out = np.empty((len(frames), size, size, channels), dtype=np.uint8)
    for i, f in enumerate(frames):
        im = Image.fromarray(f[..., 0] if f.shape[-1] == 1 else f[..., :3]).convert(mode)
        a = np.asarray(im.resize((size, size), Image.BOX))
        out[i] = a[..., None] if channels == 1 else a
    return out


def prepare_frames(src, out, size: int, channels: int, split: str) -> Path:
    """Every */frames.npy under --src (one episode each, sorted by path). Split by episode: test = the
    last max(1, n // 10) episodes, train = the others, all = every episode. Label = episode index."""
    if not src or not Path(src).is_dir():
        raise GenlabError(f"`data prepare frames` needs --src DIR holding episode folders with frames.npy; got {src!r}")
    if split not in SPLITS:
        raise GenlabError(f"unknown --split '{split}' for frames; valid: {', '.join(SPLITS)}")
    if size < 1 or channels not in (1, 3):
        raise GenlabError(f"frames needs --size >= 1 (e.g. 32 or 64) and --channels 1 or 3; got {size}, {channels}")
    files = sorted(Path(src).rglob("frames.npy"))
    if not files:
        raise GenlabError(f"no frames.npy found under '{src}'")
    n_test = max(1, len(files) // 10)
    if split != "all" and len(files) < 2:
        raise GenlabError(f"one episode under '{src}' cannot be split into train and test; use --split all")
    chosen = {"train": files[:len(files) - n_test], "test": files[len(files) - n_test:], "all": files}[split]
    images, labels = [], []
    for i, f in enumerate(chosen):
        frames = np.load(f, mmap_mode="r")
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] not in (1, 3, 4):
            raise GenlabError(f"{f}: expected uint8 [T, H, W, C], got {frames.dtype} {frames.shape}")
        images.append(resize_frames(np.asarray(frames), size, channels))
        labels.append(np.full(len(frames), i, dtype=np.int64))
    names = [str(f.parent.relative_to(src)) for f in chosen]
    return write_image_dataset(out, np.concatenate(images), np.concatenate(labels), names,
                               source=f"frames {src} ({split}, {len(chosen)} episodes)", extra={"split": split, "size": size})


def prepare(kind: str, src=None, out=None, download: bool = False, verify: bool = True, size: int = 0,
            channels: int = 3, split: str = "train", tokenizer: str = "char", hf=None, shard_size: int = 1000,
            workers: int = 0, force: bool = False) -> Path:
    if kind not in KINDS:
        raise GenlabError(f"unknown dataset kind '{kind}'; valid: {', '.join(KINDS)}")
    if out is None:
        raise GenlabError("`data prepare` needs --out DIR")
    if force and kind != "text":
        raise GenlabError("--force applies to `data prepare text` only (it replaces a token dataset)")
    if isinstance(src, (list, tuple)) and kind != "text":  # the CLI's --src takes several values (for text)
        if len(src) != 1:
            raise GenlabError(f"`data prepare {kind}` takes one --src; several files or patterns are for text")
        src = src[0]
    if kind == "text":
        return prepare_text(src=src, out=out, tokenizer=tokenizer, hf=hf, workers=workers, force=force)
    if Path(out).exists() and (not Path(out).is_dir() or any(Path(out).iterdir())):
        raise GenlabError(f"--out '{out}' already exists and is not empty; choose another --out (nothing is overwritten)")
    if kind in (*IDX_FILES, "cifar10") and split not in ("train", "test"):
        raise GenlabError(f"unknown --split '{split}' for {kind}; valid: train, test")
    if kind == "digits":
        d = load_digits_uint8()
        return write_image_dataset(out, d.images, d.labels, d.classes, source=d.meta["source"])
    if kind in IDX_FILES:
        return prepare_idx(kind, src, out, split, verify, download)
    if kind == "cifar10":
        return prepare_cifar10(src, out, split, verify, download)
    if kind == "imagefolder":
        return prepare_imagefolder(src, out, size, channels)
    if kind == "shards":
        return prepare_shards(src, out, size, channels, shard_size=shard_size, workers=workers)
    return prepare_frames(src, out, size or 32, channels, split)
