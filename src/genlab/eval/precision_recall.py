"""Improved precision and recall (Kynkäänniemi et al. 2019, "Improved Precision and Recall Metric for
Assessing Generative Models"): each set's manifold is the union of balls around its points with
radius the distance to the k-th nearest neighbour in the same set. Precision = fraction of generated
points inside the real manifold; recall = fraction of real points inside the generated manifold."""
from __future__ import annotations

import numpy as np
import torch


def _as_tensor(x, device) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x, dtype=np.float64) if not torch.is_tensor(x) else x,
                           dtype=torch.float64, device=device)


def knn_radii(feats: torch.Tensor, k: int, chunk: int = 1024) -> torch.Tensor:
    """Distance from every point to its k-th nearest neighbour among the others."""
    if not 1 <= k < len(feats):
        raise ValueError(f"k={k} needs at least k+1={k + 1} points, got {len(feats)}")
    out = []
    for i in range(0, len(feats), chunk):
        d = torch.cdist(feats[i:i + chunk], feats)
        out.append(d.kthvalue(k + 1, dim=1).values)  # the point itself is the 1st (distance 0)
    return torch.cat(out)


def coverage(query: torch.Tensor, support: torch.Tensor, radii: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """Bool per query point: inside some ball B(support_i, radii_i)."""
    out = []
    for i in range(0, len(query), chunk):
        d = torch.cdist(query[i:i + chunk], support)
        out.append((d <= radii[None, :]).any(dim=1))
    return torch.cat(out)


def precision_recall(real, fake, k: int = 3, device=None) -> tuple[float, float]:
    """(precision, recall) of fake [m, d] against real [n, d] features, distances in float64."""
    device = device or (real.device if torch.is_tensor(real) else "cpu")
    r, f = _as_tensor(real, device), _as_tensor(fake, device)
    precision = coverage(f, r, knn_radii(r, k)).double().mean().item()
    recall = coverage(r, f, knn_radii(f, k)).double().mean().item()
    return precision, recall
