"""Inception Score (Salimans et al. 2016): exp E_x KL(p(y|x) || p(y)), as the ADM evaluator and torch-fidelity compute
it (docs/fid.md: logits without the fc bias); consecutive splits, unshuffled: genlab's samples cycle through the classes."""
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
