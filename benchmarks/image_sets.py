"""Prepared image sets made from another one, without a download.

    python benchmarks/image_sets.py upsample data/fashion-mnist data/fashion128 --size 128
    python benchmarks/image_sets.py jpeg-folder data/fashion-mnist data/fashion_jpg --size 288 --n 20000

`upsample`: resized to SIZE x SIZE (bicubic, rounded to uint8) as a new prepared set, the real images of a small set at
a resolution where an autoencoder has something to compress (Fashion-MNIST 28 -> 128: 32x32x4 latents at factor 4;
`genlab data prepare` resizes only when it decodes image files). `jpeg-folder`: an ImageNet-style class folder of RGB
JPEG files (`OUT/<class>/<i>.jpg`) at SIZE x SIZE, so the file-decoding path (`genlab data prepare shards`, then
`data.name=shards`) is measured on real image files.
"""
from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from common import REPO  # noqa: F401 - puts src/ on sys.path

from genlab.data.formats import read_image_dataset, write_image_dataset


def resize_uint8(images: np.ndarray, size: int, channels: int = 0, device="cpu", rows: int = 512) -> np.ndarray:
    """uint8 [N, H, W, C] -> uint8 [N, size, size, channels or C] (grey repeated to RGB when channels=3)."""
    n, _, _, c = images.shape
    out = np.empty((n, size, size, channels or c), dtype=np.uint8)
    for i in range(0, n, rows):
        x = torch.from_numpy(np.array(images[i:i + rows])).to(device).permute(0, 3, 1, 2).float()
        x = F.interpolate(x, size=(size, size), mode="bicubic", align_corners=False)
        if channels and channels != c:
            x = x.expand(-1, channels, -1, -1)
        out[i:i + rows] = x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    return out


def upsample_dataset(src, out, size: int, channels: int = 0, n: int = 0, device="cpu") -> Path:
    data = read_image_dataset(src)
    images, labels = (data.images[:n], data.labels[:n]) if n else (data.images, data.labels)
    return write_image_dataset(out, resize_uint8(images, size, channels, device), np.asarray(labels), data.classes,
                               source=f"{data.meta.get('source', src)}, bicubic to {size}x{size}",
                               extra={k: data.meta[k] for k in ("split",) if k in data.meta})


def _write_jpegs(job):
    from PIL import Image
    out, names, images, quality = job
    for name, img in zip(names, images):
        Image.fromarray(img).save(out / name, quality=quality)
    return len(names)


def jpeg_folder(src, out, size: int, n: int = 0, quality: int = 90, workers: int = 0, chunk: int = 500) -> int:
    out = Path(out)
    if out.exists():
        raise SystemExit(f"{out} exists: pick another out")
    data = read_image_dataset(src)
    count = min(n, len(data.images)) if n else len(data.images)
    classes = data.classes or [str(c) for c in range(int(np.max(data.labels[:count])) + 1)]
    for c in classes:
        (out / c).mkdir(parents=True)
    jobs = []
    for i in range(0, count, chunk):
        end = min(i + chunk, count)
        imgs = resize_uint8(data.images[i:end], size, channels=3)
        labels = np.asarray(data.labels[i:end])
        for c in np.unique(labels):
            sel = np.nonzero(labels == c)[0]
            jobs.append((out / classes[int(c)], [f"{i + j:06d}.jpg" for j in sel], imgs[sel], quality))
    with ProcessPoolExecutor(workers or os.cpu_count()) as pool:
        written = sum(pool.map(_write_jpegs, jobs))
    print(f"wrote {written} JPEG files ({size}x{size}, quality {quality}) in {len(classes)} class folders under {out}")
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    up, jp = sub.add_parser("upsample"), sub.add_parser("jpeg-folder")
    for p in (up, jp):
        p.add_argument("src", help="a prepared image folder (genlab data prepare ...)")
        p.add_argument("out", help="the folder to write (jpeg-folder: must not exist)")
        p.add_argument("--size", type=int, required=True)
        p.add_argument("--n", type=int, default=0, help="only the first N images (default: all)")
    up.add_argument("--channels", type=int, default=0, help="3: grey images repeated to RGB (default: keep)")
    up.add_argument("--device", default="cpu")
    jp.add_argument("--quality", type=int, default=90)
    jp.add_argument("--workers", type=int, default=0, help="processes (0: one per core)")
    a = ap.parse_args(argv)
    if a.what == "upsample":
        print(f"wrote {upsample_dataset(a.src, a.out, a.size, a.channels, a.n, a.device)}")
    else:
        jpeg_folder(a.src, a.out, a.size, a.n, a.quality, a.workers)


if __name__ == "__main__":
    main()
