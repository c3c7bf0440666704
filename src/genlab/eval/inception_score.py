"""Inception Score (Salimans et al. 2016): exp E_x KL(p(y|x) || p(y)), averaged over splits of the samples.

As the ADM evaluator (guided-diffusion evaluations/evaluator.py, compute_inception_score) and torch-fidelity
(metric_isc.py) compute it: p(y|x) is the softmax of the FID Inception's 1008 logits taken without the fc bias
(inception.py, output 'logits'); p(y) is the mean of p(y|x) within each split. Splits are consecutive, boundaries
i*n//splits: at the protocol's 50,000 samples that is ADM's 10 splits of 5,000. torch-fidelity shuffles the samples
first (seed 2020); genlab does not (its samples cycle through the classes, so consecutive splits are balanced)."""
from __future__ import annotations

import numpy as np
import torch


def inception_score(logits, splits: int = 10) -> tuple[float, float]:
    """(mean, std over splits) of the Inception Score of [n, classes] logits, in float64 with log_softmax
    (a zero probability gives 0 * -inf = nan in the evaluator's log(softmax); log_softmax stays finite)."""
    x = torch.as_tensor(np.asarray(logits), dtype=torch.float64)
    n = len(x)
    if x.ndim != 2 or not 1 <= splits <= n:
        raise ValueError(f"need [n >= splits, classes] logits, got shape {tuple(x.shape)} for {splits} splits")
    log_p = x.log_softmax(dim=1)
    scores = []
    for i in range(splits):
        lp = log_p[i * n // splits:(i + 1) * n // splits]
        log_py = torch.logsumexp(lp, dim=0) - np.log(len(lp))  # log of the split's mean p(y|x)
        scores.append(float((lp.exp() * (lp - log_py)).sum(1).mean().exp()))
    return float(np.mean(scores)), float(np.std(scores))
