"""Sample quality of class-conditional image generators: sample accuracy and Fréchet feature distance of the
samples a generate callable draws (it never sees a method or a model)."""
from __future__ import annotations

import torch

from genlab.eval.metrics import image_metrics


def evaluate_class_conditional(generate_fn, data, ctx) -> dict:
    """Samples for every class in turn, scored by the metrics of eval.metrics (eval/metrics.py); generate_fn(labels,
    desc) -> uint8 pixels [n, H, W, C] on the CPU."""
    ecfg, device = ctx["eval"], ctx["device"]
    if ecfg.num_samples <= 0:  # eval switched off (benchmark presets)
        return {}
    if hasattr(data, "pixel_reference"):  # latents: decoded samples against the source pixels, read before sampling
        data = data.pixel_reference()
    labels = torch.arange(ecfg.num_samples, device=device) % data.spec["num_classes"]
    return image_metrics(generate_fn(labels, "eval: sampling"), labels, data, ctx)
