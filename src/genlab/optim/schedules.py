"""LR schedules: multipliers of optim.lr as pure functions of (step, total steps, optim config), so resume
needs no scheduler state."""
from __future__ import annotations

import math

from genlab.config import fields as cf
from genlab.core.registry import Registry

lr_schedule_registry = Registry("lr_schedule")


def _warmup(step, ocfg):
    return (step + 1) / ocfg.warmup_steps


@lr_schedule_registry.register("cosine", "linear warmup, then cosine decay to min_lr_ratio * lr")
def cosine(step, total, ocfg):
    if step < ocfg.warmup_steps:
        return _warmup(step, ocfg)
    progress = min(1.0, (step - ocfg.warmup_steps) / max(1, total - ocfg.warmup_steps))
    return ocfg.min_lr_ratio + (1 - ocfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@lr_schedule_registry.register("constant", "linear warmup, then constant")
def constant(step, total, ocfg):
    return min(1.0, (step + 1) / max(1, ocfg.warmup_steps))


@lr_schedule_registry.register("linear", "linear warmup, then linear decay to min_lr_ratio * lr")
def linear(step, total, ocfg):
    if step < ocfg.warmup_steps:
        return _warmup(step, ocfg)
    progress = min(1.0, (step - ocfg.warmup_steps) / max(1, total - ocfg.warmup_steps))
    return 1 - (1 - ocfg.min_lr_ratio) * progress


DECAY_SHAPES = {"linear": lambda x: 1 - x, "1-sqrt": lambda x: 1 - math.sqrt(x)}


def wsd_decay_start(total: int, ocfg) -> int:
    return total - int(round(WsdKeys.of(ocfg).decay_frac * total))


class WsdKeys(cf.Keys, section="optim"):
    decay_frac: float = cf.F(0.2, "wsd: fraction of the steps in the final decay", gt=0, le=1)
    decay_shape: str = cf.F("1-sqrt", "wsd: shape of the final decay (Hägele et al. 2024)", choices=("linear", "1-sqrt"))


@lr_schedule_registry.register("wsd", "warmup-stable-decay (Hägele et al. 2024): linear warmup, constant lr, then the last "
                                      "optim.decay_frac of the steps decay to min_lr_ratio * lr (optim.decay_shape)",
                               keys=WsdKeys)
def wsd(step, total, ocfg):
    if step < ocfg.warmup_steps:
        return _warmup(step, ocfg)
    start = wsd_decay_start(total, ocfg)
    if step < start:
        return 1.0
    progress = min(1.0, (step - start) / max(1, total - start))
    return ocfg.min_lr_ratio + (1 - ocfg.min_lr_ratio) * DECAY_SHAPES[WsdKeys.of(ocfg).decay_shape](progress)


def warmup_limit(total: int, ocfg) -> int:
    """The longest warm-up that still ends before the decay starts (wsd: its decay phase; otherwise the last step),
    so the LR reaches its peak and then follows the schedule to the end (docs/optimizers.md)."""
    return wsd_decay_start(total, ocfg) if ocfg.schedule == "wsd" else total - 1


def scaled_warmup(total: int, ocfg, preset_warmup: int, preset_total: int) -> int:
    """The preset's warm-up share of its own steps, applied to `total` steps (and kept within warmup_limit)."""
    return max(0, min(warmup_limit(total, ocfg), round(preset_warmup * total / preset_total)))


def lr_at(step: int, total: int, ocfg) -> float:
    """The learning rate of `step`: a pure function of the step, so resume needs no scheduler state."""
    return ocfg.lr * lr_schedule_registry.get(ocfg.schedule)(step, total, ocfg)
