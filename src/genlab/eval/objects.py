"""Where the ball and the paddles are in an Atari frame, found by colour at any frame size: a box-resized pixel is read
as background + a * (object colour - background), and an object's position is the a-weighted centroid of its pixels
inside its band of rows (colours and rows: ALE v5 RGB frames, rows as fractions of 210)."""
from __future__ import annotations

import numpy as np

# game -> background colour and objects: name -> (RGB, (first row, end row) as fractions of the frame height)
GAMES = {
    "Pong": {"background": (144, 72, 17),
             "objects": {"ball": ((236, 236, 236), (34 / 210, 194 / 210)),
                         "player": ((92, 186, 92), (34 / 210, 194 / 210)),
                         "opponent": ((213, 130, 74), (34 / 210, 194 / 210))}},
    "Breakout": {"background": (0, 0, 0),
                 "objects": {"ball": ((200, 72, 72), (93 / 210, 188 / 210)),  # below the bricks, above the paddle
                             "paddle": ((200, 72, 72), (189 / 210, 194 / 210))},
                 # the playfield between the side walls, whose lower ends are painted in the paddle's red
                 "cols": (8 / 160, 152 / 160),
                 # colours that are no tracked object but compete for pixels: the grey walls and the bricks
                 "others": [(142, 142, 142), (180, 122, 48), (162, 162, 42), (72, 160, 72), (66, 158, 130), (66, 72, 200),
                            (198, 108, 58)]},
}
# Breakout's six rows of 18 bricks (rows 57-93 of 210, columns 8-152 of 160 between the grey walls; a brick is 6 rows by 8
# columns): what the ball removes
BRICKS = {"Breakout": {"rows": (57 / 210, 93 / 210), "cols": (8 / 160, 152 / 160), "brick": (6 / 210, 8 / 160),
                       "colours": [(200, 72, 72), (198, 108, 58), (180, 122, 48), (162, 162, 42), (72, 160, 72),
                                   (66, 72, 200)]}}
# per game, the RGB weights that map every brick colour to ~1 (least squares: within 7%)
BRICK_WEIGHTS = {g: np.linalg.lstsq(np.asarray(b["colours"], np.float64), np.ones(len(b["colours"])), rcond=None)[0]
                 for g, b in BRICKS.items()}
MIN_FRACTION = 0.2   # a ball box-averaged into a 64x64 cell covers ~30% of it
MAX_RESIDUAL = 0.25  # of the object's colour distance from the background


def object_masses(frames: np.ndarray, game: str) -> dict[str, np.ndarray]:
    """frames uint8 [N, H, W, 3] -> {object: fraction map [N, H, W]} (0 outside its rows or not its colour)."""
    spec = GAMES[game]
    bg = np.asarray(spec["background"], np.float32)
    d = frames.astype(np.float32) - bg
    H, W = frames.shape[1:3]
    names = list(spec["objects"])
    colours = [spec["objects"][n][0] for n in names] + spec.get("others", [])
    us = [np.asarray(c, np.float32) - bg for c in colours]
    fracs = [d @ u / (u @ u) for u in us]
    resids = np.stack([np.linalg.norm(d - a[..., None] * u, axis=-1) / np.linalg.norm(u) for a, u in zip(fracs, us)])
    out = {}
    for k, name in enumerate(names):
        (r0, r1), (c0, c1) = spec["objects"][name][1], spec.get("cols", (0.0, 1.0))
        # the colour that explains the pixel best claims it (an orange paddle is not a dim ball, a grey wall not a red
        # ball); objects of one colour share pixels and their rows tell them apart
        ok = resids[k] <= resids.min(0)
        m = np.where(ok & (fracs[k] >= MIN_FRACTION) & (resids[k] <= MAX_RESIDUAL), np.minimum(fracs[k], 1.0), 0.0)
        # only the rows and columns wholly inside the band
        rows, cols = slice(int(np.ceil(r0 * H)), int(np.floor(r1 * H))), slice(int(np.ceil(c0 * W)), int(np.floor(c1 * W)))
        out[name] = np.zeros_like(m)
        out[name][:, rows, cols] = m[:, rows, cols]
    return out


