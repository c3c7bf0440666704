"""`method.teacher=RUN`: a frozen model built from another run's own saved config, for distillation methods.

A method calls `load_teacher(cfg.method.teacher)` and declares the result `Extra(teacher, trainable=False)`;
the trainer then moves it, freezes it, compiles it with the model and counts its forward FLOPs.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from genlab.errors import GenlabError


def load_teacher(run_or_ckpt: str, device="cpu") -> nn.Module:
    """The run's model with its EMA weights (raw weights when it kept no EMA), converted as it trained, frozen."""
    from genlab.registry import model_registry
    from genlab.train import checkpoint as ckpt
    from genlab.train.convert import apply_converters, converters_of
    if not run_or_ckpt:
        raise GenlabError("this method needs method.teacher=RUN (a run folder, checkpoint or exported model.safetensors)")
    state = ckpt.load_checkpoint(run_or_ckpt)
    cfg = ckpt.config_of(state)
    model = model_registry.get(cfg.model.name)(cfg.model, state["data_spec"])
    model.load_state_dict(state["ema"] if state.get("ema") is not None else state["model"])
    apply_converters(model.to(device), converters_of(cfg), torch.device(device))
    return model.requires_grad_(False).eval()
