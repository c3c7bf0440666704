"""The episode format: one folder of memory-mapped arrays holding many episodes back to back (frames, actions,
rewards, terminations, episode_starts, meta.json; docs/world.md). Alignment: actions[t] is taken after observing
frames[t] and frames[t+1] is its result; the action on an episode's last frame is never a training input.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from genlab.core.errors import GenlabError
from genlab.data.formats import atomic_folder

FORMAT = "genlab-episodes"


@dataclass
class Episodes:
    frames: np.ndarray            # uint8 [T, H, W, C] (memmap)
    actions: np.ndarray           # int64 [T] or float32 [T, D]
    rewards: np.ndarray
    terminations: np.ndarray
    starts: np.ndarray            # int64 [E]
    meta: dict = field(default_factory=dict)

    @property
    def ends(self) -> np.ndarray:
        return np.append(self.starts[1:], len(self.frames))

    @property
    def discrete(self) -> bool:
        return self.actions.ndim == 1

    @property
    def num_actions(self) -> int:
        return int(self.meta.get("num_actions", 0)) if self.discrete else 0

    @property
    def action_dim(self) -> int:
        return 0 if self.discrete else int(self.actions.shape[1])

    def episode_ids(self) -> np.ndarray:  # the episode index of every frame
        return np.searchsorted(self.starts, np.arange(len(self.frames)), side="right") - 1

    def select(self, episodes) -> "Episodes":
        """A copy holding only the given episodes (in memory; used for held-out splits)."""
        episodes = np.asarray(episodes, dtype=np.int64)
        s, e = self.starts[episodes], self.ends[episodes]
        idx = np.concatenate([np.arange(a, b) for a, b in zip(s, e)]) if len(episodes) else np.zeros(0, np.int64)
        return Episodes(np.asarray(self.frames[idx]), self.actions[idx], self.rewards[idx], self.terminations[idx],
                        np.concatenate([[0], np.cumsum(e - s)[:-1]]).astype(np.int64), dict(self.meta))


def check_out_folder(out, flag: str = "--out") -> Path:
    """An episode folder's destination, checked before any work: a new or empty folder whose nearest existing
    parent is a writable folder."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GenlabError(f"{flag} '{out}' {'is not empty' if out.is_dir() else 'is a file'}; pick a new {flag}")
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise GenlabError(f"{flag} '{out}' cannot be created: '{parent}' is not a writable folder")
    return out


def write_episodes(out, frames, actions, rewards=None, terminations=None, starts=None, meta=None) -> Path:
    """Validate everything, then write an atomic folder (formats.atomic_folder): a failure leaves nothing behind."""
    out = check_out_folder(out)
    frames = np.asarray(frames)
    T = len(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4:
        raise GenlabError(f"frames must be uint8 [T, H, W, C], got {frames.dtype} {frames.shape}")
    actions = np.asarray(actions)
    if actions.ndim not in (1, 2):
        raise GenlabError(f"actions must be [T] (discrete ids) or [T, D] (vectors), got shape {actions.shape}")
    check_actions(actions, "actions")
    actions = actions.astype(np.int64) if actions.ndim == 1 else actions.astype(np.float32)
    rewards = np.zeros(T, np.float32) if rewards is None else np.asarray(rewards, np.float32)
    terminations = np.zeros(T, bool) if terminations is None else np.asarray(terminations, bool)
    starts = np.zeros(1, np.int64) if starts is None else np.asarray(starts, np.int64)
    check_lengths(T, actions, rewards, terminations, starts)
    meta = dict(meta or {})
    meta.update({"format": FORMAT, "version": 1, "frames": T, "episodes": len(starts),
                 "height": frames.shape[1], "width": frames.shape[2], "channels": frames.shape[3],
                 "action_kind": "discrete" if actions.ndim == 1 else "continuous"})
    if actions.ndim == 1:
        meta.setdefault("num_actions", int(actions.max()) + 1 if T else 0)
        check_action_count(actions, meta["num_actions"], "actions")
    else:
        meta["action_dim"] = int(actions.shape[1])
    with atomic_folder(out) as tmp:
        for name, arr in (("frames", frames), ("actions", actions), ("rewards", rewards),
                          ("terminations", terminations), ("episode_starts", starts)):
            np.save(tmp / f"{name}.npy", arr)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    return out


def check_lengths(T, actions, rewards, terminations, starts):
    for name, arr in (("actions", actions), ("rewards", rewards), ("terminations", terminations)):
        if len(arr) != T:
            raise GenlabError(f"{name} has {len(arr)} entries but there are {T} frames; one per frame is required")
    if len(starts) == 0 or starts[0] != 0 or np.any(np.diff(starts) <= 0) or starts[-1] >= max(T, 1):
        raise GenlabError("episode_starts must be ascending frame indices starting at 0")


def check_actions(actions: np.ndarray, where: str) -> None:
    """Every action finite (a NaN row turns the alignment check and training into NaN) and every discrete id >= 0."""
    if actions.dtype.kind == "f":
        bad = ~np.isfinite(actions.reshape(len(actions), -1)).all(1)
        if bad.any():
            raise GenlabError(f"{where}: {int(bad.sum())} of {len(actions)} action rows are not finite (NaN or inf), the "
                              f"first at row {int(np.argmax(bad))}; every action must be a finite number")
    if actions.ndim == 1 and len(actions) and actions.min() < 0:
        raise GenlabError(f"{where}: action id {actions.min():g} at row {int(np.argmin(actions))} is negative; "
                          "discrete actions are ids 0..N-1")


def check_action_count(actions: np.ndarray, num_actions: int, where: str) -> None:
    """Every discrete id below num_actions (the size of the model's action embedding)."""
    top = int(actions.max()) if len(actions) else -1
    if top >= num_actions:
        raise GenlabError(f"{where}: action ids go up to {top} but the model's action count (num_actions in meta.json) "
                          f"is {num_actions}; set num_actions >= {top + 1} there or remap the ids to 0..{num_actions - 1}")


def _frames_path(folder: Path) -> Path:
    """frames.npy, unpacked once from frames.npy.gz (how pre-collected data travels small)."""
    p = folder / "frames.npy"
    if p.exists():
        return p
    gz = folder / "frames.npy.gz"
    if not gz.exists():
        raise GenlabError(f"'{folder}' holds no frames.npy: not an episode folder (make one with `genlab data collect` or `import`)")
    target = p if os.access(folder, os.W_OK) else \
        Path(os.environ.get("GENLAB_CACHE", Path.home() / ".cache" / "genlab")) / f"frames-{abs(hash(str(folder.resolve())))}.npy"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        with gzip.open(gz, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 24)
        tmp.rename(target)
    return target


def read_episodes(folder) -> Episodes:
    folder = Path(folder)
    if not (folder / "meta.json").exists():
        raise GenlabError(f"'{folder}' has no meta.json: not an episode folder (make one with `genlab data collect` or `import`)")
    meta = json.loads((folder / "meta.json").read_text())
    if meta.get("format") != FORMAT:
        raise GenlabError(f"'{folder}/meta.json' is not a {FORMAT} folder")
    frames = np.load(_frames_path(folder), mmap_mode="r")
    ep = Episodes(frames, np.load(folder / "actions.npy"), np.load(folder / "rewards.npy"),
                  np.load(folder / "terminations.npy"), np.load(folder / "episode_starts.npy"), meta)
    check_lengths(len(frames), ep.actions, ep.rewards, ep.terminations, ep.starts)
    return ep
