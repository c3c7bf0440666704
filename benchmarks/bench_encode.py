"""How fast does `genlab data encode` run the SD-VAE encoder? Issue 35's target: >= 1,000 256x256 images/s per H100.

A diffusers AutoencoderKL with SD 1.x's VAE config (`SD_VAE`; factor 8: 256x256x3 -> 32x32x4) and random weights (the
speed does not depend on them) encodes N images (random, or --source resized to --size) with genlab's own encode
(`encode_dataset`, what `genlab data encode` calls) after a warm-up of a few batches. img/s is meta.json's `encode`
cost: source images per second, each encoded once per flip variant. `err` is the largest |latent - fp32 latent| of the
same images over the latents' std (the stored float16 alone gives ~1e-3).

    python benchmarks/bench_encode.py --device cuda --precision fp32,tf32,bf16 --flip both
    python benchmarks/bench_encode.py --device cpu --n 8 --size 64 --batch-size 4 --small     # a check on a CPU
"""
from __future__ import annotations

import argparse
import itertools
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from common import device_name
from image_sets import resize_uint8

from genlab.core.tables import markdown_table
from genlab.data.encode import encode_dataset
from genlab.data.formats import read_image_dataset, write_image_dataset

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
    return write_image_dataset(folder, images, labels, classes, source=f"bench_encode {source or 'random'} {size}px")


MODES = {"plain": {}, "channels_last": {"channels_last": True}, "compile": {"compile": True},
         "channels_last+compile": {"channels_last": True, "compile": True}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2048, help="images encoded per setting")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--source", default=None, help="a prepared image set, resized to --size (default: random pixels)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", default="fp32,bf16", help="comma list of encode precisions (fp32, tf32, bf16, fp16)")
    ap.add_argument("--flip", default="both", choices=("both", "on", "off"), help="flip variants stored: on = 2, off = 1")
    ap.add_argument("--modes", default="plain", help="comma list of encoder modes: plain, channels_last, compile, "
                                                     "channels_last+compile (`genlab data encode --channels-last --compile`)")
    ap.add_argument("--warmup", type=int, default=2, help="batches encoded first, untimed (cuDNN picks its kernels)")
    ap.add_argument("--small", action="store_true", help="a narrow VAE of the same layout (CPU checks)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    a = ap.parse_args(argv)
    precisions = [p.strip() for p in a.precision.split(",") if p.strip()]
    flips = {"both": [True, False], "on": [True], "off": [False]}[a.flip]
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"--modes: {', '.join(bad)} not among {', '.join(MODES)}")
    work = Path(tempfile.mkdtemp(prefix="bench_encode_"))
    rows = []
    try:
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
    finally:
        shutil.rmtree(work, ignore_errors=True)
    cfg = "small VAE (--small)" if a.small else "SD 1.x VAE (random weights)"
    print(f"genlab data encode, {cfg}, {a.size}x{a.size}x3 -> latents {rows[0]['latent_shape']}, {a.n} images "
          f"({a.source or 'random pixels'}), {device_name(a.device)}, torch {torch.__version__}\n")
    print(markdown_table(["precision", "mode", "flip variants", "batch", "img/s", "encoder passes/s", "s", "err vs fp32"],
                         [[r["precision"], r["mode"], r["variants"], r["batch_size"], f"{r['images_per_s']:.1f}",
                           f"{r['encodes_per_s']:.1f}", f"{r['seconds']:.2f}",
                           "-" if r["err_vs_fp32"] is None else f"{r['err_vs_fp32']:.1e}"] for r in rows]))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