def object_positions(frames: np.ndarray, game: str) -> dict[str, np.ndarray]:
    """frames uint8 [N, H, W, 3] -> {object: [N, 2] (x, y) centroid in pixels, NaN where the object is not seen}."""
    res = {}
    for name, m in object_masses(frames, game).items():
        total = m.sum((1, 2))
        ys, xs = np.arange(m.shape[1], dtype=np.float32), np.arange(m.shape[2], dtype=np.float32)
        with np.errstate(invalid="ignore", divide="ignore"):
            x = (m.sum(1) * xs).sum(1) / total
            y = (m.sum(2) * ys).sum(1) / total
        seen = total >= MIN_FRACTION * 1.5
        res[name] = np.where(seen[:, None], np.stack([x, y], 1), np.nan)
    return res


def position_errors(real: np.ndarray, generated: np.ndarray, game: str) -> dict[str, dict]:
    """Per object: the distance (pixels) between its position in real and generated frames [N, H, W, 3] (NaN where
    the real frame does not show it, inf where the generated frame lost it), and the counts of both."""
    pr, pg = object_positions(real, game), object_positions(generated, game)
    out = {}
    for name in pr:
        seen = ~np.isnan(pr[name][:, 0])
        lost = seen & np.isnan(pg[name][:, 0])
        err = np.where(lost, np.inf, np.linalg.norm(pr[name] - pg[name], axis=1))
        out[name] = {"visible": int(seen.sum()), "lost": int(lost.sum()), "errors": np.where(seen, err, np.nan)}
    return out


def brick_mass(frames: np.ndarray, game: str) -> np.ndarray:
    """frames uint8 [N, H, W, 3] -> [N]: the bricks left, in bricks. Each pixel is weighed by the RGB weights that map
    every brick colour to ~1 (least squares: within 7%); being linear, the band's sum is the same after a box resize,
    which only averages pixels, so a partly lit cell counts its share of a brick."""
    spec = BRICKS[game]
    H, W = frames.shape[1:3]
    (r0, r1), (c0, c1) = spec["rows"], spec["cols"]
    band = frames[:, int(round(r0 * H)):int(round(r1 * H)), int(round(c0 * W)):int(round(c1 * W))]
    one = spec["brick"][0] * H * spec["brick"][1] * W
    return (band.astype(np.float64) @ BRICK_WEIGHTS[game]).sum((1, 2)) / one


def bricks_removed(last: np.ndarray, real: np.ndarray, generated: np.ndarray, game: str,
                   tracked: np.ndarray | None = None) -> dict:
    """Rollouts from context frame `last` [N, H, W, 3] against real and generated frames [N, K, H, W, 3]: per step, of the
    rollouts where the real ball has removed at least one brick by then, the share whose generated frames removed at
    least half as many; and of those where it removed none, the share whose generated frames removed one (a phantom).
    With tracked [N, K] (the generated ball near the real one), the last step's share is also split by whether the
    generated ball was still tracked at the step the real ball removed its first brick: a lost ball cannot remove it."""
    N, K = real.shape[:2]
    m0 = brick_mass(last, game)[:, None]
    gone_real = m0 - brick_mass(real.reshape(N * K, *real.shape[2:]), game).reshape(N, K)
    gone_gen = m0 - brick_mass(generated.reshape(N * K, *generated.shape[2:]), game).reshape(N, K)
    hit, none = gone_real >= 1.0, gone_real < 0.5
    kept = [float((gone_gen[hit[:, k], k] >= 0.5 * gone_real[hit[:, k], k]).mean()) if hit[:, k].any() else None
            for k in range(K)]
    phantom = [float((gone_gen[none[:, k], k] >= 1.0).mean()) if none[:, k].any() else None for k in range(K)]
    out = {"removed_share": kept, "phantom_share": phantom, "rollouts_with_removal": hit.sum(0).tolist()}
    if tracked is not None:
        at_first = tracked[np.arange(N), hit.argmax(1)]  # the step of the first removal (where there is one)
        kept_last = gone_gen[:, -1] >= 0.5 * gone_real[:, -1]
        for name, rows in (("ball_tracked", hit[:, -1] & at_first), ("ball_lost", hit[:, -1] & ~at_first)):
            out[f"removed_share_{name}"] = float(kept_last[rows].mean()) if rows.any() else None
            out[f"rollouts_{name}"] = int(rows.sum())
    return out
