"""Pictures of the image families (flow, few-step, latent flow; the autoencoder's too): PNG grids laid out by class."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from genlab.data.pixels import to_pixels


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
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    img.save(path)
    return path


def grid_columns(n: int, k: int, class_id=None) -> int:
    """Columns of a grid of n samples cycling over k classes: a multiple of k, so each column holds one class
    (square for one class or more than 16)."""
    if class_id is not None or not 2 <= k <= 16:
        return int(n ** 0.5 + 0.999)
    return min(n, k * max(1, int(n ** 0.5) // k))


def sample_to_file(method, model, out, *, n=64, steps=None, generator=None, device=None, class_id=None, **options):
    """`genlab sample`: n images of method.draw in a PNG grid laid out by class (grid_columns)."""
    imgs = to_pixels(method.draw(model, n, steps=steps, generator=generator, device=device, class_id=class_id, **options))
    cols = grid_columns(n, method.spec["num_classes"], class_id)
    return save_grid(imgs, (n + cols - 1) // cols, cols, out)


def preview(method, model, path, ctx):
    """One row per class (the first 10 classes when there are more), eval.grid_per_class columns."""
    classes, cols = range(min(method.spec["num_classes"], 10)), ctx["eval"].grid_per_class
    labels = torch.tensor([c for c in classes for _ in range(cols)], device=ctx["device"])
    return save_grid(method.pixels(model, ctx)(labels, "preview: sampling"), len(classes), cols, path)
