"""World-model evaluation on held-out episodes.

- teacher-forced next-frame PSNR / SSIM (real context), against copying the last context frame;
- autoregressive rollouts of H steps with the true actions: per-step PSNR against copy-last;
- Fréchet distance of rolled-out frames to the real ones in an in-domain feature space (PCA of
  pooled real held-out frames: no ImageNet network knows Pong);
- action sensitivity: the same contexts and noise with true vs shuffled actions; a positive margin
  (true PSNR - shuffled PSNR) means the controls steer the generated frames.

It takes a rollout callable, rollout(context [B,L,...], actions [B,L+K-1], generator) -> frames [B,K,...], and
the context length L: it never sees a method or a model.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from genlab.core.tables import markdown_table
from genlab.data.windows import spaced_windows
from genlab.eval.frechet import frechet_distance


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-sample PSNR in dB of images in [-1, 1] (peak-to-peak 2)."""
    mse = (a.float() - b.float()).pow(2).flatten(1).mean(1)
    return 10 * torch.log10(4.0 / mse.clamp_min(1e-10))


def ssim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-sample SSIM (Wang et al. 2004; 11x11 Gaussian, sigma 1.5) of images in [-1, 1]."""
    C = a.shape[1]
    g = torch.exp(-(torch.arange(11, device=a.device) - 5.0) ** 2 / (2 * 1.5 ** 2))
    g = (g / g.sum())
    w = (g[:, None] * g[None]).expand(C, 1, 11, 11)
    a, b = a.float(), b.float()
    # fp32 even under the eval's bf16 autocast: E[x^2] - mu^2 cancels catastrophically in bf16 (SSIM > 1 seen on GPU)
    with torch.autocast(a.device.type, enabled=False):
        mu_a, mu_b = F.conv2d(a, w, groups=C), F.conv2d(b, w, groups=C)
        s_aa = F.conv2d(a * a, w, groups=C) - mu_a ** 2
        s_bb = F.conv2d(b * b, w, groups=C) - mu_b ** 2
        s_ab = F.conv2d(a * b, w, groups=C) - mu_a * mu_b
    c1, c2 = (0.01 * 2) ** 2, (0.03 * 2) ** 2  # data range 2
    m = ((2 * mu_a * mu_b + c1) * (2 * s_ab + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (s_aa + s_bb + c2))
    return m.flatten(1).mean(1)


def pooled(x: torch.Tensor) -> torch.Tensor:
    x = x.flatten(0, -4).float()
    return F.adaptive_avg_pool2d(x, min(16, x.shape[-1])).flatten(1)


def frechet_in_domain(real: torch.Tensor, fake: torch.Tensor, dims: int = 32) -> float:
    r, f = pooled(real), pooled(fake)
    mean = r.mean(0)
    dims = min(dims, r.shape[0] - 1, r.shape[1])
    _, _, v = torch.linalg.svd(r - mean, full_matrices=False)
    proj = v[:dims].T
    return float(frechet_distance(((r - mean) @ proj).double().cpu().numpy(), ((f - mean) @ proj).double().cpu().numpy()))


def _seeded(device, seed):
    return torch.Generator(device=device).manual_seed(seed)


def _rollout_batched(rollout, L, frames, actions, K, seed, bs):
    return torch.cat([rollout(frames[i:i + bs, :L], actions[i:i + bs, :L + K - 1], _seeded(frames.device, seed + i))
                      for i in range(0, len(frames), bs)])


@torch.no_grad()
def evaluate_world(rollout, L, data, ctx) -> dict:
    ecfg, dev = ctx["eval"], ctx["device"]
    eps, bs = data.val, ecfg.batch_size
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
        curves[H] = {"model": p_model.tolist(), "copy_last": p_copy.tolist()}
        res[f"rollout_psnr_h{H}"] = p_model.mean().item()
        res[f"copy_last_psnr_h{H}"] = p_copy.mean().item()
        res[f"rollout_beats_copy_all_steps_h{H}"] = bool((p_model > p_copy).all().item())
        res[f"frechet_h{H}"] = frechet_in_domain(real, gen)
        if H == min(horizons):
            # shuffled actions: another window's action sequence; same contexts and same noise seeds
            perm = torch.roll(torch.arange(len(actions), device=dev), 1)
            p_shuf = psnr(_rollout_batched(rollout, L, frames, actions[perm], H, 1, bs).flatten(0, 1),
                          real.flatten(0, 1)).mean()
            res["action_psnr_true"] = p_model.mean().item()
            res["action_psnr_shuffled"] = p_shuf.item()
            res["action_margin_db"] = p_model.mean().item() - p_shuf.item()
    run_dir = ctx.get("run_dir")
    if run_dir is not None:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / "world_eval.json").write_text(json.dumps({"metrics": res, "curves": curves}, indent=2))
        (Path(run_dir) / "world_eval.md").write_text(rollout_table(curves, res))
    return res


def rollout_table(curves: dict, res: dict) -> str:
    lines = []
    for H, c in curves.items():
        rows = [[k + 1, f"{m:.2f}", f"{p:.2f}", f"{m - p:+.2f}"] for k, (m, p) in enumerate(zip(c["model"], c["copy_last"]))]
        lines += [f"### rollout H={H}: per-step PSNR (dB), model vs copy-last-frame", "",
                  markdown_table(["step", "model", "copy-last", "margin"], rows), ""]
    if "action_margin_db" in res:
        lines.append(f"action sensitivity: true {res['action_psnr_true']:.2f} dB, shuffled "
                     f"{res['action_psnr_shuffled']:.2f} dB, margin {res['action_margin_db']:+.3f} dB")
    return "\n".join(lines) + "\n"
