"""What the action margin means on a first-person game: the margin (true against shuffled actions) of a hand-made
"world model" that knows only that an action shifts the view sideways, scored on an episode folder with the same
per-frame PSNR the world evaluation uses (eval/rollouts.py). Per action it finds the horizontal shift of the view
(the rows above the HUD) that best explains the next frame; the model moves the view by that shift, fills the
uncovered strip with the old pixels and copies everything else. The shuffled action of a transition is the previous
transition's, as the evaluation takes another window's actions.

    genlab data collect vizdoom --scenario my_way_home --frames 6000 --size 64 --workers 2 --out doom64
    python benchmarks/view_shift_margin.py doom64 [--view-rows 52] [--max-shift 10]
"""
from __future__ import annotations

import argparse

import numpy as np
from common import REPO  # noqa: F401 - puts src/ on sys.path

from genlab.data.episodes import read_episodes


def shift_view(frame: np.ndarray, dx: int, rows: int) -> np.ndarray:
    out = frame.copy()
    if dx > 0:
        out[:rows, dx:] = frame[:rows, :-dx]
    elif dx < 0:
        out[:rows, :dx] = frame[:rows, -dx:]
    return out


def psnr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    mse = ((a - b) ** 2).reshape(len(a), -1).mean(1)
    return 10 * np.log10(4.0 / np.maximum(mse, 1e-10))  # frames in [-1, 1], as eval/rollouts.py: psnr


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("episodes")
    p.add_argument("--view-rows", type=int, default=52, help="rows above the HUD (52 of 64 for ViZDoom at 64x64)")
    p.add_argument("--max-shift", type=int, default=10)
    a = p.parse_args(argv)
    eps = read_episodes(a.episodes)
    frames = np.asarray(eps.frames).astype(np.float32) / 127.5 - 1
    actions = np.asarray(eps.actions)
    if not eps.discrete:
        raise SystemExit("error: discrete actions only (an episode folder of action ids)")
    starts = set(np.asarray(eps.starts).tolist())
    idx = np.array([t for t in range(len(frames) - 1) if t + 1 not in starts])
    names = eps.meta.get("action_meanings") or [str(i) for i in range(int(actions.max()) + 1)]
    best = {}
    print("| action | transitions | best shift (px) | gain over copy-last on those transitions |")
    print("| --- | ---: | ---: | ---: |")
    for act in np.unique(actions[idx]):
        ii = idx[actions[idx] == act]
        errs = [np.mean([((shift_view(frames[t], dx, a.view_rows) - frames[t + 1]) ** 2).mean() for t in ii])
                for dx in range(-a.max_shift, a.max_shift + 1)]
        best[int(act)] = int(np.argmin(errs)) - a.max_shift
        print(f"| {names[act]} | {len(ii)} | {best[int(act)]} | {10 * np.log10(errs[a.max_shift] / min(errs)):+.2f} dB |")
    shuffled = np.roll(idx, 1)
    for k in (1, 2):  # k steps ahead: the k actions applied in turn
        ok = np.array([all(t + j not in starts for j in range(1, k + 1)) and t + k < len(frames) for t in idx])
        ts, us = idx[ok], shuffled[ok]

        def predict(src, acts_from):
            out = []
            for t, u in zip(src, acts_from):
                f = frames[t]
                for j in range(k):
                    f = shift_view(f, best.get(int(actions[u + j]), 0), a.view_rows)
                out.append(f)
            return np.stack(out)
        real = frames[ts + k]
        true, shuf, copy = psnr(predict(ts, ts), real), psnr(predict(ts, us), real), psnr(frames[ts], real)
        print(f"\n{k} step(s) ahead, {len(ts)} transitions: copy-last {copy.mean():.2f} dB, view-shift model "
              f"{true.mean():.2f} dB, with shuffled actions {shuf.mean():.2f} dB: action margin {true.mean() - shuf.mean():+.2f} dB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
