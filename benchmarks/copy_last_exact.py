"""Where copy-last is exact on the moving pixels: per rollout step, how many of the held-out windows the world
evaluation scores (eval/rollouts.py: the same spaced windows, the same moving-pixel mask) have copy-last's frame equal
to the real one on every pixel that moved, and copy-last's mean moving-pixel PSNR there. An exact window scores 106 dB
(the 1e-10 MSE floor), so a few of them decide a step's mean: on Pong a periodic rally does it at step 35.

    genlab data collect atari --game Pong --frames 50000 --policy sticky --size 64 --workers 2 --out data/pong64
    python benchmarks/copy_last_exact.py pong_world data.path=data/pong64 [--horizon 64] [--min 2]
"""
from __future__ import annotations

import argparse

import torch
from common import REPO  # noqa: F401 - puts src/ on sys.path

from genlab.config.tree import load_config
from genlab.core.tables import markdown_table
from genlab.data import build_dataset
from genlab.data.windows import spaced_windows
from genlab.eval.rollouts import masked_psnr, moving_mask


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("preset")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--horizon", type=int, default=64)
    ap.add_argument("--min", type=int, default=2, help="list the steps with at least this many exact windows")
    args = ap.parse_args()
    cfg = load_config(args.preset, args.overrides)
    L = cfg.data.context_frames
    frames, _ = spaced_windows(build_dataset(cfg.data).val, L + args.horizon, cfg.eval.world_rollouts, "cpu")
    last, real = frames[:, L - 1], frames[:, L:]
    prev = torch.cat([last[:, None], real[:, :-1]], 1)
    rows = []
    for k in range(args.horizon):
        mask = moving_mask(real[:, k], prev[:, k])
        exact = (mask.any((1, 2)) & ((last == real[:, k]).all(1) | ~mask).all((1, 2))).sum().item()
        if exact >= args.min:
            rows.append([k + 1, f"{exact} of {len(frames)}", f"{torch.nanmean(masked_psnr(last, real[:, k], mask)).item():.2f} dB"])
    print(f"{args.preset}: {len(frames)} held-out windows of {L} + {args.horizon} frames\n")
    print(markdown_table(["step", "windows where copy-last is exact on the moving pixels", "copy-last moving PSNR (mean)"],
                         rows, "rrr"))


if __name__ == "__main__":
    main()
