"""Batch loaders: seeded, resumable, rank-sharded, normalised on the device; the whole state is one integer (`pos`),
a position in per-epoch seeded permutations (docs/data.md)."""
from __future__ import annotations

import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from genlab.data.pixels import to_model

RESIDENT_LIMIT_BYTES = 4 << 30  # datasets below this live on the device as uint8 when on_device=auto


class IndexStream:
    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.pos = n, seed, 0
        self._epoch, self._perm = -1, None

    def _perm_for(self, epoch):
        if epoch != self._epoch:
            self._epoch = epoch
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._perm

    def take(self, k: int) -> np.ndarray:
        out = np.empty(k, dtype=np.int64)
        filled = 0
        while filled < k:
            epoch, off = divmod(self.pos, self.n)
            m = min(k - filled, self.n - off)
            out[filled:filled + m] = self._perm_for(epoch)[off:off + m]
            filled += m
            self.pos += m
        return out

    @property
    def epoch(self) -> float:
        return self.pos / self.n


def gather(a, idx: np.ndarray) -> np.ndarray:
    """a[idx] as a new array, read from a memmap in file order and put back in batch order."""
    order = np.argsort(idx)
    out = np.empty((len(idx),) + a.shape[1:], dtype=a.dtype)
    out[order] = a[idx[order]]
    return out


class StreamPosition:
    """The resumable part every loader shares: a position in `self.stream` (IndexStream or RandomStarts); each rank
    takes its slice of one global draw, so the order does not depend on the number of ranks."""

    def setup(self, stream, batch_size, device, rank, world, nbytes, on_device, pin_memory, limit=RESIDENT_LIMIT_BYTES):
        """The fields every loader has; resident: the data lives on the device (on_device=yes, or auto and it fits)."""
        self.stream, self.batch_size, self.device = stream, batch_size, torch.device(device)
        self.rank, self.world, self.wait_time = rank, world, 0.0
        self.resident = on_device == "yes" or (on_device == "auto" and nbytes <= limit)
        self.pin = self.device.type == "cuda" and pin_memory != "no"

    def to_resident(self, a) -> torch.Tensor:
        return torch.from_numpy(np.array(a)).to(self.device)  # a copy: memmaps are read-only

    def state_dict(self):
        return {"pos": self.stream.pos}

    def load_state_dict(self, state):
        self.stream.pos = int(state["pos"])

    @property
    def epoch(self):
        return self.stream.epoch

    def take_rank_slice(self) -> np.ndarray:
        k = self.stream.take(self.batch_size * self.world)
        return k[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """A host batch to the device, through pinned memory when self.pin."""
        return (t.pin_memory() if self.pin else t).to(self.device, non_blocking=True)

    def close(self):
        pass


class Prefetching(StreamPosition):
    """StreamPosition with host batches (`self._gather(rank slice)`) gathered in `workers` threads `prefetch` batches
    ahead of use; batches requested ahead but not yet consumed go back to the stream, so resume is exact."""

    def start_prefetch(self, prefetch: int, workers: int):
        self.prefetch, self.workers, self._pool, self._futures = prefetch, workers, None, deque()

    def state_dict(self):
        return {"pos": self.stream.pos - len(self._futures) * self.batch_size * self.world}

    def load_state_dict(self, state):
        self._drain()
        super().load_state_dict(state)

    def _drain(self):
        for f in self._futures:
            f.result()
        self.stream.pos -= len(self._futures) * self.batch_size * self.world
        self._futures.clear()

    def _host_batch(self):
        if self.prefetch < 1:
            return self._gather(self.take_rank_slice())
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.workers)
        while len(self._futures) < self.prefetch:
            self._futures.append(self._pool.submit(self._gather, self.take_rank_slice()))
        return self._futures.popleft().result()

    def close(self):
        self._drain()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


class ImageLoader(Prefetching):
    """Yields {"image": float [B,C,H,W] in [-1,1], "label": long [B]} on `device`. A subclass names other arrays of
    the data in `fields` (batch key -> attribute) and post-processes in `finish`."""

    fields = {"image": "images", "label": "labels"}
    sized = ("images",)  # the arrays whose size decides residency

    def __init__(self, data, batch_size: int, device, seed: int = 0, rank: int = 0, world: int = 1,
                 on_device: str = "auto", prefetch: int = 2, pin_memory: str = "auto", hflip: bool = False):
        self.data, self.hflip = data, hflip
        nbytes = sum(getattr(data, a).nbytes for a in self.sized)
        self.setup(IndexStream(len(data), seed), batch_size, device, rank, world, nbytes, on_device, pin_memory)
        self.start_prefetch(max(1, prefetch), workers=min(4, max(1, prefetch)))
        self._flip_gen = torch.Generator(device="cpu").manual_seed(seed + 7919)
        self.arrays = [getattr(data, a) for a in self.fields.values()]
        if self.resident:
            self.arrays = [self.to_resident(a) for a in self.arrays]

    # the host path: worker threads gather from the memmap into (pinned) memory ahead of use
    def _gather(self, idx):
        out = [torch.from_numpy(gather(a, idx)) for a in self.arrays]
        return [t.pin_memory() for t in out] if self.pin else out

    def next(self) -> dict:
        t0 = time.perf_counter()
        if self.resident:
            idx = torch.from_numpy(self.take_rank_slice()).to(self.device, non_blocking=True)
            out = [a[idx] for a in self.arrays]
        else:
            out = [t.to(self.device, non_blocking=True) for t in self._host_batch()]
        self.wait_time += time.perf_counter() - t0
        return self.finish(dict(zip(self.fields, out)))

    def finish(self, batch: dict) -> dict:
        x = to_model(batch["image"])
        if self.hflip:
            flip = (torch.rand(x.shape[0], generator=self._flip_gen) < 0.5).to(self.device)
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        return {"image": x, "label": batch["label"].long()}


def build_loader(data, cfg_data, batch_size, device, seed, rank=0, world=1):
    if hasattr(data, "make_loader"):  # data with its own batches (episode windows, teacher pairs)
        return data.make_loader(cfg_data, batch_size, device, seed, rank, world)
    if data.spec.get("kind") == "image":
        return ImageLoader(data, batch_size, device, seed=seed, rank=rank, world=world,
                           on_device=cfg_data.on_device, prefetch=cfg_data.prefetch,
                           pin_memory=cfg_data.pin_memory, hflip=cfg_data.hflip)
    raise ValueError(f"no loader for data of kind {data.spec.get('kind')!r}")
