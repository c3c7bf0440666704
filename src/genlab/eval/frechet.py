"""Fréchet distance between Gaussians fitted to two feature sets (Heusel et al. 2017, FID):
d^2 = ||mu1 - mu2||^2 + Tr(S1 + S2 - 2 (S1 S2)^{1/2}), computed in float64."""
from __future__ import annotations

import numpy as np


def gaussian_stats(features) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (unbiased) covariance of [n, d] features, in float64."""
    f = np.asarray(features, np.float64)
    if f.ndim != 2 or len(f) < 2:
        raise ValueError(f"need [n >= 2, d] features, got shape {f.shape}")
    return f.mean(0), np.atleast_2d(np.cov(f, rowvar=False))


def trace_sqrt_product(s1: np.ndarray, s2: np.ndarray) -> float:
    """Tr (S1 S2)^{1/2} for covariance matrices.

    S1 S2 is similar to the symmetric PSD matrix A S2 A with A = S1^{1/2} (or L^T S2 L with S1 = L L^T), so the trace is the sum of
    square roots of A S2 A's eigenvalues: only symmetric eigendecompositions, which stay real and
    stable when a covariance is singular (scipy.linalg.sqrtm of S1 S2 can return complex or NaN then)."""
    s1, s2 = np.asarray(s1, np.float64), np.asarray(s2, np.float64)
    try:  # full rank (the usual case, n > d): S1 = L L^T, and L^T S2 L is similar to S1 S2 too, with no eigenvectors
        a = np.linalg.cholesky(s1)  # to compute (an eigh with vectors costs ~10x eigvalsh at d = 2048)
        m = a.T @ s2 @ a
    except np.linalg.LinAlgError:  # singular S1 (fewer samples than dimensions): A = S1^{1/2} from its eigenvectors
        w, u = np.linalg.eigh(s1)
        a = (u * np.sqrt(np.clip(w, 0, None))) @ u.T
        m = a @ s2 @ a
    return float(np.sqrt(np.clip(np.linalg.eigvalsh((m + m.T) / 2), 0, None)).sum())


def frechet_from_stats(mu1, s1, mu2, s2) -> float:
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    s1, s2 = np.atleast_2d(np.asarray(s1, np.float64)), np.atleast_2d(np.asarray(s2, np.float64))
    d = float(((mu1 - mu2) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * trace_sqrt_product(s1, s2))
    return max(d, 0.0)  # rounding can leave -1e-12 for identical inputs


def frechet_distance(f1, f2) -> float:
    """Fréchet distance between Gaussians fitted to features f1 [n1, d] and f2 [n2, d]."""
    return frechet_from_stats(*gaussian_stats(f1), *gaussian_stats(f2))
