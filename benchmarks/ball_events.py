"""Which held-out Pong windows hold a new serve: per rollout step k, of the windows that the world evaluation scores
(eval/rollouts.py: the same spaced windows) and whose real ball is visible at step k (the windows issue 53's ball
targets count), how many saw a point end (a reward) between the last context frame and step k, so that the ball at
step k is a new serve rather than the ball of the context frames. Then, over the whole held-out set, how long the ball
stays off the screen after a point and where the new serve appears: what a model must remember to place it.

    genlab data collect atari --game Pong --frames 50000 --policy sticky --size 64 --workers 14 --out data/pong64
    python benchmarks/ball_events.py pong_world data.path=data/pong64 [--horizon 64] [--steps 8,16,32] [--still 33,34,35]

--still K,..: per step, the share of that step's moving pixels (the real frame differs from the real frame before it,
as the evaluation counts them) that equal the last context frame: where it is high, copy-last is right on the moving
pixels by coincidence (Pong's point cycle under sticky random play brings the ball back where the context left it).
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
    ap.add_argument("--still", default="", help="steps whose moving pixels to compare with the last context frame")
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
    if args.still:
        print("\n" + still_table(frames.reshape(*idx.shape, *frames.shape[1:]), L, [int(k) for k in args.still.split(",")]))
    gaps, serves = serve_gaps(eps)
    print(f"\n{len(gaps)} points in the held-out episodes: the ball is off the screen for {np.median(gaps):g} steps after a point "
          f"(min {gaps.min()}, max {gaps.max()}; {L} context frames); the new serve appears at x {serves[:, 0].mean():.1f} ± "
          f"{serves[:, 0].std():.1f}, y {serves[:, 1].mean():.1f} ± {serves[:, 1].std():.1f} px")


def still_table(frames, L, steps):
    """Per step k: of the pixels that move at k (the real frame differs from the one before), how many equal the
    last context frame there, i.e. where copy-last is exactly right."""
    f = frames.astype(np.int16)
    rows = []
    for k in steps:
        t = L + k - 1
        moving = np.abs(f[:, t] - f[:, t - 1]).reshape(*f.shape[:1], *f.shape[2:4], -1).max(-1) > 1.5
        same = (np.abs(f[:, L - 1] - f[:, t]).reshape(moving.shape + (-1,)).max(-1) <= 1.5) & moving
        rows.append([k, int(moving.sum()), int(same.sum()), f"{same.sum() / max(1, moving.sum()):.0%}"])
    return markdown_table(["step", "moving pixels (all windows)", "equal to the last context frame", "share"], rows, "rrrr")


def serve_gaps(eps):
    """Per point (a reward) of the episodes: the steps from the ball's leaving the screen to its return, and where it
    returns (x, y)."""
    pos = object_positions(np.asarray(eps.frames), eps.meta.get("game", "Pong"))["ball"]
    seen, gaps, serves = ~np.isnan(pos[:, 0]), [], []
    ends = np.append(eps.starts[1:], len(seen))
    for t in np.nonzero(np.asarray(eps.rewards))[0]:
        end = ends[np.searchsorted(eps.starts, t, side="right") - 1]  # the serve must come in the same episode
        u = t + 1
        while u < end and seen[u]:  # the ball may still show with the point's frame
            u += 1
        v = u
        while v < end and not seen[v]:
            v += 1
        if v < end:
            gaps.append(v - u)
            serves.append(pos[v])
    return np.array(gaps), np.array(serves)


if __name__ == "__main__":
    main()
