"""Video frames (e.g. the world-model issue's Atari episodes, frames.npy uint8 [T, H, W, C]) -> the images
format, resized to SIZE x SIZE: colour images for long byte sequences (32x32x3 = 3,072 tokens, CIFAR's
length; 64x64x3 = 12,288, the Sparse Transformer's long-context length)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from genlab.core.errors import GenlabError
from genlab.data.formats import write_image_dataset

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
