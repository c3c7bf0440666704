"""Latent datasets (docs/latents.md: format and guarantees). `genlab data encode DATASET --vae SPEC --out DIR`:
autoencoder latents of a prepared image set, computed once, resumable chunk by chunk in DIR.partial and shared out
across torchrun ranks. data.name=latents reads such a folder: image methods train on latents as images; the spec
carries the codec and pixel shape, evaluation compares with the source pixels.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from genlab.core import progress
from genlab.core.errors import GenlabError
from genlab.data.datasets import ImageKeys, PathKeys, dataset_registry
from genlab.data.formats import array_checksum, read_image_dataset, verifying
from genlab.data.loader import IndexStream, StreamPosition, gather
from genlab.data.pixels import to_model
from genlab.data.shards import read_shards
from genlab.nn.autoencoders import check_autoencoder, load_autoencoder
from genlab.runtime.parallel import DistInfo, init_distributed, leave_distributed, resolve_device
from genlab.runtime.switches import build_precision

FORMAT = "genlab-latents-v1"
DTYPES = {"float16": np.float16, "float32": np.float32}
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def read_source(path):
    """A prepared image set: a shard folder (index.json) or an image-array folder (meta.json)."""
    p = Path(path)
    if (p / "index.json").exists():
        return read_shards(p)
    if (p / "meta.json").exists():
        return read_image_dataset(p)
    raise GenlabError(f"no prepared image dataset at '{p}' (neither meta.json nor index.json); make one with "
                      f"`genlab data prepare`")


def rank_chunks(todo, rank: int, world: int) -> list[int]:
    """Rank `rank`'s share of the chunks still to encode: contiguous blocks (sequential memmap writes), disjoint across
    ranks, together exactly `todo`."""
    return [int(c) for c in np.array_split(np.asarray(list(todo), dtype=np.int64), world)[rank]]


def _check_out(out: Path, force: bool):
    """A finished latents folder is replaced only with --force; any other folder with files never (--force must not
    delete a prepared image set named by mistake)."""
    try:
        fmt = json.loads((out / "meta.json").read_text()).get("format") if (out / "meta.json").exists() else None
    except (OSError, ValueError, AttributeError):
        fmt = "unreadable"
    if fmt is not None and fmt != FORMAT:
        raise GenlabError(f"{out} holds something else ({fmt}), not encoded latents; choose another --out")
    if (out / "meta.json").exists() and not force:
        raise GenlabError(f"{out} already holds encoded latents; choose another --out or pass --force to replace them")
    if out.exists() and not (out / "meta.json").exists() and any(out.iterdir()):
        raise GenlabError(f"{out} exists and is not a latents folder; choose another --out")


def encode_dataset(source, vae: str, out, batch_size: int = 64, flip: bool = True, device="auto",
                   dtype: str = "float16", force: bool = False, precision: str = "fp32",
                   channels_last: bool = False, compile: bool = False) -> Path:
    """Encode the prepared image set `source` with the autoencoder `vae` into `out`. `precision`: a plain
    train.precision entry (float8 converts trained linears; `auto` would tie the latents to the device); fp32 is IEEE,
    convolutions too. `channels_last`: NHWC weights and inputs (other kernels, same function)."""
    if dtype not in DTYPES:
        raise GenlabError(f"--dtype {dtype!r} is not a latent dtype; valid choices: {', '.join(DTYPES)}")
    if precision not in PRECISIONS:
        raise GenlabError(f"--precision {precision!r} is not an encode precision; valid choices: {', '.join(PRECISIONS)}")
    if batch_size < 1:
        raise GenlabError(f"--batch-size must be >= 1, got {batch_size}")
    check_autoencoder(vae)
    out = Path(out)
    _check_out(out, force)
    data = read_source(source)
    info, dev = init_distributed(device) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else \
        (DistInfo(), resolve_device(device, key="--device"))
    rank, world = info.rank, info.world
    barrier = dist.barrier if info.enabled else (lambda: None)
    prec = build_precision(precision, dev)
    codec, encode = (_compiled_encoder if compile else _encoder)(vae, str(dev), channels_last)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    N, H, W, C = data.images.shape
    c, h, w = codec.latent_shape(C, H, W)
    V = 2 if flip else 1
    n_chunks = -(-N // batch_size)
    # the source: enough to find it again and to notice that it changed
    record = {"path": str(Path(source).resolve()), "format": data.meta.get("format"), "sha256": data.meta.get("sha256"),
              "shape": [int(H), int(W), int(C)], "num_samples": int(N)}
    job = {"format": FORMAT, "codec": codec.describe(), "source": record, "num_samples": int(N),
           "variants": V, "dtype": dtype, "shape": [c, h, w], "batch_size": int(batch_size),
           "precision": precision}
    # kernels (not the function) change with these: a resume must use the same, but older folders lack the keys
    job.update({k: True for k, on in (("channels_last", channels_last), ("compile", compile)) if on})
    tmp = out.with_name(out.name + ".partial")
    if (tmp / "job.json").exists() and not force:
        before = json.loads((tmp / "job.json").read_text())
        if before != job:
            diff = sorted(k for k in job if before.get(k) != job[k])
            raise GenlabError(f"{tmp} holds an unfinished encoding with other settings ({', '.join(diff)}); rerun "
                              f"the same command to resume it, or pass --force to start over")
    barrier()
    if rank == 0 and (force or not (tmp / "job.json").exists()):
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        np.lib.format.open_memmap(tmp / "latents.npy", mode="w+", dtype=DTYPES[dtype], shape=(N, V, c, h, w)).flush()
        np.save(tmp / "labels.npy", np.asarray(data.labels, dtype=np.int64))
        np.save(tmp / "done.npy", np.zeros(n_chunks, dtype=np.uint8))
        (tmp / "job.json").write_text(json.dumps(job, indent=1))  # last: its presence means the folder is whole
    barrier()
    done = np.load(tmp / "done.npy", mmap_mode="r+")
    mine = rank_chunks(np.flatnonzero(done == 0), rank, world)
    barrier()  # every rank has read the same `done` before any rank marks a chunk
    lat = np.load(tmp / "latents.npy", mmap_mode="r+")
    t0, encoded = time.perf_counter(), 0
    total = sum(min(N, (k + 1) * batch_size) - k * batch_size for k in mine)
    with progress.enabled(progress.is_on() and rank == 0), \
            progress.Task(f"encoding {total} of {N} images with {vae}", total=total, unit="img") as task:
        for k in mine:
            s, e = k * batch_size, min(N, (k + 1) * batch_size)
            x = to_model(torch.from_numpy(np.array(data.images[s:e])).to(dev))  # a copy: memmaps are read-only
            if V == 2:
                x = torch.cat([x, x.flip(-1)])
            with prec.autocast(dev):
                z = encode(x.contiguous(memory_format=layout))
            z = z.float().view(V, e - s, c, h, w).transpose(0, 1)
            lat[s:e] = z.cpu().numpy().astype(DTYPES[dtype])
            flush_rows(lat, s, e)
            done[k] = 1  # only after the chunk's latents are on disk
            flush_rows(done, k, k + 1)
            encoded += e - s
            task.update(e - s)
    seconds = time.perf_counter() - t0
    encoded, seconds = _gather_cost(encoded, seconds, info, dev)
    barrier()
    if rank == 0:
        del lat, done
        cost = {"images": encoded, "seconds": round(seconds, 3), "images_per_s": round(encoded / max(seconds, 1e-9), 1),
                "variants": V, "batch_size": int(batch_size), "device": str(dev), "world": world,
                "precision": precision, "channels_last": channels_last, "compile": compile}
        _finalise(tmp, out, job, data, cost)
        print(f"encoded {encoded} images ({V} variant{'s' if V > 1 else ''} each) in {seconds:.1f} s: "
              f"{cost['images_per_s']:.1f} img/s on {world} x {dev}", file=sys.stderr)
    leave_distributed(info)  # every rank waits for rank 0's rename
    return out


def _encoder(vae: str, device: str, channels_last: bool):
    """(codec, its encode function), the codec loaded now (it may have changed on disk since the last call)."""
    codec = load_autoencoder(vae, torch.device(device))
    if channels_last:
        codec = codec.to(memory_format=torch.channels_last)
    return codec, codec.encode


@functools.lru_cache(maxsize=2)
def _compiled_encoder(vae: str, device: str, channels_last: bool):
    """The same, compiled, and kept for the process: a second encode with these settings (a benchmark's warm-up,
    then its timed run) reuses the compiled graph instead of compiling again."""
    codec, encode = _encoder(vae, device, channels_last)
    return codec, torch.compile(encode)


def flush_rows(mm: np.memmap, s: int, e: int):
    """msync rows s:e of a memmap only: a whole-map flush walks every page of the file at each chunk (a fifth of the
    encode time of MNIST with unshuffle:2 on the CPU, and growing with the file)."""
    import mmap
    row = mm.strides[0]
    lead = mm.offset % mmap.ALLOCATIONGRANULARITY  # where the array starts inside numpy's mapping
    lo = lead + s * row
    lo_page = lo - lo % mmap.PAGESIZE
    mm._mmap.flush(lo_page, lead + e * row - lo_page)


def _gather_cost(encoded, seconds, info, dev):
    """All ranks' images and the slowest rank's time (the wall time of the whole encode)."""
    if not info.enabled:
        return encoded, seconds
    t = torch.tensor([float(encoded), seconds], dtype=torch.float64, device=dev)
    n, s = t[:1].clone(), t[1:].clone()
    dist.all_reduce(n)
    dist.all_reduce(s, op=dist.ReduceOp.MAX)
    return int(n.item()), float(s.item())


def latent_stats(lat: np.ndarray, labels: np.ndarray, rows: int = 1024) -> dict:
    """Mean/std per latent channel and overall (float64, over every stored variant) and the sha256 of (latents,
    labels) as formats.array_checksum computes it, in one streaming pass over the memmap."""
    V, c = lat.shape[1], lat.shape[2]
    s1, s2 = np.zeros(c), np.zeros(c)
    h = hashlib.sha256(str(lat.dtype).encode() + str(lat.shape).encode())
    for i in range(0, len(lat), rows):
        block = np.ascontiguousarray(lat[i:i + rows])
        h.update(block.data)
        f = block.astype(np.float64).reshape(len(block) * V, c, -1)
        s1 += f.sum(axis=(0, 2))
        s2 += np.square(f).sum(axis=(0, 2))
    labels = np.ascontiguousarray(labels)
    h.update(str(labels.dtype).encode() + str(labels.shape).encode())
    h.update(labels.data)
    n = len(lat) * V * int(np.prod(lat.shape[3:]))
    mean, sq = s1 / n, s2 / n
    return {"latent_mean": float(mean.mean()), "latent_std": float(np.sqrt(max(sq.mean() - mean.mean() ** 2, 0.0))),
            "channel_mean": [float(v) for v in mean], "channel_std": [float(v) for v in np.sqrt(np.maximum(sq - mean ** 2, 0))],
            "sha256": h.hexdigest()}


def _finalise(tmp: Path, out: Path, job: dict, data, cost: dict):
    lat = np.load(tmp / "latents.npy", mmap_mode="r")
    labels = np.load(tmp / "labels.npy")
    stats = latent_stats(lat, labels)
    meta = {**{k: v for k, v in job.items() if k != "batch_size"}, "classes": list(data.classes),
            "pixel_shape": job["source"]["shape"], **stats, "encode": cost}
    (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    for f in ("done.npy", "job.json"):
        (tmp / f).unlink()
    if out.exists():
        shutil.rmtree(out)  # --force, or an empty folder
    os.replace(tmp, out)


@dataclass
class LatentData:
    latents: np.ndarray           # float16|float32 [N, V, c, h, w], a memmap
    labels: np.ndarray            # int64 [N]
    classes: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @property
    def variants(self) -> int:
        return self.latents.shape[1]

    @property
    def spec(self) -> dict:
        N, _, c, h, _ = self.latents.shape
        return {"kind": "image", "image_size": h, "channels": c, "num_classes": len(self.classes), "num_samples": N,
                "classes": list(self.classes), "batch_keys": ("image", "label"), "codec": dict(self.meta["codec"]),
                "pixel_shape": list(self.meta["pixel_shape"])}

    def __len__(self):
        return len(self.latents)

    def make_loader(self, cfg_data, batch_size, device, seed, rank=0, world=1):
        return LatentLoader(self, batch_size, device, seed, rank, world, cfg_data.on_device, cfg_data.pin_memory,
                            cfg_data.hflip)

    def pixel_reference(self):
        """The source image set these latents were encoded from (meta.json source): what evaluation compares decoded
        samples with. A one-line GenlabError when it is gone or changed."""
        if getattr(self, "_reference", None) is None:  # read once per process (each evaluation asks)
            self._reference = read_reference(self.meta)
        return self._reference


def read_reference(meta: dict):
    src = meta.get("source") or {}
    where = src.get("path", "?")
    try:
        data = read_source(where)
    except GenlabError as e:
        raise GenlabError(f"the source images of these latents ({where}), which evaluation compares decoded samples "
                          f"with, cannot be read: {e}") from None
    if src.get("sha256") and data.meta.get("sha256") != src["sha256"]:
        raise GenlabError(f"the source images at {where} changed since they were encoded (sha256 differs from the "
                          f"latents' meta.json); re-encode them with `genlab data encode`")
    return data


class VariantStream(IndexStream):
    """The seeded sample order of IndexStream, as flat indices into latents viewed as [N * stride, c, h, w]: each
    draw's variant is drawn per epoch from (seed, epoch) beside the permutation, among the first `choices` variants."""

    def __init__(self, n: int, seed: int, stride: int, choices: int):
        super().__init__(n, seed)
        self.stride, self.choices = stride, choices
        self._vepoch, self._var = -1, None

    def _variants_for(self, epoch):
        if epoch != self._vepoch:
            self._vepoch = epoch
            self._var = np.random.default_rng([self.seed, epoch, 1]).integers(0, self.choices, self.n)
        return self._var

    def take(self, k: int) -> np.ndarray:
        pos0 = self.pos
        idx = super().take(k) * self.stride
        if self.choices > 1:
            epoch, off = np.divmod(np.arange(pos0, pos0 + k), self.n)
            for e in np.unique(epoch):
                m = epoch == e
                idx[m] += self._variants_for(int(e))[off[m]]
        return idx


