"""Per-sample weights w(t) of the flow-matching velocity loss, mean_i w(t_i) |v_i - (data_i - noise_i)|^2
(docs/image_flow.md: with SNR(t) = t^2 / (1-t)^2 the velocity error is the data error over (1-t)).
"""
import torch

from genlab.config import fields as cf
from genlab.core.registry import Registry

loss_weighting_registry = Registry("loss_weighting")


class MinSnrKeys(cf.Keys, section="method"):
    snr_gamma: float = cf.F(5.0, "flow, min_snr: gamma of Min-SNR-gamma", gt=0)


@loss_weighting_registry.register("none", "w = 1: the plain velocity MSE (rectified flow)")
def no_weighting(t, cfg=None):
    return torch.ones_like(t)


@loss_weighting_registry.register("min_snr", "Min-SNR-gamma (Hang et al. 2023) on the data error: w = min(SNR, gamma) "
                                             "(1-t)^2 = min(t^2, gamma (1-t)^2) on the velocity loss (method.snr_gamma)",
    keys=MinSnrKeys)
def min_snr(t, cfg=None):
    # min(SNR, gamma) on the x0 loss, moved to the velocity loss; why not the paper's v form: docs/image_flow.md
    gamma = MinSnrKeys.of_or_defaults(cfg).snr_gamma
    return torch.minimum(t * t, gamma * (1 - t) ** 2)
