"""Sample quality of class-conditional image generators: sample accuracy, Fréchet feature distance,
and the per-class sample grid."""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from genlab.data.pixels import to_pixels
from genlab.eval.metrics import image_metrics
from genlab.sampling.images import sample_images


def generate(method, model, labels, ctx, batch, desc="sampling"):
    """uint8 pixels on the CPU, with the evaluation's steps, guidance and sampler (sampling.sample_images)."""
    return sample_images(method, model, labels, steps=ctx["eval"].sample_steps, cfg_scale=ctx["eval"].cfg_scale,
                         sampler=ctx.get("sampler"), generator=ctx["generator"], device=ctx["device"], batch=batch,
                         desc=desc, post=lambda x: to_pixels(x).cpu(), per_step=False)


def evaluate_class_conditional(method, model, data, ctx) -> dict:
    """Samples for every class in turn, scored by the metrics of eval.metrics (eval/metrics.py)."""
    ecfg, device = ctx["eval"], ctx["device"]
    if ecfg.num_samples <= 0:  # eval switched off (benchmark presets)
        return {}
    if hasattr(data, "pixel_reference"):  # latents: decoded samples against the source pixels, read before sampling
        data = data.pixel_reference()
    labels = torch.arange(ecfg.num_samples, device=device) % data.spec["num_classes"]
    samples = generate(method, model, labels, ctx, ecfg.batch_size, desc="eval: sampling")
    return image_metrics(samples, labels, data, ctx)


def save_grid(images_u8: torch.Tensor, rows: int, cols: int, path, upscale: int | None = None):
    """uint8 [rows*cols, H, W, C] -> one PNG grid with a 1-pixel gap."""
    n, H, W, C = images_u8.shape
    up = upscale or max(1, 64 // H)
    grid = np.full((rows * (H + 1) + 1, cols * (W + 1) + 1, C), 255, dtype=np.uint8)
    arr = images_u8.cpu().numpy()
    for i in range(min(n, rows * cols)):
        r, c = divmod(i, cols)
        grid[1 + r * (H + 1):1 + r * (H + 1) + H, 1 + c * (W + 1):1 + c * (W + 1) + W] = arr[i]
    img = Image.fromarray(grid[..., 0] if C == 1 else grid)
    if up > 1:
        img = img.resize((img.width * up, img.height * up), Image.NEAREST)
    img.save(path)
    return path


def save_class_grid(method, model, path, ctx, classes=None):
    """One row per class (the first 10 classes when there are more), eval.grid_per_class columns."""
    k = method.spec["num_classes"]
    classes = list(range(min(k, 10))) if classes is None else classes
    cols = ctx["eval"].grid_per_class
    labels = torch.tensor([c for c in classes for _ in range(cols)], device=ctx["device"])
    samples = generate(method, model, labels, ctx, ctx["eval"].batch_size, desc="preview: sampling")
    return save_grid(samples, len(classes), cols, path)