class LatentLoader(StreamPosition):
    """Yields {"image": float32 latents [B, c, h, w], "label": long [B]} on `device`; the state is the stream position."""

    def __init__(self, data: LatentData, batch_size, device, seed=0, rank=0, world=1, on_device="auto",
                 pin_memory="auto", hflip=False):
        V = data.variants
        if hflip and V < 2:
            raise GenlabError(no_flip_message(data.meta.get("path", "these latents")))
        self.data, self.V = data, V
        self.setup(VariantStream(len(data), seed, stride=V, choices=V if hflip else 1), batch_size, device, rank, world,
                   data.latents.nbytes, on_device, pin_memory)
        N, _, c, h, w = data.latents.shape
        self.flat = data.latents.reshape(N * V, c, h, w)  # a view of the memmap
        if self.resident:
            self.latents = self.to_resident(self.flat)
            self.labels = self.to_resident(data.labels).long()

    def next(self) -> dict:
        t0 = time.perf_counter()
        k = self.take_rank_slice()
        if self.resident:
            idx = torch.from_numpy(k).to(self.device, non_blocking=True)
            x, y = self.latents[idx], self.labels[idx // self.V]
        else:
            x = self.to_device(torch.from_numpy(gather(self.flat, k)))
            y = self.to_device(torch.from_numpy(np.asarray(self.data.labels[k // self.V], dtype=np.int64)))
        self.wait_time += time.perf_counter() - t0
        return {"image": x.float(), "label": y}


def no_flip_message(where) -> str:
    return (f"data.hflip=true but {where} holds no flipped variants (encoded with --no-flip); set data.hflip=false "
            f"or re-encode without --no-flip")


def read_latents(path, verify: bool | None = None) -> LatentData:
    p = Path(path)
    meta = _meta(p)
    try:
        latents = np.load(p / "latents.npy", mmap_mode="r", allow_pickle=False)
        labels = np.load(p / "labels.npy", mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise GenlabError(f"latents at '{p}' are corrupt: {e}") from None
    want = (meta.get("num_samples"), meta.get("variants"), *meta.get("shape", ()))
    if latents.ndim != 5 or latents.shape != want or str(latents.dtype) != meta.get("dtype") or len(labels) != len(latents):
        raise GenlabError(f"latents at '{p}' are corrupt: latents {latents.dtype}{latents.shape}, labels {labels.shape}, "
                          f"meta.json says {meta.get('dtype')}{want}")
    if verifying(verify, latents) and array_checksum(latents, np.asarray(labels)) != meta.get("sha256"):
        raise GenlabError(f"latents at '{p}' are corrupt: checksum mismatch with meta.json")
    return LatentData(latents=latents, labels=labels, classes=meta.get("classes", []), meta={**meta, "path": str(p)})


def _meta(p: Path) -> dict:
    if not (p / "meta.json").exists():
        hint = " (an unfinished encoding is in its .partial folder: rerun the same `genlab data encode` to finish it)" \
            if p.with_name(p.name + ".partial").exists() else ""
        raise GenlabError(f"no latents at '{p}' (meta.json missing); make them with `genlab data encode`{hint}")
    try:
        meta = json.loads((p / "meta.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise GenlabError(f"latents at '{p}' are corrupt: {e}") from None
    if meta.get("format") != FORMAT:
        raise GenlabError(f"'{p}' is not a latents folder (format {meta.get('format')!r}, want {FORMAT}); make one "
                          f"with `genlab data encode`")
    return meta


def latent_shape(path) -> dict | None:
    """The model's input shape from meta.json alone (None when missing: the reader reports that)."""
    try:
        meta = _meta(Path(path))
        c, h, w = meta["shape"]
        return {"kind": "image", "image_size": int(h), "channels": int(c), "num_classes": len(meta["classes"])}
    except Exception:  # noqa: BLE001
        return None


def _check(d):
    """Before any work: square latents (the image backbones' grid), and flipped variants where data.hflip asks."""
    try:
        meta = _meta(Path(d.path))
    except GenlabError:  # not made yet: presets may name a folder encoded later; the reader reports it
        return
    c, h, w = meta["shape"]
    if h != w:
        raise GenlabError(f"latents at '{d.path}' are {h}x{w}; the image models take square inputs")
    if d.hflip and meta.get("variants", 1) < 2:
        raise GenlabError(no_flip_message(d.path))


def _check_reference(cfg):
    """Evaluation decodes samples and compares them with the source pixels: that folder must be readable before
    training or sampling starts."""
    if cfg.eval.num_samples > 0 and cfg.data.path:
        read_reference(_meta(Path(cfg.data.path)))


@dataset_registry.register("latents", "autoencoder latents written by `genlab data encode` (data.path); image methods "
                                      "train on them, samples are decoded", kind="latent",
                           keys=(PathKeys, ImageKeys), needs_path=True, shape=lambda d: latent_shape(d.path),
                           check=lambda d: _check(d), eval_check=lambda cfg: _check_reference(cfg))
def latents(cfg_data):
    return read_latents(cfg_data.path)
