"""Float8 linear layers for training through torchao (tensorwise or rowwise scaling).

Only the token-wise matmuls of the blocks are converted: float8 GEMMs need both weight dims divisible
by 16, and the small per-sample layers (adaLN modulation, timestep/class embeddings, the final
projection) gain nothing but casting overhead and hurt accuracy at the output.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from genlab.errors import GenlabError

RECIPES = ("tensorwise", "rowwise")
# module-name parts that are never converted (embeddings, conditioning, output layers)
SKIP_PARTS = ("patch_embed", "t_embed", "y_embed", "tok_emb", "pos_emb", "embed", "final", "ada", "head", "lm_head")


def _import_torchao():
    try:
        import torchao.float8 as f8
    except ImportError:
        raise GenlabError("float8 precision needs torchao: pip install torchao==0.18.0 "
                          "(on the GPU machine: pip install --no-deps wheels/torchao-*.whl)") from None
    return f8


def check_float8_device(device: torch.device) -> None:
    """Float8 tensor cores exist from SM89 (Ada) / SM90 (Hopper) on; refuse anything else before training."""
    if device.type != "cuda":
        raise GenlabError(f"float8 precision needs an SM89+/SM90 CUDA GPU (H100/H200); this run is on {device.type}. "
                          "Use train.precision=bf16 here")
    cap = torch.cuda.get_device_capability(device)
    if cap < (8, 9):
        raise GenlabError(f"float8 precision needs compute capability >= 8.9 (H100/H200/L40S); "
                          f"{torch.cuda.get_device_name(device)} is {cap[0]}.{cap[1]}")
    _import_torchao()


def float8_filter(module: nn.Module, name: str) -> bool:
    """True for the Linear layers worth converting: inside a block, both dims divisible by 16."""
    if not isinstance(module, nn.Linear):
        return False
    if module.in_features % 16 or module.out_features % 16:
        return False
    parts = name.split(".")
    return not any(p in SKIP_PARTS for p in parts)


def convert_float8(model: nn.Module, recipe: str, emulate: bool = False) -> nn.Module:
    """Swap eligible nn.Linear modules for torchao Float8Linear in place; returns the model. `emulate`: float8
    arithmetic in plain torch ops (a CPU loading a float8-trained run to sample it)."""
    if recipe not in RECIPES:
        raise GenlabError(f"unknown float8 recipe '{recipe}'; valid: {', '.join(RECIPES)}")
    f8 = _import_torchao()
    config = f8.Float8LinearConfig.from_recipe_name(recipe)
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    f8.convert_to_float8_training(model, module_filter_fn=float8_filter, config=config)
    return model


def count_float8(model: nn.Module) -> int:
    """Number of Float8Linear modules (for logs and tests)."""
    return sum(type(m).__name__ == "Float8Linear" for m in model.modules())
