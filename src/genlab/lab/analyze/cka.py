"""Linear CKA between the blocks of an image backbone (Kornblith et al. 2019, arXiv:1905.00414), computed in the
feature space (d x d) instead of the example space (n x n); the formula and its properties: docs/analyze.md. Here a
block's representation is its output tokens on the patch grid, one row per (sample, token).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from genlab.families.image_flow.flow import interpolate


def centred(x: torch.Tensor) -> torch.Tensor:
    x = x.double()
    return x - x.mean(0, keepdim=True)


def cka_matrix(feats: list[torch.Tensor]) -> torch.Tensor:
    """[L, L] float64 CKA of every pair of [n, d] representations (symmetric, ones on the diagonal)."""
    xs = [centred(f) for f in feats]
    grams = [x.T @ x for x in xs]
    norms = [torch.linalg.matrix_norm(g) for g in grams]
    L = len(xs)
    m = torch.eye(L, dtype=torch.float64)
    for i in range(L):
        for j in range(i + 1, L):
            m[i, j] = m[j, i] = ((xs[j].T @ xs[i]).square().sum() / (norms[i] * norms[j])).cpu()
    return m


@contextmanager
def block_outputs(model):
    """Collects every block's grid tokens as [batch * tokens, dim] while the model runs (forward hooks; the blocks'
    computation is unchanged)."""
    feats: dict[int, torch.Tensor] = {}

    def hook(i):
        def save(_mod, _inp, out):
            # the grid tokens: an MMDiT dual block returns (image, context) streams; blocks over a joint sequence
            # (MMDiT single-stream, in-context DiT) put the conditioning tokens first, so the grid is the tail
            h = (out[0] if isinstance(out, tuple) else out)[:, -model.num_tokens:]
            feats[i] = h.reshape(-1, h.shape[-1]).detach()
        return save
    handles = [b.register_forward_hook(hook(i)) for i, b in enumerate(model.blocks)]
    try:
        yield feats
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def layer_similarity(method, model, images, labels, ts, generator) -> dict[float, torch.Tensor]:
    """{t: [depth, depth] CKA} on one batch of real images noised by the method's own path at each t (flow:
    x_t = (1 - t) noise + t data, t = 0 noise, t = 1 data); the same noise at every t."""
    noise = torch.randn(images.shape, generator=generator, device=images.device, dtype=images.dtype)
    cond = method.sample_conditions(len(images), images.device)
    res = {}
    for t in ts:
        tt = torch.full((len(images),), float(t), device=images.device)
        with block_outputs(model) as feats:
            model(interpolate(noise, images, tt), tt, labels, **cond)
        res[t] = cka_matrix([feats[i] for i in range(len(model.blocks))])
    return res
