"""Optimizers and LR schedules by name, from maintained libraries rather than hand-written update rules:
torch's own (Adam, AdamW, SGD), pytorch-optimizer (Shampoo, MARS, ADOPT), heavyball (SOAP, PSGD-Kron,
Muon) and torchao (8-bit, 4-bit and FP8 AdamW states); COAT's FP8 states are written here (coat.py) because its
package needs its own CUDA extension. Every entry takes the same parameter groups (optim/groups.py) and honours `optim.caution` (the
library's own cautious update where it has a faithful one, else optim/caution.py). Each family's module
registers its entries with `optimizer_entry` (optim/build.py); registry.load_entries finds them."""

# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan)
from genlab.optim import coat, heavyball_optimizers, lowbit, muon, pytorch_optimizer_library, schedules, shampoo, torch_optimizers  # noqa: F401,E402
