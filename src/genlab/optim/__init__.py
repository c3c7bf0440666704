"""Optimizers and LR schedules by name, from maintained libraries rather than hand-written update rules: torch's own,
pytorch-optimizer, heavyball and torchao; COAT's FP8 states are written here (coat.py: its package needs its own
CUDA extension). Every entry takes the same parameter groups (groups.py) and honours `optim.caution` (the library's
own cautious update where it has a faithful one, else caution.py); each registers with `optimizer_entry` (build.py)."""

# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan)
from genlab.optim import build, coat, heavyball_optimizers, lowbit, pytorch_optimizer_library, schedules  # noqa: F401,E402
