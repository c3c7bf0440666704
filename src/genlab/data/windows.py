"""Training windows: W = context + horizon frames (and their actions) inside one episode. The uint8 frames live on
the device when they fit, and a batch is one index gather there (no host copy, no per-frame loop)."""
from __future__ import annotations

import functools
import time

import numpy as np
import torch

from genlab.config.fields import F, Keys
from genlab.core.errors import GenlabError
from genlab.data.datasets import PathKeys, dataset_registry
from genlab.data.episodes import Episodes, check_action_count, check_actions, read_episodes
from genlab.data.loader import IndexStream, StreamPosition, gather
from genlab.data.pixels import to_model


def valid_starts(starts: np.ndarray, total: int, window: int) -> np.ndarray:
    """Every s such that frames s .. s+window-1 belong to one episode."""
    ends = np.append(starts[1:], total)
    parts = [np.arange(a, b - window + 1) for a, b in zip(starts, ends) if b - a >= window]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def spaced_starts(eps: Episodes, window: int, n: int) -> np.ndarray:
    """The first frames of n evenly spaced windows (deterministic) of `window` frames, each inside one episode."""
    starts = valid_starts(eps.starts, len(eps.frames), window)
    return starts[np.linspace(0, len(starts) - 1, min(n, len(starts))).round().astype(np.int64)] if len(starts) else starts


def spaced_windows(eps: Episodes, window: int, n: int, device):
    """n evenly spaced windows (deterministic) of `window` frames from the given episodes: (frames float
    [n, window, C, H, W] in [-1, 1], actions [n, window(, D)]), or (None, None) if no episode is long enough."""
    pick = spaced_starts(eps, window, n)
    if len(pick) == 0:
        return None, None
    idx = pick[:, None] + np.arange(window)
    frames = to_model(torch.from_numpy(np.asarray(eps.frames[idx.reshape(-1)])).to(device))
    frames = frames.view(*idx.shape, *frames.shape[1:])
    return frames, torch.from_numpy(np.asarray(eps.actions)[idx]).to(device)


class WindowLoader(StreamPosition):
    """Yields {"frames": float [B, W, C, H, W] in [-1, 1], "actions": long [B, W] or float [B, W, D]}."""

    def __init__(self, eps: Episodes, window: int, batch_size: int, device, seed=0, rank=0, world=1,
                 on_device="auto", pin_memory="auto"):
        self.eps, self.window = eps, window
        self.starts = valid_starts(eps.starts, len(eps.frames), window)
        if len(self.starts) == 0:
            raise GenlabError(f"no episode is {window} frames long (data.context_frames + data.horizon); "
                              f"shorten them or collect longer episodes")
        self.setup(IndexStream(len(self.starts), seed), batch_size, device, rank, world, eps.frames.nbytes, on_device,
                   pin_memory)
        self.offsets = torch.arange(window, device=self.device)
        self.actions = torch.from_numpy(np.asarray(eps.actions)).to(self.device)
        self.starts_t = torch.from_numpy(self.starts).to(self.device)
        if self.resident:
            self.frames = self.to_resident(eps.frames)

    def next(self) -> dict:
        t0 = time.perf_counter()
        k = self.take_rank_slice()
        if self.resident:
            s = self.starts_t[torch.from_numpy(k).to(self.device, non_blocking=True)]
            idx = s[:, None] + self.offsets  # [B, W]
            u8 = self.frames[idx]
        else:  # host gather from the memmap in file order, then one transfer
            idx_np = self.starts[k][:, None] + np.arange(self.window)
            buf = gather(self.eps.frames, idx_np.reshape(-1))
            u8 = self.to_device(torch.from_numpy(buf.reshape(idx_np.shape + buf.shape[1:])))
            idx = torch.from_numpy(idx_np).to(self.device, non_blocking=True)
        self.wait_time += time.perf_counter() - t0
        return {"frames": to_model(u8), "actions": self.actions[idx]}


class EpisodeData:
    """The training split of an episode folder, and its held-out episodes (the last `heldout` fraction)."""

    def __init__(self, cfg_data):
        eps, where = read_episodes(cfg_data.path), f"data.path '{cfg_data.path}'"
        # before a model is built: finite actions, and ids that fit the model meta.json describes (an id past
        # num_actions would fail inside the action embedding at step 0)
        check_actions(eps.actions, where)
        if eps.discrete:
            if eps.num_actions < 1:
                raise GenlabError(f"{where}: meta.json gives no num_actions (>= 1) for its discrete actions")
            check_action_count(eps.actions, eps.num_actions, where)
        E = len(eps.starts)
        n_val = int(round(E * cfg_data.heldout)) if E > 1 else 0
        n_val = min(max(n_val, 1 if cfg_data.heldout > 0 and E > 1 else 0), E - 1)
        self.all, self.n_val = eps, n_val
        self.val = eps if n_val == 0 else eps.select(np.arange(E - n_val, E))  # one episode only: eval on it too
        self.context, self.horizon = cfg_data.context_frames, cfg_data.horizon
        f = eps.frames
        if f.shape[1] != f.shape[2]:
            raise GenlabError(f"world models need square frames, got {f.shape[1]}x{f.shape[2]}")
        self.spec = {"kind": "episodes", "image_size": int(f.shape[1]), "channels": int(f.shape[3]),
                     "num_actions": eps.num_actions, "action_dim": eps.action_dim, "context": self.context,
                     "horizon": self.horizon, "action_meanings": eps.meta.get("action_meanings"),
                     "num_classes": 0, "path": str(cfg_data.path), "batch_keys": ("frames", "actions")}

    @functools.cached_property
    def train(self) -> Episodes:
        # built on first use: sampling and evaluation need only the held-out episodes
        E = len(self.all.starts)
        return self.all if self.n_val == 0 else self.all.select(np.arange(E - self.n_val))

    def __len__(self):
        return len(self.train.frames)

    def make_loader(self, cfg_data, batch_size, device, seed, rank, world):
        return WindowLoader(self.train, self.context + self.horizon, batch_size, device, seed, rank, world,
                            cfg_data.on_device, cfg_data.pin_memory)


class EpisodeKeys(Keys, section="data"):
    context_frames: int = F(4, "episodes: L past frames the world model conditions on", ge=1)
    horizon: int = F(8, "episodes: frames after the context in a training window (the largest closed-loop horizon)", ge=1)
    heldout: float = F(0.1, "episodes: fraction of episodes (the last ones) held out for evaluation", ge=0, lt=1)


@dataset_registry.register("episodes", "game/robot episodes (frames + actions) written by `genlab data collect|import` (data.path)",
                           kind="episodes", keys=(PathKeys, EpisodeKeys), needs_path=True)
def episodes(cfg_data):
    return EpisodeData(cfg_data)
