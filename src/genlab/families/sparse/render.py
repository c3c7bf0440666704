"""Pictures of the image-bytes family (image_ar): samples, top-half completions, what each head sees and attends to."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from genlab.core.errors import GenlabError
from genlab.families.image_flow.render import save_grid
from genlab.families.sparse.sparse_transformer import shift_in
from genlab.runtime.parallel import unwrap


def save_rows(rows: list[np.ndarray], path) -> Path:
    """rows of uint8 [k, H, W, 3] images (equal k) -> one PNG grid with 1-pixel gaps, rows 96 pixels tall."""
    k, H = rows[0].shape[:2]
    return save_grid(torch.from_numpy(np.concatenate(rows)), len(rows), k, Path(path), upscale=max(1, 96 // H))


def rgb(u8: np.ndarray) -> np.ndarray:
    return np.repeat(u8, 3, -1) if u8.shape[-1] == 1 else u8[..., :3]


def heat(values: np.ndarray) -> np.ndarray:
    """[k, H, W] non-negative -> uint8 [k, H, W, 3], each map scaled to its maximum (black..yellow)."""
    v = values / np.maximum(values.reshape(len(values), -1).max(1), 1e-12)[:, None, None]
    return (np.stack([v, v ** 0.5 * 0.9, v * 0.2], -1) * 255).astype(np.uint8)


def completion_grid(method, model, path, generator, device, m=4, k=4, data=None, temperature=None):
    """Rows of: a held-out image, its top half, k completions of it."""
    imgs, _ = method.heldout(data, m)
    u8 = torch.from_numpy(imgs)
    comp, given = method.complete(model, u8, k, generator, device, temperature)
    masked = u8.clone()
    masked[~given.cpu()] = 0
    rows = [np.concatenate([rgb(u8[i:i + 1].numpy()), rgb(masked[i:i + 1].numpy()),
                            rgb(comp[i].cpu().numpy().astype(np.uint8))]) for i in range(len(u8))]
    return save_rows(rows, path)


def _query(method, base, r, c) -> int:
    """The sequence position of pixel (r, c)'s last byte."""
    coords = base.coords.cpu()
    return int(((coords[:, 0] == r) & (coords[:, 1] == c) & (coords[:, 2] == method.C - 1)).nonzero()[0, 0])


def pattern_picture(method, model, path, pixel=None):
    """Which positions each distinct head group can see from one query byte (white: visible)."""
    base = unwrap(model)
    r, c = pixel or (method.H // 2, method.H // 2)
    q = _query(method, base, r, c)
    maps = [method.image(part.allowed(torch.tensor(q), torch.arange(method.T)).float()[None]).numpy()[0].mean(-1)
            for part in base.parts]
    tiles = heat(np.stack(maps))
    tiles[:, r, c] = (255, 0, 0)
    return save_rows([tiles], path)


def attention_picture(method, model, path, pixel, data=None, device=None):
    """Attention of the pixel's last byte over the image: a row per layer, the image then a map per head."""
    base = unwrap(model)
    r, c = pixel
    if not (0 <= r < method.H and 0 <= c < method.H):
        raise GenlabError(f"--attention {r},{c} is outside the {method.H}x{method.H} image")
    q = _query(method, base, r, c)
    imgs, _ = method.heldout(data, 1)
    y = method.seq(torch.from_numpy(imgs).long().to(device))
    rows_p = base.attention_rows(shift_in(y), q)[:, 0].float().cpu()  # [depth, heads, q + 1]
    full = torch.zeros(*rows_p.shape[:2], method.T)
    full[..., :q + 1] = rows_p
    maps = method.image(full.flatten(0, 1)).numpy().sum(-1).reshape(*rows_p.shape[:2], method.H, method.H)
    img = rgb(imgs[:1]).copy()
    img[0, r, c] = (255, 0, 0)
    return save_rows([np.concatenate([img, heat(m)]) for m in maps], path)


def sample_to_file(method, model, out, *, n=16, steps=None, generator=None, device=None, temperature=None,
                   complete=False, attention=None):
    """`genlab sample`: n whole images; --complete: real | masked | completions; --attention R,C."""
    device = device or next(unwrap(model).parameters()).device
    out = Path(out)
    if attention is not None:
        try:
            pixel = tuple(int(v) for v in str(attention).split(","))
            assert len(pixel) == 2
        except (ValueError, AssertionError):
            raise GenlabError(f"--attention takes ROW,COL (two integers), got {attention!r}") from None
        pattern_picture(method, model, out.with_name(out.stem + "_pattern.png"), pixel)
        return attention_picture(method, model, out.with_name(out.stem + "_attention.png"), pixel, device=device)
    if complete:
        return completion_grid(method, model, out.with_name(out.stem + "_completion.png"), generator, device,
                               m=max(1, min(n, 8)), temperature=temperature)
    imgs = method.sample_images(model, n, generator, device, temperature).cpu().numpy().astype(np.uint8)
    cols = int(math.ceil(n ** 0.5))
    rows = [rgb(imgs[i:i + cols]) for i in range(0, n, cols)]
    rows[-1] = np.concatenate([rows[-1], np.full((cols - len(rows[-1]),) + rows[-1].shape[1:], 255, np.uint8)])
    return save_rows(rows, out)


def preview(method, model, path, ctx):
    n, path = max(1, min(16, ctx["eval"].num_samples)), Path(path)
    out = sample_to_file(method, model, path, n=n, generator=ctx["generator"], device=ctx["device"])
    completion_grid(method, model, path.with_name(path.stem + "_completion.png"), ctx["generator"], ctx["device"],
                    m=min(4, n), k=3)
    pattern_picture(method, model, path.with_name(path.stem + "_pattern.png"))
    return out
