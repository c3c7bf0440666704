"""The method interface (StepContext, Extra, Method) from genlab.methods.base when it exists.

Until the spine branch lands on main this module carries a stand-in of exactly the same names, so the
world-model method codes against the final interface; delete the fallback once `methods/base.py` exists.
"""
from __future__ import annotations

try:
    from genlab.methods.base import Extra, Method, StepContext  # noqa: F401
except ImportError:
    from dataclasses import dataclass, field

    import torch
    import torch.nn as nn

    @dataclass
    class StepContext:
        step: int
        total_steps: int
        generator: torch.Generator
        device: torch.device
        precision: str
        ema: nn.Module | None = None
        extras: dict = field(default_factory=dict)

    @dataclass
    class Extra:
        module: nn.Module
        trainable: bool
        optimizer: str | None = None
        lr: float | None = None

    class Method:
        batch_keys: tuple = ()

        def extra_modules(self) -> dict:
            return {}

        def loss(self, model, batch, ctx):
            raise NotImplementedError
