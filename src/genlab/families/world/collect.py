"""Collect game frames with gymnasium + ale-py in parallel worker processes into one episode folder (policies:
docs/world.md). Sticky actions are off, so a frame is a function of the past frames and the recorded action.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time

import numpy as np

from genlab.core.errors import GenlabError
from genlab.data.episodes import check_out_folder, write_episodes
from genlab.eval.objects import object_positions

POLICIES = ("random", "sticky", "tracker")
# tracker: the paddle each game moves, the axis it moves on, and the actions that move it down / up that axis
TRACKED = {"Pong": ("player", 1, {"less": "RIGHT", "more": "LEFT"}),      # Pong's RIGHT moves the paddle up
           "Breakout": ("paddle", 0, {"less": "LEFT", "more": "RIGHT"})}
TRACK_DEADBAND = 3.0  # pixels (full resolution) within which the paddle waits


def tracker_action(obs: np.ndarray, game: str, meanings: list[str]) -> int:
    """Move the paddle toward the ball (full-resolution frame); FIRE when no ball is in play (a new serve)."""
    paddle, axis, moves = TRACKED[game]
    pos = object_positions(obs[None], game)
    ball, own = pos["ball"][0], pos[paddle][0]
    if np.isnan(ball[0]) or np.isnan(own[0]):
        return meanings.index("FIRE")
    d = ball[axis] - own[axis]
    if abs(d) <= TRACK_DEADBAND:
        return meanings.index("NOOP")
    return meanings.index(moves["more" if d > 0 else "less"])


def _make_env(game: str):
    try:
        import ale_py
        import gymnasium as gym
    except ImportError as e:
        raise GenlabError("collecting Atari frames needs gymnasium and ale-py: pip install gymnasium==1.4.0 ale-py==0.12.1") from e
    gym.register_envs(ale_py)
    names = sorted(k[4:-3] for k in gym.registry if k.startswith("ALE/") and k.endswith("-v5"))
    if game not in names:
        close = [n for n in names if n.lower().startswith(game.lower()[:3])] or names[:10]
        raise GenlabError(f"unknown ALE game '{game}'; e.g. {', '.join(close)} ({len(names)} games, see gymnasium ALE docs)")
    return gym.make(f"ALE/{game}-v5", repeat_action_probability=0.0, frameskip=4)


def resize_frame(obs: np.ndarray, size: int, channels: int) -> np.ndarray:
    from PIL import Image
    img = Image.fromarray(obs)
    if channels == 1:
        img = img.convert("L")
    # box filter: thin objects (Pong's ball) stay visible as a dimmer blob instead of vanishing
    arr = np.asarray(img.resize((size, size), Image.BOX), dtype=np.uint8)
    return arr[..., None] if arr.ndim == 2 else arr


def _worker(args):
    game, frames, policy, size, channels, seed, max_episode, stick, explore = args
    env = _make_env(game)
    rng = np.random.default_rng(seed)
    n_act = env.action_space.n
    meanings = env.unwrapped.get_action_meanings()
    exploring = False
    out_f, out_a, out_r, out_t, starts = [], [], [], [], []
    obs, _ = env.reset(seed=seed)
    t_ep, action = 0, 0
    starts.append(0)
    while len(out_f) < frames:
        if policy == "tracker":  # explore in held stretches (mean 1 / (1 - stick) frames), else track the ball
            exploring = rng.random() < (stick if exploring else explore * (1 - stick) / max(1 - explore, 1e-9))
            action = (action if rng.random() < stick else int(rng.integers(n_act))) if exploring else \
                tracker_action(obs, game, meanings)
        elif policy == "random" or rng.random() > stick:
            action = int(rng.integers(n_act))
        out_f.append(resize_frame(obs, size, channels))
        out_a.append(action)
        obs, reward, term, trunc, _ = env.step(action)
        out_r.append(reward)
        t_ep += 1
        done = term or trunc or t_ep >= max_episode
        out_t.append(bool(term))
        if done and len(out_f) == frames - 1:
            # a reset would start a one-frame episode: this one ends on its real last frame instead (one over max_episode)
            out_f.append(resize_frame(obs, size, channels))
            out_a.append(action)
            out_r.append(0.0)
            out_t[-1:] = [False, bool(term)]
        elif done and len(out_f) < frames:
            obs, _ = env.reset()
            t_ep = 0
            starts.append(len(out_f))
    env.close()
    return (np.stack(out_f), np.asarray(out_a), np.asarray(out_r, np.float32), np.asarray(out_t), np.asarray(starts),
            meanings)


def run_workers(worker, frames: int, workers: int, seed: int, job):
    """Split `frames` over `workers` processes (0 = one per core, up to frames/2000); returns their parts (whole
    episodes) and the episode starts of the concatenation."""
    workers = workers or min(os.cpu_count() or 1, max(1, frames // 2000))
    workers = min(workers, frames // 2)  # every worker's share is >= 2 frames: no one-frame episode
    per = [frames // workers + (i < frames % workers) for i in range(workers)]
    jobs = [job(n, seed * 1009 + i) for i, n in enumerate(per) if n > 0]
    if len(jobs) == 1:
        parts = [worker(jobs[0])]
    else:
        with mp.get_context("spawn").Pool(len(jobs)) as pool:
            parts = pool.map(worker, jobs)
    offs = np.cumsum([0] + [len(p[0]) for p in parts])
    return parts, np.concatenate([p[4] + o for p, o in zip(parts, offs)])


def collect_atari(game: str, frames: int, out, policy: str = "random", size: int = 64, channels: int = 3,
                  workers: int = 0, seed: int = 0, max_episode: int = 1000, stick: float = 0.8, explore: float = 0.25,
                  log=print):
    if policy not in POLICIES:
        raise GenlabError(f"unknown policy '{policy}'; valid choices: {', '.join(POLICIES)}")
    if policy == "tracker" and game not in TRACKED:
        raise GenlabError(f"the tracker policy plays {', '.join(TRACKED)}, not '{game}'; valid choices for {game}: random, sticky")
    if not 0 <= explore < 1:
        raise GenlabError(f"--explore must be in [0, 1) (the tracker's share of random actions), got {explore}")
    if channels not in (1, 3):
        raise GenlabError(f"--channels must be 1 (grey) or 3 (RGB), got {channels}")
    if frames < 2 or size < 8:
        raise GenlabError("--frames must be >= 2 and --size >= 8")
    if max_episode < 2:  # 0 or 1 would end every episode after one frame: nothing to learn from
        raise GenlabError(f"--max-episode must be >= 2 (frames per episode), got {max_episode}")
    if workers < 0:
        raise GenlabError(f"--workers must be >= 0 (0 = one per core), got {workers}")
    check_out_folder(out)  # before the minutes of collection, not after
    _make_env(game).close()  # fail on a bad name before spawning workers
    t0 = time.perf_counter()
    parts, starts = run_workers(_worker, frames, workers, seed,
                                lambda n, s: (game, n, policy, size, channels, s, max_episode, stick, explore))
    meta = {"source": f"ale-py {game} v5 (frameskip 4, no sticky actions)", "game": game, "policy": policy,
            **({"explore": explore} if policy == "tracker" else {}),
            "num_actions": len(parts[0][5]), "action_meanings": parts[0][5], "seed": seed}
    path = write_episodes(out, np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                          np.concatenate([p[2] for p in parts]), np.concatenate([p[3] for p in parts]), starts, meta)
    dt = time.perf_counter() - t0
    log(f"collected {frames} frames of {game} ({len(starts)} episodes) in {dt:.1f} s with {len(parts)} worker(s): "
        f"{frames / dt:.0f} frames/s")
    return path
