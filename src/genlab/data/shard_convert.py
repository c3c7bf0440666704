"""`genlab data prepare shards`: a class folder (ImageNet's train layout) or a CSV/JSON file list, converted
in parallel with ADM's resize-and-centre-crop rule and written as shards (see genlab.data.shards).

Every input is checked (files exist, the list parses, there is something to convert) before anything is
written; a decoding failure in a worker removes the temporary folder, so --out never holds half a dataset.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from genlab.core.errors import GenlabError
from genlab.core.progress import Task
from genlab.data.formats import atomic_folder
from genlab.data.shards import save_shard, shard_name, write_index
from genlab.data.sources import list_source


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


def load_cropped(path, size: int, channels: int) -> np.ndarray:
    from PIL import Image
    try:
        with Image.open(path) as im:
            a = center_crop_arr(im.convert("L" if channels == 1 else "RGB"), size)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:  # PIL: SyntaxError = a broken file
        raise GenlabError(f"cannot read image {path}: {e}") from None
    return np.ascontiguousarray(a[..., None] if a.ndim == 2 else a)


def _convert_shard(job) -> dict:
    """One pool task: decode, crop and save one shard; returns its index entry."""
    path, files, size, channels = job
    return save_shard(Path(path), np.stack([load_cropped(f, size, channels) for f in files]))


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
