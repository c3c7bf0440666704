"""World-model evaluation on held-out episodes (docs/world.md: Evaluation): teacher-forced PSNR / SSIM, rollouts
against copy-last (whole frame and moving pixels), an in-domain Fréchet distance, the action margin and Atari object
tracking. It takes rollout(context [B,L,...], actions [B,L+K-1], generator) -> frames [B,K,...] and the context length
L: it never sees a method or a model.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from genlab.core.errors import GenlabError
from genlab.core.files import write_atomic
from genlab.core.tables import markdown_table
from genlab.data.episodes import read_episodes
from genlab.data.pixels import to_pixels
from genlab.data.windows import spaced_starts, spaced_windows
from genlab.eval.frechet import frechet_distance
from genlab.eval.objects import BRICKS, GAMES, bricks_removed, position_errors

MOVE_TOL = 1.5 * 2 / 255  # a pixel moves when a channel changes by more than 1.5 uint8 levels ([-1, 1] frames)
OBJECT_STEPS = {8: 2.0, 32: 4.0}  # rollout step -> position error (pixels) a tracked object must stay within
SERVE_ON_REWARD = {"Pong"}  # games whose every reward ends a point, after which a new ball is served


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-sample PSNR in dB of images in [-1, 1] (peak-to-peak 2)."""
    mse = (a.float() - b.float()).pow(2).flatten(1).mean(1)
    return 10 * torch.log10(4.0 / mse.clamp_min(1e-10))


