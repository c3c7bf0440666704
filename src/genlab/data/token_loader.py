"""Random-window loader for flat token streams (nanoGPT style): each sample is seq_len+1 consecutive tokens from a
random start, split into inputs x and next-token targets y. Starts come from IndexStream (every start once per epoch)
or, for streams too large to permute, a per-batch seeded draw: either way one integer of state and exact resume.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from genlab.data.loader import IndexStream, Prefetching

PERMUTE_LIMIT = 1 << 24          # window starts above this are drawn iid per batch (a permutation would be too big)
RESIDENT_LIMIT_BYTES = 1 << 30   # token streams below this (as int32) live on the device when on_device=auto


class RandomStarts(IndexStream):
    """IndexStream without a permutation: the batch at position p draws from rng(seed, p)."""

    def take(self, k: int) -> np.ndarray:
        out = np.random.default_rng([self.seed, self.pos]).integers(0, self.n, size=k)
        self.pos += k
        return out


def window_starts(n_tokens: int, seq_len: int, seed: int):
    n = n_tokens - seq_len  # starts s with s + seq_len + 1 <= n_tokens
    return IndexStream(n, seed) if n <= PERMUTE_LIMIT else RandomStarts(n, seed)


class TokenLoader(Prefetching):
    """Yields {"x": long [B, T], "y": long [B, T]} on `device`, y = x shifted by one token. Small streams live on the
    device; others stay a memmap, a batch reading only its B windows in a background thread ahead of use."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch_size: int, device, seed: int = 0, rank: int = 0,
                 world: int = 1, on_device: str = "auto", pin_memory: str = "auto", prefetch: int = 2):
        self.tokens, self.T = tokens, seq_len
        self.setup(window_starts(len(tokens), seq_len, seed), batch_size, device, rank, world, 4 * len(tokens), on_device,
                   pin_memory, limit=RESIDENT_LIMIT_BYTES)
        self.start_prefetch(prefetch, workers=1)
        if self.resident:
            self.offsets = torch.arange(seq_len + 1, device=self.device)
            self.dev_tokens = torch.from_numpy(np.asarray(tokens).astype(np.int32)).to(self.device)
        else:
            self.offsets = np.arange(seq_len + 1)

    def _gather(self, starts: np.ndarray) -> torch.Tensor:
        win = torch.from_numpy(np.asarray(self.tokens[starts[:, None] + self.offsets], dtype=np.int64))
        return win.pin_memory() if self.pin else win

    def next(self) -> dict:
        t0 = time.perf_counter()
        if self.resident:
            starts = torch.from_numpy(self.take_rank_slice())
            win = self.dev_tokens[starts.to(self.device, non_blocking=True)[:, None] + self.offsets].long()
        else:
            win = self._host_batch().to(self.device, non_blocking=True)
        self.wait_time += time.perf_counter() - t0
        return {"x": win[:, :-1], "y": win[:, 1:]}
