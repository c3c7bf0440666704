"""What every method is: a loss over a batch dict, the batch keys it reads, and the extra modules it owns.

The trainer runs whatever a method declares (devices, freezing, parallel wrapping, compile, optimizers,
checkpoints, FLOPs), so a new family is one module and never an `if` in the trainer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch import Tensor

from genlab.errors import GenlabError


@dataclass
class StepContext:
    step: int                 # optimizer step about to be taken (0-based)
    total_steps: int
    generator: torch.Generator
    device: torch.device
    precision: str            # train.precision resolved (e.g. "fp32", "bf16")
    ema: nn.Module | None     # EMA of the model (read-only)
    extras: dict[str, nn.Module] = field(default_factory=dict)  # the method's extra modules as the trainer placed/wrapped them


@dataclass
class Extra:
    module: nn.Module
    trainable: bool                 # False: frozen (requires_grad_(False), eval mode, no optimizer, not in EMA)
    optimizer: str | None = None    # trainable only: None = joins the model's optimizer as its own param group; a name = its own optimizer
    lr: float | None = None         # None = cfg.optim.lr


class Method:
    """Base class of every method. Subclasses set `batch_keys` and implement `loss` (and sampling/eval)."""

    batch_keys: tuple[str, ...] = ()   # batch dict keys loss() reads; validated against the dataset spec's "batch_keys"

    def extra_modules(self) -> dict[str, Extra]:
        return {}

    def loss(self, model, batch: dict, ctx: StepContext) -> tuple[Tensor | dict[str, Tensor], dict]:
        """One scalar loss, or {"model": loss for the model's optimizer, "<optimizer name>": loss for that optimizer};
        the trainer back-propagates each loss only into its optimizer's parameters, in dict order."""
        raise NotImplementedError


def check_batch_keys(method: Method, spec: dict, method_name: str) -> None:
    """Before any work: the dataset must yield every key the method reads."""
    have = tuple(spec.get("batch_keys", ()))
    missing = [k for k in getattr(method, "batch_keys", ()) if k not in have]
    if missing:
        raise GenlabError(f"method {method_name} reads batch keys {', '.join(missing)} that the dataset does not provide "
                          f"(it yields: {', '.join(have) or 'none'})")


def check_extras(extras: dict[str, Extra], method_name: str) -> None:
    for name, e in extras.items():
        if name == "model":
            raise GenlabError(f"method {method_name}: an extra module may not be called 'model'")
        if not isinstance(e, Extra) or not isinstance(e.module, nn.Module):
            raise GenlabError(f"method {method_name}: extra '{name}' must be an Extra(module=nn.Module, ...)")
        if not e.trainable and (e.optimizer is not None or e.lr is not None):
            raise GenlabError(f"method {method_name}: frozen extra '{name}' cannot have an optimizer or lr")
        if e.optimizer == "model":
            raise GenlabError(f"method {method_name}: extra '{name}': optimizer=None joins the model's optimizer; "
                              "'model' is not an optimizer name")


def as_loss_dict(loss) -> dict[str, Tensor]:
    """A method's loss as {optimizer name: scalar}; a bare scalar belongs to the model's optimizer."""
    return dict(loss) if isinstance(loss, dict) else {"model": loss}


def plain_context(generator: torch.Generator, step: int = 0, total_steps: int = 1, precision: str = "fp32",
                  extras: dict | None = None) -> StepContext:
    """A StepContext outside the trainer (tests, notebooks): no EMA, the generator's device."""
    return StepContext(step=step, total_steps=total_steps, generator=generator, device=torch.device(generator.device),
                       precision=precision, ema=None, extras=extras or {})
