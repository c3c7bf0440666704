"""Which held-out Pong windows hold a new serve: per rollout step k, of the windows that the world evaluation scores
(eval/rollouts.py: the same spaced windows) and whose real ball is visible at step k (the windows issue 53's ball
targets count), how many saw a point end (a reward) between the last context frame and step k, so that the ball at
step k is a new serve rather than the ball of the context frames.

    genlab data collect atari --game Pong --frames 50000 --policy sticky --size 64 --workers 14 --out data/pong64
    python benchmarks/ball_events.py pong_world data.path=data/pong64 [--horizon 64] [--steps 8,16,32]
"""
from __future__ import annotations

import argparse

import numpy as np
from common import REPO  # noqa: F401 - puts src/ on sys.path

from genlab.config.tree import load_config
from genlab.core.tables import markdown_table
from genlab.data import build_dataset
from genlab.data.windows import spaced_starts
from genlab.eval.objects import object_positions
from genlab.eval.rollouts import points_before


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("preset")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--horizon", type=int, default=32)
    ap.add_argument("--steps", default="8,16,32")
    args = ap.parse_args()
    cfg = load_config(args.preset, args.overrides)
    L, H = cfg.data.context_frames, args.horizon
    eps = build_dataset(cfg.data).val
    idx = spaced_starts(eps, L + H, cfg.eval.world_rollouts)[:, None] + np.arange(L + H)
    frames = np.asarray(eps.frames[idx.reshape(-1)])
    seen = ~np.isnan(object_positions(frames, eps.meta.get("game", "Pong"))["ball"][:, 0]).reshape(idx.shape)
    served = points_before(np.asarray(eps.rewards)[idx], L)
    rows = []
    for k in (int(s) for s in args.steps.split(",")):
        visible, point = seen[:, L + k - 1], served[:, k - 1]  # step 1 is frame L, the first generated one
        rows.append([k, int(visible.sum()), int((visible & point).sum()), f"{(visible & point).sum() / max(1, visible.sum()):.0%}"])
    print(f"{args.preset}: {len(idx)} held-out windows of {L} + {H} frames\n")
    print(markdown_table(["step", "windows with the ball visible", "of them, a point ended before the step", "share"], rows, "rrrr"))


if __name__ == "__main__":
    main()
