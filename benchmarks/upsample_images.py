"""A prepared image set resized to SIZE x SIZE (bicubic, rounded to uint8), written as a new prepared set: the real
images of a small set at a resolution where an autoencoder has something to compress (Fashion-MNIST 28 -> 128 gives
32x32x4 latents at factor 4). `genlab data prepare` resizes only when it decodes image files.

    python benchmarks/upsample_images.py data/fashion-mnist data/fashion128 --size 128
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from genlab.data.formats import read_image_dataset, write_image_dataset  # noqa: E402


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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", help="a prepared image-array folder (genlab data prepare)")
    ap.add_argument("out")
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--channels", type=int, default=0, help="3: grey images repeated to RGB (default: keep)")
    ap.add_argument("--n", type=int, default=0, help="only the first N images (default: all)")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args(argv)
    print(f"wrote {upsample_dataset(a.src, a.out, a.size, a.channels, a.n, a.device)}")


if __name__ == "__main__":
    main()
