"""`genlab data import episodes` (with the alignment check) and `genlab data stats`."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from genlab.data.episodes import Episodes, read_episodes, write_episodes
from genlab.errors import GenlabError

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


# -- alignment: does action t explain the change from frame t to t+1? ------------------------------
def motion_features(eps: Episodes, limit: int = 20000, strips: int = 8):
    """Per-frame object positions that survive translation: the row centroid of the foreground in each of
    `strips` vertical strips and the column centroid in each horizontal band (foreground = distance to the
    median frame). Frame-to-frame changes of these say where things moved (a paddle, a ship, the camera)."""
    T = min(len(eps.frames), limit)
    g = np.asarray(eps.frames[:T]).astype(np.float32).mean(-1)
    bg = np.median(g[np.linspace(0, T - 1, min(T, 500)).astype(np.int64)], 0)
    fg = np.abs(g - bg)
    H, W = fg.shape[1:]
    S = max(1, min(strips, H, W))
    fg = fg[:, :H - H % S, :W - W % S]
    H, W = fg.shape[1:]
    col = fg.reshape(T, H, S, W // S).sum(3)     # [T, H, S]
    row = fg.reshape(T, S, H // S, W).sum(2)     # [T, S, W]
    cy = (col * np.arange(H, dtype=np.float32)[None, :, None]).sum(1) / (col.sum(1) + 1e-3)
    cx = (row * np.arange(W, dtype=np.float32)[None, None, :]).sum(2) / (row.sum(2) + 1e-3)
    return np.concatenate([cy, cx], 1), eps.episode_ids()[:T]


def _explained(X, Y, lam=1e-3):
    """Best held-out R^2 over the columns of Y of a ridge fit Y ~ X (fit on even blocks of 25 rows, test on odd)."""
    blk = (np.arange(len(X)) // 25) % 2 == 0
    if blk.sum() < 10 or (~blk).sum() < 10:
        return 0.0
    Xa, Ya, Xb, Yb = X[blk], Y[blk], X[~blk], Y[~blk]
    mu = Ya.mean(0)
    W = np.linalg.solve(Xa.T @ Xa + lam * len(Xa) * np.eye(X.shape[1]), Xa.T @ (Ya - mu))
    sse = ((Yb - mu - Xb @ W) ** 2).sum(0)
    sst = ((Yb - Yb.mean(0)) ** 2).sum(0)
    moving = Yb.var(0) > 1e-4  # features that never change (a clock-like object) explain nothing
    return float(np.max(1 - sse[moving] / sst[moving])) if moving.any() else 0.0


def alignment_check(eps: Episodes, max_lag: int = 2, floor: float = 0.05) -> dict:
    """Held-out R^2 of the motion d_{t+k} = m[t+k+1] - m[t+k] explained by action t, for lags k in
    [-max_lag, max_lag]. Under the convention (frame t+1 follows action t) the response starts at k = 0
    (momentum may carry it to k = 1); a response at k < 0 means the action file is late (action t 'explains'
    a change before it was taken), a response only from k >= 1 on means it is early."""
    m, ep = motion_features(eps)
    T = len(m)
    d = m[1:] - m[:-1]
    acts = np.asarray(eps.actions[:T])
    if acts.ndim == 1:
        X = np.eye(max(int(acts.max()) + 1, 1), dtype=np.float64)[acts]
    else:
        X = np.concatenate([(acts - acts.mean(0)) / (acts.std(0) + 1e-6), np.ones((T, 1))], 1)
    scores = {}
    for k in range(-max_lag, max_lag + 1):
        t = np.arange(max(0, -k), T - 1 - max(0, k))
        t = t[(ep[t] == ep[t + k]) & (ep[t + k] == ep[t + k + 1])]
        scores[k] = _explained(X[t], d[t + k]) if len(t) > 20 else 0.0
    # chance level: the same fit with the actions shuffled (max over a few permutations)
    rng = np.random.default_rng(0)
    t = np.arange(T - 1)
    t = t[ep[t] == ep[t + 1]]
    chance = max(_explained(X[rng.permutation(t)], d[t]) for _ in range(8)) if len(t) > 20 else 0.0
    floor = max(floor, 2 * chance)
    best = max(scores, key=scores.get)
    top = scores[best]
    late = [k for k in scores if k < 0 and scores[k] > max(floor, 0.5 * top)]
    if top < floor:
        ok, msg = False, (f"suspicious: actions predict nothing about the next frames (best held-out R^2 {top:.3f} "
                          f"< {floor}); check that the action file belongs to these frames")
    elif late:
        ok, msg = False, (f"suspicious: actions look late by {-min(late)} frame(s): action t explains the change into "
                          f"frame t{min(late) + 1:+d} (R^2 {scores[min(late)]:.3f}), before it was taken; "
                          "the convention is: frame t+1 follows action t")
    elif scores[0] < 0.5 * top:
        first = min(k for k in scores if k > 0 and scores[k] >= 0.5 * top)
        ok, msg = False, (f"suspicious: actions look early by {first} frame(s): action t first explains the change into "
                          f"frame t+{first + 1} (R^2 {scores[first]:.3f} vs {scores[0]:.3f} for t+1)")
    else:
        ok, msg = True, f"aligned: action t explains the change into frame t+1 (held-out R^2 {scores[0]:.3f}), nothing before it"
    return {"ok": ok, "best_lag": best, "scores": scores, "chance": chance, "message": msg}


# -- import -------------------------------------------------------------------------------------------
def _load_frames(src: Path, size: int):
    from PIL import Image
    if src.suffix == ".npy":
        fr = np.load(src)
        if fr.ndim == 3:
            fr = fr[..., None]
        if fr.dtype != np.uint8:
            raise GenlabError(f"{src}: frames must be uint8 [T, H, W, C], got {fr.dtype}")
    elif src.is_dir():
        files = sorted(p for p in src.iterdir() if p.suffix.lower() in IMAGE_EXTS)
        if not files:
            raise GenlabError(f"no images ({', '.join(IMAGE_EXTS)}) in {src}")
        imgs = []
        for p in files:
            im = Image.open(p).convert("RGB")
            if size:
                im = im.resize((size, size), Image.BOX)
            imgs.append(np.asarray(im, np.uint8))
        fr = np.stack(imgs)
    else:
        raise GenlabError(f"--frames must be a folder of images or a .npy file, got {src}")
    return fr


def _load_table(path: Path):
    if path.suffix == ".npy":
        return np.load(path)
    try:
        return np.loadtxt(path, delimiter="," if path.suffix == ".csv" else None, ndmin=1)
    except ValueError as e:
        raise GenlabError(f"{path}: cannot read a numeric table ({e})") from e


def import_episodes(frames, actions, out, starts=None, size: int = 0, log=print) -> dict:
    fr = _load_frames(Path(frames), size)
    act = _load_table(Path(actions))
    if act.ndim == 2 and act.shape[1] == 1:
        act = act[:, 0]
    discrete = act.ndim == 1 and np.all(np.mod(act, 1) == 0) and act.min() >= 0
    act = act.astype(np.int64) if discrete else (act[:, None] if act.ndim == 1 else act).astype(np.float32)
    if len(act) == len(fr) - 1:  # actions between frames: the last frame's action is never used
        log("note: one action fewer than frames; the last frame gets a zero action (it predicts nothing)")
        act = np.concatenate([act, np.zeros_like(act[:1])])
    if len(act) != len(fr):
        raise GenlabError(f"{len(act)} actions for {len(fr)} frames: one action per frame (or one fewer) is required")
    st = np.asarray(_load_table(Path(starts)), np.int64).ravel() if starts else None
    meta = {"source": f"imported from {frames} + {actions}"}
    path = write_episodes(out, fr, act, starts=st, meta=meta)
    report = alignment_check(read_episodes(path))
    log(f"alignment check: {report['message']}")
    log("  held-out R^2 by lag: " + ", ".join(f"{k:+d}: {v:.4f}" for k, v in report["scores"].items()))
    return {"path": path, **report}


# -- stats ----------------------------------------------------------------------------------------------
def episode_stats(folder, sheet=None, log=print) -> dict:
    eps = read_episodes(folder)
    T, E = len(eps.frames), len(eps.starts)
    lens = eps.ends - eps.starts
    out = {"frames": T, "episodes": E, "episode_len_min": int(lens.min()), "episode_len_mean": float(lens.mean()),
           "episode_len_max": int(lens.max()), "frame_shape": list(eps.frames.shape[1:])}
    lines = [f"{folder}: {T} frames, {E} episodes (length {lens.min()}..{lens.max()}, mean {lens.mean():.0f}), "
             f"frames {eps.frames.shape[1]}x{eps.frames.shape[2]}x{eps.frames.shape[3]} uint8"]
    if eps.discrete:
        A = max(eps.num_actions, int(eps.actions.max()) + 1)
        names = eps.meta.get("action_meanings") or [str(i) for i in range(A)]
        counts = np.bincount(eps.actions, minlength=A)
        share = counts / max(T, 1)
        out["action_counts"] = dict(zip(names, counts.tolist()))
        out["never_seen"] = [n for n, c in zip(names, counts) if c == 0]
        out["rare"] = [n for n, s, c in zip(names, share, counts) if 0 < c and s < 0.25 / A]
        lines.append("action histogram:")
        lines += [f"  {n:<12} {c:>8} {100 * s:5.1f}% {'#' * int(round(40 * s))}" for n, c, s in zip(names, counts, share)]
    else:
        a = eps.actions
        thr = 0.1 * (a.std(0) + 1e-8)
        pos, neg = (a > thr).mean(0), (a < -thr).mean(0)
        out["direction_share"] = {f"dim{d}{s}": float(v) for d in range(a.shape[1]) for s, v in (("+", pos[d]), ("-", neg[d]))}
        out["never_seen"] = [k for k, v in out["direction_share"].items() if v == 0]
        out["rare"] = [k for k, v in out["direction_share"].items() if 0 < v < 0.02]
        lines.append("control directions (share of frames moving that way):")
        lines += [f"  dim {d}: +{100 * pos[d]:5.1f}%  -{100 * neg[d]:5.1f}%  range [{a[:, d].min():.2f}, {a[:, d].max():.2f}]"
                  for d in range(a.shape[1])]
    lines.append(f"coverage: never seen: {', '.join(out['never_seen']) or 'none'}; rare (<1/4 of uniform or <2%): "
                 f"{', '.join(out['rare']) or 'none'}")
    out["contact_sheet"] = str(contact_sheet(eps, sheet or Path(folder) / "contact_sheet.png"))
    lines.append(f"contact sheet: {out['contact_sheet']}")
    log("\n".join(lines))
    return out


def contact_sheet(eps: Episodes, path, n: int = 64, cols: int = 8):
    from PIL import Image
    idx = np.linspace(0, len(eps.frames) - 1, min(n, len(eps.frames))).round().astype(np.int64)
    fr = np.asarray(eps.frames[idx])
    if fr.shape[-1] == 1:
        fr = np.repeat(fr, 3, -1)
    H, W = fr.shape[1:3]
    scale = max(1, 96 // H)
    rows = (len(fr) + cols - 1) // cols
    sheet = Image.new("RGB", (cols * (W * scale + 2), rows * (H * scale + 2)), (0, 0, 0))
    for i, f in enumerate(fr):
        sheet.paste(Image.fromarray(f).resize((W * scale, H * scale), Image.NEAREST),
                    ((i % cols) * (W * scale + 2), (i // cols) * (H * scale + 2)))
    path = Path(path)
    try:
        sheet.save(path)
    except OSError:  # a read-only data folder: write beside the working directory instead
        path = Path.cwd() / path.name
        sheet.save(path)
    return path