def ssim_map(a: torch.Tensor, b: torch.Tensor, same: bool = False) -> torch.Tensor:
    """SSIM map (Wang et al. 2004; 11x11 Gaussian, sigma 1.5) of images [N, C, H, W] in [-1, 1], channels averaged;
    valid windows only, or `same` size (reflect-padded) to weigh it with a per-pixel mask."""
    C = a.shape[1]
    g = torch.exp(-(torch.arange(11, device=a.device) - 5.0) ** 2 / (2 * 1.5 ** 2))
    g = (g / g.sum())
    w = (g[:, None] * g[None]).expand(C, 1, 11, 11)
    a, b = a.float(), b.float()
    if same:
        a, b = F.pad(a, (5, 5, 5, 5), mode="reflect"), F.pad(b, (5, 5, 5, 5), mode="reflect")
    # fp32 even under the eval's bf16 autocast: E[x^2] - mu^2 cancels catastrophically in bf16 (SSIM > 1 seen on GPU)
    with torch.autocast(a.device.type, enabled=False):
        mu_a, mu_b = F.conv2d(a, w, groups=C), F.conv2d(b, w, groups=C)
        s_aa = F.conv2d(a * a, w, groups=C) - mu_a ** 2
        s_bb = F.conv2d(b * b, w, groups=C) - mu_b ** 2
        s_ab = F.conv2d(a * b, w, groups=C) - mu_a * mu_b
    c1, c2 = (0.01 * 2) ** 2, (0.03 * 2) ** 2  # data range 2
    m = ((2 * mu_a * mu_b + c1) * (2 * s_ab + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (s_aa + s_bb + c2))
    return m.mean(1)


def ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-sample SSIM of images in [-1, 1]."""
    return ssim_map(a, b).flatten(1).mean(1)


def moving_mask(real: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
    """[N, C, H, W] frames -> [N, H, W]: the pixels where the real frame differs from the real frame before it."""
    return (real.float() - prev.float()).abs().amax(1) > MOVE_TOL


def masked_psnr(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-sample PSNR over the mask's pixels (all channels); NaN where the mask is empty."""
    se = (a.float() - b.float()).pow(2).mean(1)
    n = mask.sum((1, 2))
    mse = (se * mask).sum((1, 2)) / n.clamp_min(1)
    return torch.where(n > 0, 10 * torch.log10(4.0 / mse.clamp_min(1e-10)), torch.nan)


def masked_ssim(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    n = mask.sum((1, 2))
    return torch.where(n > 0, (ssim_map(a, b, same=True) * mask).sum((1, 2)) / n.clamp_min(1), torch.nan)


def to_uint8(x: torch.Tensor):
    """[..., C, H, W] in [-1, 1] -> uint8 numpy [..., H, W, C]."""
    return to_pixels(x).cpu().numpy()


def _steps(values: torch.Tensor) -> list:
    """[N, K] per-window values -> per-step means over the windows where they exist (None where none does)."""
    m = torch.nanmean(values.float(), 0)
    return [None if v != v else float(v) for v in m.tolist()]


def _within(err: np.ndarray, rows: np.ndarray) -> dict:
    """err [N, K] position errors (NaN: not in the real frame, inf: lost), rows [N, K] the rollouts to count: per step
    the median error, the shares within 2 and 4 pixels and the count of rollouts whose real frame shows the object."""
    steps = [err[rows[:, k] & ~np.isnan(err[:, k]), k] for k in range(err.shape[1])]
    return {"median_error": [float(np.median(v)) if len(v) else None for v in steps],
            **{f"within_{px}px": [float((v <= px).mean()) if len(v) else None for v in steps] for px in (2, 4)},
            "visible": [len(v) for v in steps]}


def object_errors(real: torch.Tensor, gen: torch.Tensor, game: str) -> dict[str, np.ndarray]:
    """Per tracked object: [N, K] distances (pixels) between its real and generated positions of [N, K, ...] rollouts,
    NaN where the real frame does not show it, inf where the generated frame lost it."""
    N, K = real.shape[:2]
    errs = position_errors(to_uint8(real.flatten(0, 1)), to_uint8(gen.flatten(0, 1)), game)
    return {name: e["errors"].reshape(N, K) for name, e in errs.items()}


def object_curves(errs: dict[str, np.ndarray], served: np.ndarray | None = None) -> dict:
    """Per tracked object and step: the median position error and the share of rollouts (of those whose real frame
    shows the object) within 2 and 4 pixels; a generated frame that lost the object counts as a miss. With served
    [N, K] (a point ended after the context and before the step), the ball's curves also come split into the rollouts
    whose ball at that step is a new serve and those whose ball is still the one in flight."""
    out = {}
    for name, err in errs.items():
        out[name] = _within(err, np.ones(err.shape, bool))
        if served is not None and name == "ball":
            out[name]["served"], out[name]["in_flight"] = _within(err, served), _within(err, ~served)
    return out


def points_before(rewards: np.ndarray, L: int) -> np.ndarray:
    """rewards [N, W] of windows of L context frames: [N, W - L], whether a reward came after the last context frame
    and before each generated step's frame (rewards[t] comes with frames[t + 1])."""
    r = rewards[:, L - 1:-1] != 0
    return np.concatenate([np.zeros((len(r), 1), bool), np.logical_or.accumulate(r, 1)[:, :-1]], 1)


def frechet_in_domain(real: torch.Tensor, fake: torch.Tensor, dims: int = 32) -> float:
    r, f = (F.adaptive_avg_pool2d(x.flatten(0, -4).float(), min(16, x.shape[-1])).flatten(1) for x in (real, fake))
    mean = r.mean(0)
    dims = min(dims, r.shape[0] - 1, r.shape[1])
    _, _, v = torch.linalg.svd(r - mean, full_matrices=False)
    proj = v[:dims].T
    return float(frechet_distance(((r - mean) @ proj).double().cpu().numpy(), ((f - mean) @ proj).double().cpu().numpy()))


def _rollout_batched(rollout, L, frames, actions, K, seed, bs):
    return torch.cat([rollout(frames[i:i + bs, :L], actions[i:i + bs, :L + K - 1],
                              torch.Generator(device=frames.device).manual_seed(seed + i))
                      for i in range(0, len(frames), bs)])


def moving_curves(real, gen, last, res: dict, H: int) -> dict:
    """Per-step PSNR/SSIM over the moving pixels of [N, H, ...] rollouts, for the model and copy-last; the horizon's
    summary goes into res."""
    N = len(real)
    prev = torch.cat([last, real[:, :-1]], 1).flatten(0, 1)
    mask = moving_mask(real.flatten(0, 1), prev)
    r, g, c = real.flatten(0, 1), gen.flatten(0, 1), last.expand_as(real).flatten(0, 1)
    out = {f"moving{kind}_{who}": _steps(score(x, r, mask).view(N, H))  # moving_model, ..., moving_ssim_copy_last
           for kind, score in (("", masked_psnr), ("_ssim", masked_ssim)) for who, x in (("model", g), ("copy_last", c))}
    out["moving_share"] = mask.float().mean((1, 2)).view(N, H).mean(0).tolist()
    pairs = [(m, p) for m, p in zip(out["moving_model"], out["moving_copy_last"]) if m is not None and p is not None]
    if pairs:
        res[f"moving_psnr_h{H}"] = float(np.mean([m for m, _ in pairs]))
        res[f"copy_last_moving_psnr_h{H}"] = float(np.mean([p for _, p in pairs]))
        res[f"rollout_beats_copy_moving_all_steps_h{H}"] = all(m > p for m, p in pairs)
    ss = [v for v in out["moving_ssim_model"] if v is not None]
    if ss:
        res[f"moving_ssim_h{H}"] = float(np.mean(ss))
    return out


def other_episodes(path: str, like):
    """eval.world_episodes: another episode folder, checked against the run's held-out episodes before any rollout."""
    eps = read_episodes(path)
    if eps.frames.shape[1:] != like.frames.shape[1:]:
        raise GenlabError(f"eval.world_episodes '{path}' has frames {list(eps.frames.shape[1:])}, the run was trained on "
                          f"{list(like.frames.shape[1:])}")
    if eps.discrete != like.discrete or (eps.discrete and eps.num_actions > like.num_actions) or eps.action_dim != like.action_dim:
        kind = lambda e: f"{e.num_actions} discrete actions" if e.discrete else f"{e.action_dim}-dim action vectors"  # noqa: E731
        raise GenlabError(f"eval.world_episodes '{path}' has {kind(eps)}, the run's model takes {kind(like)}")
    return eps


@torch.no_grad()
def evaluate_world(rollout, L, data, ctx) -> dict:
    ecfg, dev = ctx["eval"], ctx["device"]
    eps, bs = data.val, ecfg.batch_size
    if ecfg.world_episodes:
        eps = other_episodes(ecfg.world_episodes, data.val)
    game = eps.meta.get("game")
    horizons = [int(h) for h in str(ecfg.world_horizons).split(",") if h.strip()]
    res, curves = {}, {}
    frames, actions = spaced_windows(eps, L + 1, max(ecfg.world_rollouts, 64), dev)
    if frames is None:
        return {"error": f"held-out episodes are shorter than {L + 1} frames"}
    gen = _rollout_batched(rollout, L, frames, actions, 1, 0, bs)[:, 0]
    real, last = frames[:, L], frames[:, L - 1]
    res.update({"tf_psnr": psnr(gen, real).mean().item(), "tf_ssim": ssim(gen, real).mean().item(),
                "tf_mse": (gen - real).pow(2).mean().item(), "tf_copy_last_psnr": psnr(last, real).mean().item()})
    for H in horizons:
        frames, actions = spaced_windows(eps, L + H, ecfg.world_rollouts, dev)
        if frames is None:
            res[f"rollout_h{H}"] = "skipped: held-out episodes too short"
            continue
        real, last = frames[:, L:], frames[:, L - 1:L]
        gen = _rollout_batched(rollout, L, frames, actions, H, 1, bs)
        p_model = psnr(gen.flatten(0, 1), real.flatten(0, 1)).view(len(gen), H).mean(0)
        p_copy = psnr(last.expand_as(real).flatten(0, 1), real.flatten(0, 1)).view(len(gen), H).mean(0)
        res[f"rollout_psnr_h{H}"] = p_model.mean().item()
        res[f"copy_last_psnr_h{H}"] = p_copy.mean().item()
        res[f"rollout_beats_copy_all_steps_h{H}"] = bool((p_model > p_copy).all().item())
        res[f"frechet_h{H}"] = frechet_in_domain(real, gen)
        curves[H] = {"model": p_model.tolist(), "copy_last": p_copy.tolist(), **moving_curves(real, gen, last, res, H),
                     "frechet": [frechet_in_domain(real[:, k], gen[:, k]) for k in range(H)]}
        if H >= 64:  # drift: the last 32 steps' frame FD over the first 32's (a collapse grows it)
            res[f"frechet_last32_over_first32_h{H}"] = float(np.mean(curves[H]["frechet"][-32:]) /
                                                             max(np.mean(curves[H]["frechet"][:32]), 1e-12))
        errs = object_errors(real, gen, game) if game in GAMES and real.shape[2] == 3 else {}
        if game in BRICKS and real.shape[2] == 3:  # do the bricks the real ball removes go in the rollout too?
            tracked = errs["ball"] <= 4 if "ball" in errs else None  # NaN (no real ball) counts as not tracked
            b = curves[H]["bricks"] = bricks_removed(to_uint8(last[:, 0]), to_uint8(real), to_uint8(gen), game, tracked)
            if b["removed_share"][-1] is not None:
                res[f"bricks_removed_share_h{H}"] = b["removed_share"][-1]
                res[f"bricks_rollouts_with_removal_h{H}"] = b["rollouts_with_removal"][-1]
                for part in ("ball_tracked", "ball_lost"):
                    if b.get(f"removed_share_{part}") is not None:
                        res[f"bricks_removed_share_h{H}_{part}"] = b[f"removed_share_{part}"]
            if b["phantom_share"][-1] is not None:
                res[f"bricks_phantom_share_h{H}"] = b["phantom_share"][-1]
        if errs:
            served = None
            if game in SERVE_ON_REWARD:
                idx = spaced_starts(eps, L + H, ecfg.world_rollouts)[:, None] + np.arange(L + H)
                served = points_before(np.asarray(eps.rewards)[idx], L)
            curves[H]["objects"] = object_curves(errs, served)
            for name, c in curves[H]["objects"].items():
                for step, px in OBJECT_STEPS.items():
                    for part, cc in (("", c), ("_served", c.get("served")), ("_in_flight", c.get("in_flight"))):
                        if cc is not None and step <= H and cc["visible"][step - 1]:
                            res[f"{name}_within_{px:g}px_step{step}_h{H}{part}"] = cc[f"within_{px:g}px"][step - 1]
        if H == min(horizons):
            # shuffled actions: another window's action sequence; same contexts and same noise seeds
            perm = torch.roll(torch.arange(len(actions), device=dev), 1)
            shuf = _rollout_batched(rollout, L, frames, actions[perm], H, 1, bs)
            p_shuf = psnr(shuf.flatten(0, 1), real.flatten(0, 1)).view(len(gen), H).mean(0)
            res["action_psnr_true"] = p_model.mean().item()
            res["action_psnr_shuffled"] = p_shuf.mean().item()
            res["action_margin_db"] = p_model.mean().item() - p_shuf.mean().item()
            curves[H]["action_margin"] = (p_model - p_shuf).tolist()
            if H >= 2:  # does the action move the view from the second generated frame on?
                res["action_margin_min_from_step2_db"] = min(curves[H]["action_margin"][1:])
    res["world_gain_db"] = world_gain_db(res)
    run_dir = ctx.get("run_dir")
    if run_dir is not None:  # another folder's scores go beside the run's own: world_eval_<folder>.md
        name = "world_eval" + (f"_{Path(ecfg.world_episodes).name}" if ecfg.world_episodes else "")
        if ctx.get("report") and (Path(run_dir) / f"{name}.json").exists():  # `genlab eval`: beside, never over
            name = next(f"{name}_{ctx['report']}{s}" for s in [""] + [f"_{i}" for i in range(2, 10 ** 6)]
                        if not (Path(run_dir) / f"{name}_{ctx['report']}{s}.json").exists())
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        write_atomic(Path(run_dir) / f"{name}.json", json.dumps({"metrics": res, "curves": curves}, indent=2))
        write_atomic(Path(run_dir) / f"{name}.md", rollout_table(curves, res))
        if ctx.get("report"):
            print(f"rollout report: {Path(run_dir) / name}.md", file=sys.stderr)
    return res


def world_gain_db(res: dict) -> float:
    """What a model gained over copying the last frame, in dB: the larger of its teacher-forced PSNR gain and its action
    margin (the stall sentinel's world metric). Either alone misleads: on Breakout copy-last is ~63 dB one step ahead
    (only ball and paddle move) and a model that follows the controls (+9 dB action margin) sits 1-2 dB under it;
    a model that ignores the actions can still beat copy-last by extrapolating the motion in its context."""
    gain = res["tf_psnr"] - res["tf_copy_last_psnr"]
    return float(max(gain, res["action_margin_db"]) if "action_margin_db" in res else gain)


def rollout_table(curves: dict, res: dict) -> str:
    lines = []
    fmt = lambda v, f="{:.2f}": "-" if v is None else f.format(v)  # noqa: E731
    for H, c in curves.items():
        objs = c.get("objects", {})
        head = ["step", "model", "copy-last", "margin", "moving: model", "moving: copy-last", "moving SSIM", "FD"]
        split = {n: o for n, o in objs.items() if "served" in o}  # Pong's ball: in flight, or a new serve
        head += ["action margin"] * ("action_margin" in c) + [f"{n} within 2 / 4 px" for n in objs]
        head += [f"{n} within 4 px: in flight / new serve (rollouts)" for n in split]
        rows = []
        for k, (m, p) in enumerate(zip(c["model"], c["copy_last"])):
            row = [k + 1, f"{m:.2f}", f"{p:.2f}", f"{m - p:+.2f}", fmt(c["moving_model"][k]), fmt(c["moving_copy_last"][k]),
                   fmt(c["moving_ssim_model"][k], "{:.3f}"), f"{c['frechet'][k]:.4f}"]
            row += [f"{c['action_margin'][k]:+.2f}"] if "action_margin" in c else []
            row += [f"{fmt(o['within_2px'][k], '{:.0%}')} / {fmt(o['within_4px'][k], '{:.0%}')}" for o in objs.values()]
            row += [" / ".join(f"{fmt(o[part]['within_4px'][k], '{:.0%}')} ({o[part]['visible'][k]})" for part in ("in_flight", "served"))
                    for o in split.values()]
            rows.append(row)
        lines += [f"### rollout H={H}: per-step PSNR (dB), model vs copy-last-frame, whole frame and moving pixels", "",
                  markdown_table(head, rows), ""]
    if "action_margin_db" in res:
        lines.append(f"action sensitivity: true {res['action_psnr_true']:.2f} dB, shuffled "
                     f"{res['action_psnr_shuffled']:.2f} dB, margin {res['action_margin_db']:+.3f} dB")
    return "\n".join(lines) + "\n"
