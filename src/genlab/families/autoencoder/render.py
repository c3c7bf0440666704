"""Pictures of the autoencoder family: held-out originals above their reconstructions (it draws no new images)."""
from __future__ import annotations

import torch

from genlab.data.pixels import to_pixels
from genlab.families.image_flow.render import save_grid
from genlab.runtime.parallel import unwrap

PREVIEW_IMAGES = 16


def recon_grid(method, model, path, n, device):
    """Originals (odd rows) above their reconstructions (even rows), up to 8 per row."""
    x, rec = method.reconstructions(model, n, device)
    cols = min(8, len(x))
    rows = []
    for i in range(0, len(x), cols):
        pad = cols - len(x[i:i + cols])
        for part in (x[i:i + cols], rec[i:i + cols]):
            rows.append(torch.cat([part, torch.ones(pad, *part.shape[1:])]) if pad else part)
    return save_grid(to_pixels(torch.cat(rows)), len(rows), cols, path)


def sample_to_file(method, model, out, *, n=16, steps=None, generator=None, device=None):
    return recon_grid(method, model, out, n, device or next(unwrap(model).parameters()).device)


def preview(method, model, path, ctx):
    return recon_grid(method, model, path, PREVIEW_IMAGES, ctx["device"])
