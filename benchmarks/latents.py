"""The latents suite's data side (issue 35): the encode speed of `genlab data encode`, and prepared image sets made from
another one without a download.

    python benchmarks/latents.py encode --device cuda --precision fp32,tf32,bf16 --flip both
    python benchmarks/latents.py encode --device cpu --n 8 --size 64 --batch-size 4 --small     # a check on a CPU
    python benchmarks/latents.py upsample data/fashion-mnist data/fashion128 --size 128
    python benchmarks/latents.py jpeg-folder data/fashion-mnist data/fashion_jpg --size 288 --n 20000

`encode` (SD 1.x's VAE config, random weights, through genlab's own `encode_dataset`; img/s and `err` as in
docs/latents.md, "GPU benchmark suite") and `upsample` (bicubic, as a new prepared set): docs/latents.md. `jpeg-folder`:
an ImageNet-style class folder of RGB JPEG files (`OUT/<class>/<i>.jpg`) at SIZE x SIZE, so the file-decoding path
(`genlab data prepare shards`, then `data.name=shards`) is measured on real files.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from common import device_name

from genlab.core.tables import markdown_table
from genlab.data.encode import encode_dataset
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


# Stable Diffusion 1.x's VAE (CompVis/stable-diffusion-v1-4 vae/config.json; SD 2.x's is the same)
SD_VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
              up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
              act_fn="silu", latent_channels=4, norm_num_groups=32, sample_size=512, scaling_factor=0.18215)
SMALL = dict(SD_VAE, block_out_channels=(32, 32, 64, 64), layers_per_block=1)  # same code path, for CPU checks


def save_vae(folder: Path, config: dict, seed: int = 0) -> Path:
    from diffusers import AutoencoderKL
    torch.manual_seed(seed)
    AutoencoderKL(**config).save_pretrained(folder, safe_serialization=True)
    return folder


def write_images(folder: Path, n: int, size: int, source: str | None, seed: int = 0) -> Path:
    if source:
        src = read_image_dataset(source)
        k = min(n, len(src))
        images, labels, classes = resize_uint8(src.images[:k], size, channels=3), np.asarray(src.labels[:k]), src.classes
    else:
        images = np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)
        labels, classes = np.zeros(n, dtype=np.int64), ["random"]
    return write_image_dataset(folder, images, labels, classes, source=f"benchmarks/latents.py {source or 'random'} {size}px")


MODES = {"plain": {}, "channels_last": {"channels_last": True}, "compile": {"compile": True},
         "channels_last+compile": {"channels_last": True, "compile": True}}


def encode_speed(a):
    precisions = [p.strip() for p in a.precision.split(",") if p.strip()]
    flips = {"both": [True, False], "on": [True], "off": [False]}[a.flip]
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_encode_", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        vae = f"diffusers:{save_vae(work / 'vae', SMALL if a.small else SD_VAE)}"
        images = write_images(work / "images", a.n, a.size, a.source)
        warm = write_images(work / "warm", a.warmup * a.batch_size, a.size, None)
        reference = {}
        for flip, mode, prec in itertools.product(flips, modes, precisions):
            opts = MODES[mode]
            encode_dataset(warm, vae, work / "warm_lat", batch_size=a.batch_size, flip=flip, device=a.device,
                           precision=prec, force=True, **opts)
            out = encode_dataset(images, vae, work / f"lat_{prec}_{flip}_{mode}", batch_size=a.batch_size,
                                 flip=flip, device=a.device, precision=prec, **opts)
            meta = json.loads((out / "meta.json").read_text())
            lat = np.load(out / "latents.npy").astype(np.float32)
            if prec == "fp32" and mode == "plain":
                reference[flip] = lat
            err = (float(np.abs(lat - reference[flip]).max() / meta["latent_std"]) if flip in reference else None)
            cost = meta["encode"]
            rows.append({"precision": prec, "mode": mode, **{k: cost[k] for k in ("variants", "batch_size", "images", "seconds",
                         "images_per_s", "device")}, "encodes_per_s": round(cost["images_per_s"] * cost["variants"], 1),
                         "latent_shape": meta["shape"], "err_vs_fp32": err})
            shutil.rmtree(out)
    cfg = "small VAE (--small)" if a.small else "SD 1.x VAE (random weights)"
    print(f"genlab data encode, {cfg}, {a.size}x{a.size}x3 -> latents {rows[0]['latent_shape']}, {a.n} images "
          f"({a.source or 'random pixels'}), {device_name(a.device)}, torch {torch.__version__}\n")
    print(markdown_table(["precision", "mode", "flip variants", "batch", "img/s", "encoder passes/s", "s", "err vs fp32"],
                         [[r["precision"], r["mode"], r["variants"], r["batch_size"], f"{r['images_per_s']:.1f}",
                           f"{r['encodes_per_s']:.1f}", f"{r['seconds']:.2f}",
                           "-" if r["err_vs_fp32"] is None else f"{r['err_vs_fp32']:.1e}"] for r in rows]))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    enc, up, jp = sub.add_parser("encode"), sub.add_parser("upsample"), sub.add_parser("jpeg-folder")
    enc.add_argument("--n", type=int, default=2048, help="images encoded per setting")
    enc.add_argument("--size", type=int, default=256)
    enc.add_argument("--source", default=None, help="a prepared image set, resized to --size (default: random pixels)")
    enc.add_argument("--batch-size", type=int, default=64)
    enc.add_argument("--device", default="cuda")
    enc.add_argument("--precision", default="fp32,bf16", help="comma list of encode precisions (fp32, tf32, bf16, fp16)")
    enc.add_argument("--flip", default="both", choices=("both", "on", "off"), help="flip variants stored: on = 2, off = 1")
    enc.add_argument("--modes", default="plain", help="comma list of encoder modes: plain, channels_last, compile, "
                     "channels_last+compile (`genlab data encode --channels-last --compile`)")
    enc.add_argument("--warmup", type=int, default=2, help="batches encoded first, untimed (cuDNN picks its kernels)")
    enc.add_argument("--small", action="store_true", help="a narrow VAE of the same layout (CPU checks)")
    enc.add_argument("--json", default=None, help="also write the rows as JSON here")
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
    if a.what == "encode" and (bad := [m.strip() for m in a.modes.split(",") if m.strip() not in ("", *MODES)]):
        enc.error(f"--modes: {', '.join(bad)} not among {', '.join(MODES)}")
    if a.what == "encode":
        encode_speed(a)
    elif a.what == "upsample":
        print(f"wrote {upsample_dataset(a.src, a.out, a.size, a.channels, a.n, a.device)}")
    else:
        jpeg_folder(a.src, a.out, a.size, a.n, a.quality, a.workers)


if __name__ == "__main__":
    main()
