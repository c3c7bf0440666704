"""`genlab data import episodes` (with the alignment check) and `genlab data stats`."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from genlab.core.errors import GenlabError
from genlab.data.episodes import Episodes, check_actions, check_lengths, check_out_folder, read_episodes, write_episodes

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".webp")


def motion_features(eps: Episodes, limit: int = 20000, strips: int = 8):
    """Per-frame object positions: foreground (distance to the median frame) centroids in `strips` vertical strips
    and horizontal bands; their changes say where things moved (a paddle, a ship, the camera)."""
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


def _explained_cols(X, Y, lam=1e-3):
    """Held-out R^2 of each column of Y under a ridge fit Y ~ X (fit on even blocks of 25 rows, test on odd), or
    None if there are too few rows; columns that never change (a clock-like object) are NaN: they explain nothing."""
    blk = (np.arange(len(X)) // 25) % 2 == 0
    if blk.sum() < 10 or (~blk).sum() < 10:
        return None
    Xa, Ya, Xb, Yb = X[blk], Y[blk], X[~blk], Y[~blk]
    mu = Ya.mean(0)
    W = np.linalg.solve(Xa.T @ Xa + lam * len(Xa) * np.eye(X.shape[1]), Xa.T @ (Ya - mu))
    sse = ((Yb - mu - Xb @ W) ** 2).sum(0)
    sst = ((Yb - Yb.mean(0)) ** 2).sum(0)
    moving = Yb.var(0) > 1e-4
    return np.where(moving, 1 - sse / np.where(moving, sst, 1), np.nan)


def _explained(X, Y, lam=1e-3):
    """Best held-out R^2 over the columns of Y of a ridge fit Y ~ X."""
    r2 = _explained_cols(X, Y, lam)
    return float(np.nanmax(r2)) if r2 is not None and np.isfinite(r2).any() else 0.0


def _gain(with_x, without_x) -> float:
    """Best gain in held-out R^2 (each clipped to [0, 1]) over the columns that a fit with more inputs makes."""
    if with_x is None or without_x is None:
        return 0.0
    g = np.clip(with_x, 0, 1) - np.clip(without_x, 0, 1)
    return float(np.nanmax(g)) if np.isfinite(g).any() else 0.0


def lateness(X, d, ep, max_lag: int = 2) -> dict:
    """What rows t+1 .. t+max_lag add to rows t-max_lag .. t in explaining the change d_t into frame t+1 (docs/world.md):
    the gain of all later rows, of each later row alone, and a chance level (later rows shuffled)."""
    T = len(d)
    t = np.arange(max_lag, T - max_lag)
    t = t[np.all([ep[t + j] == ep[t] for j in range(-max_lag, max_lag + 2)], 0)] if len(t) else t
    if len(t) <= 40:
        return {"gain": 0.0, "by_row": {j: 0.0 for j in range(1, max_lag + 1)}, "chance": 0.0}
    before = np.concatenate([X[t + j] for j in range(-max_lag, 1)], 1)
    later = {j: X[t + j] for j in range(1, max_lag + 1)}
    base = _explained_cols(before, d[t])
    gain = _gain(_explained_cols(np.concatenate([before, *later.values()], 1), d[t]), base)
    by_row = {j: _gain(_explained_cols(np.concatenate([before, x], 1), d[t]), base) for j, x in later.items()}
    rng = np.random.default_rng(1)
    stacked = np.concatenate(list(later.values()), 1)
    chance = max(_gain(_explained_cols(np.concatenate([before, stacked[rng.permutation(len(t))]], 1), d[t]), base)
                 for _ in range(8))
    return {"gain": gain, "by_row": by_row, "chance": chance}


def alignment_check(eps: Episodes, max_lag: int = 2, floor: float = 0.05) -> dict:
    """Held-out R^2 of the motion d_{t+k} explained by action t, for lags k in [-max_lag, max_lag]: a response only
    from k >= 1 on means the file is early; lateness is judged by `lateness`, not by k < 0 (docs/world.md)."""
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
    late = lateness(X, d, ep[:T], max_lag)
    # late by j: the furthest later row that adds at least half as much as the best one (with momentum, a file late
    # by 2 has its rows t+1 and t+2 both adding: the action before, and the action that moved it)
    by = max(j for j, g in late["by_row"].items() if g >= 0.5 * max(late["by_row"].values()))
    if top < floor:
        ok, msg = False, (f"suspicious: actions predict nothing about the next frames (best held-out R^2 {top:.3f} "
                          f"< {floor}); check that the action file belongs to these frames")
    elif late["gain"] > max(0.01, 2 * late["chance"], 0.05 * top):
        ok, msg = False, (f"suspicious: actions look late by {by} frame(s): action t+{by} explains the change into frame "
                          f"t+1 beyond actions t, t-1, ... (held-out R^2 +{late['gain']:.3f}, chance "
                          f"{late['chance']:.3f}), after it happened; the convention is: frame t+1 follows action t")
    elif scores[0] < 0.5 * top:
        first = min(k for k in scores if k > 0 and scores[k] >= 0.5 * top)
        ok, msg = False, (f"suspicious: actions look early by {first} frame(s): action t first explains the change into "
                          f"frame t+{first + 1} (R^2 {scores[first]:.3f} vs {scores[0]:.3f} for t+1)")
    else:
        ok, msg = True, (f"aligned: action t explains the change into frame t+1 (held-out R^2 {scores[0]:.3f}), later "
                         f"actions add nothing to it (+{late['gain']:.3f})")
    return {"ok": ok, "best_lag": best, "scores": scores, "late": late, "chance": chance, "message": msg}


def _load_frames(src: Path, size: int):
    from PIL import Image
    if src.suffix == ".npy":
        fr = _load_npy(src)
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


def _load_npy(path: Path):
    try:
        return np.load(path)
    except (OSError, ValueError) as e:
        raise GenlabError(f"{path}: cannot read a .npy array ({e})") from e


def _load_table(path: Path):
    if path.suffix == ".npy":
        return _load_npy(path)
    try:
        return np.loadtxt(path, delimiter="," if path.suffix == ".csv" else None, ndmin=1)
    except (OSError, ValueError) as e:
        raise GenlabError(f"{path}: cannot read a numeric table ({e})") from e


def import_episodes(frames, actions, out, starts=None, size: int = 0, log=print) -> dict:
    """Everything is read and validated, and the alignment measured, before `out` is written (atomically)."""
    check_out_folder(out)
    fr = _load_frames(Path(frames), size)
    act = _load_table(Path(actions))
    if act.dtype.kind not in "biuf" or act.ndim not in (1, 2):
        raise GenlabError(f"{actions}: actions must be numbers, one row per frame, got {act.dtype} {act.shape}")
    check_actions(act, str(actions))
    if act.ndim == 2 and act.shape[1] == 1:
        act = act[:, 0]
    discrete = act.ndim == 1 and np.all(np.mod(act, 1) == 0) and act.min() >= 0
    act = act.astype(np.int64) if discrete else (act[:, None] if act.ndim == 1 else act).astype(np.float32)
    if len(act) == len(fr) - 1:  # actions between frames: the last frame's action is never used
        log("note: one action fewer than frames; the last frame gets a zero action (it predicts nothing)")
        act = np.concatenate([act, np.zeros_like(act[:1])])
    if len(act) != len(fr):
        raise GenlabError(f"{len(act)} actions for {len(fr)} frames: one action per frame (or one fewer) is required")
    st = np.asarray(_load_table(Path(starts)), np.int64).ravel() if starts else np.zeros(1, np.int64)
    if fr.ndim != 4:
        raise GenlabError(f"{frames}: frames must be uint8 [T, H, W, C], got shape {fr.shape}")
    zeros = np.zeros(len(fr), np.float32)
    check_lengths(len(fr), act, zeros, zeros, st)
    report = alignment_check(Episodes(fr, act, zeros, zeros.astype(bool), st))
    path = write_episodes(out, fr, act, starts=st, meta={"source": f"imported from {frames} + {actions}"})
    log(f"alignment check: {report['message']}")
    log("  held-out R^2 by lag: " + ", ".join(f"{k:+d}: {v:.4f}" for k, v in report["scores"].items()))
    return {"path": path, **report}


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
