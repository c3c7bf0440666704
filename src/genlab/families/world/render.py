"""Videos of the world family: context | real | generated rollouts with the action on every frame, as GIF and MP4."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from genlab.data import build_dataset
from genlab.data.pixels import to_pixels
from genlab.data.windows import spaced_windows


def to_u8(x: torch.Tensor) -> np.ndarray:
    """float [..., C, H, W] in [-1, 1] -> uint8 [..., H, W, 3]."""
    a = to_pixels(x).cpu().numpy()
    return np.repeat(a, 3, -1) if a.shape[-1] == 1 else a


def action_name(a, meanings) -> str:
    if np.ndim(a) == 0:
        i = int(a)
        return meanings[i] if meanings and i < len(meanings) else f"a={i}"
    return "[" + ",".join(f"{v:+.1f}" for v in np.asarray(a).ravel()[:6]) + "]"


def compose_frames(context, real, gen, actions, meanings=None, scale: int = 3) -> list[np.ndarray]:
    """context [B,L,C,H,W], real/gen [B,K,C,H,W], actions [B,L+K-1(+)] -> K uint8 video frames."""
    from PIL import Image, ImageDraw
    B, K = gen.shape[:2]
    L = context.shape[1]
    ctx_u8, real_u8, gen_u8 = to_u8(context[:, -1]), to_u8(real), to_u8(gen)
    acts = actions.detach().cpu().numpy()
    S = ctx_u8.shape[1] * scale
    head, pad = 14, 2
    W, Hh = 3 * S + 4 * pad, head + B * (S + 12 + pad)
    out = []
    for k in range(K):
        canvas = Image.new("RGB", (W, Hh), (20, 20, 20))
        draw = ImageDraw.Draw(canvas)
        for j, title in enumerate(("context (last)", "real", f"generated t+{k + 1}")):
            draw.text((pad + j * (S + pad), 2), title, fill=(230, 230, 230))
        for b in range(B):
            y = head + b * (S + 12 + pad)
            for j, img in enumerate((ctx_u8[b], real_u8[b, k], gen_u8[b, k])):
                canvas.paste(Image.fromarray(img).resize((S, S), Image.NEAREST), (pad + j * (S + pad), y))
            draw.text((pad, y + S), f"action: {action_name(acts[b, L - 1 + k], meanings)}", fill=(255, 220, 90))
        out.append(np.asarray(canvas))
    return out


def write_video(frames: list[np.ndarray], path, fps: int = 8, log=print) -> list[Path]:
    """GIF (pillow) at `path` and an MP4 beside it (imageio-ffmpeg; skipped with a message if missing)."""
    from PIL import Image
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    gif = path.with_suffix(".gif")
    imgs = [Image.fromarray(f) for f in frames]
    imgs[0].save(gif, save_all=True, append_images=imgs[1:], duration=int(1000 / fps), loop=0)
    written = [gif]
    mp4 = path.with_suffix(".mp4")
    try:
        import imageio.v2 as imageio
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        log(f"skipped {mp4.name}: MP4 needs imageio and imageio-ffmpeg (pip install imageio imageio-ffmpeg)")
        return written
    h, w = frames[0].shape[:2]
    with imageio.get_writer(mp4, fps=fps, codec="libx264", macro_block_size=1, pixelformat="yuv420p") as wr:
        for f in frames:
            wr.append_data(np.pad(f, ((0, h % 2), (0, w % 2), (0, 0))))  # H.264 wants even sizes
    written.append(mp4)
    return written


@torch.no_grad()
def rollout_video(method, model, path, device, generator=None, horizon=16, n=4, steps=None):
    """The rollout video of n held-out windows at `path` (the horizon halved to fit the episodes): the GIF or None."""
    eps, L = build_dataset(method.cfg.data).val, method.L
    frames, actions = None, None
    while horizon >= 1 and frames is None:
        frames, actions = spaced_windows(eps, L + horizon, n, device)
        horizon = horizon // 2 if frames is None else horizon
    if frames is None:
        return None
    gen = method.rollout(model, frames[:, :L], actions[:, :L + horizon - 1], steps,
                         torch.Generator(device=device).manual_seed(0))
    meanings = method.spec.get("action_meanings")
    return write_video(compose_frames(frames[:, :L], frames[:, L:], gen, actions, meanings), path)[0]


def sample_to_file(method, model, out, *, n=4, steps=None, generator=None, device=None):
    """`genlab sample`: up to 8 held-out windows rolled out 32 frames (rollout.gif beside a .png --out)."""
    out = out.with_name("rollout.gif") if out.suffix == ".png" else out
    return rollout_video(method, model, out, device, generator, horizon=32, n=min(n, 8), steps=steps)


def preview(method, model, path, ctx):
    return rollout_video(method, model, path.with_suffix(".gif"), ctx["device"], ctx["generator"],
                         horizon=max(method.H, 16), n=4)
