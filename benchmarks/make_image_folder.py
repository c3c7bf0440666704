"""A prepared image set written out as an ImageNet-style class folder of JPEG files (`OUT/<class>/<i>.jpg`), resized
to SIZE x SIZE and made RGB, so the file-decoding path (`genlab data prepare shards`, then `data.name=shards`) can be
measured on real image files without a download.

    python benchmarks/make_image_folder.py data/fashion-mnist data/fashion_jpg --size 288 --n 20000
"""
from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from upsample_images import resize_uint8  # noqa: E402

from genlab.data.formats import read_image_dataset  # noqa: E402


def _write(job):
    from PIL import Image
    out, names, images, quality = job
    for name, img in zip(names, images):
        Image.fromarray(img).save(out / name, quality=quality)
    return len(names)


def make_folder(src, out, size: int, n: int = 0, quality: int = 90, workers: int = 0, chunk: int = 500) -> int:
    out = Path(out)
    if out.exists():
        raise SystemExit(f"{out} exists: pick another --out")
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
        written = sum(pool.map(_write, jobs))
    print(f"wrote {written} JPEG files ({size}x{size}, quality {quality}) in {len(classes)} class folders under {out}")
    return written


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", help="a prepared image folder (genlab data prepare ...)")
    ap.add_argument("out", help="the class folder to write (must not exist)")
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--n", type=int, default=0, help="the first N images (0: all)")
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--workers", type=int, default=0, help="processes (0: one per core)")
    a = ap.parse_args(argv)
    make_folder(a.src, a.out, a.size, a.n, a.quality, a.workers)


if __name__ == "__main__":
    main()
