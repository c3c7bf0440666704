"""Float8 linear layers for training through torchao (tensorwise or rowwise scaling), for the blocks' token-wise
matmuls only: float8 GEMMs need both dims divisible by 16, and the per-sample layers gain nothing but casting
overhead. The size filter `train.float8_min_dim` and torchao's thresholds: docs/precision.md; the decision per
linear is `model.float8_plan`.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.runtime.switches import check_float8_gpu

RECIPES = ("tensorwise", "rowwise")
# module-name parts that are never converted (embeddings, conditioning, output layers)
SKIP_PARTS = ("patch_embed", "t_embed", "y_embed", "tok_emb", "pos_emb", "embed", "final", "ada", "head", "lm_head")


# declared by the float8 converters (nn/convert.py); the float8_* precision aliases read it too
class Float8Keys(cf.Keys, section="train"):
    float8_min_dim: int = cf.F(0, "float8: convert a block linear only if in_features and out_features are both >= this "
                                  "(0 = every eligible linear); a value that keeps none is an error", ge=0)
    float8_all_gather: bool = cf.F(False, "float8 tensorwise under train.parallel=fsdp|hsdp: all-gather the sharded weights "
                                          "in float8 (half the bytes of bf16), scales precomputed after each optimizer step")


def _import_torchao():
    try:
        import torchao.float8 as f8
    except ImportError:
        raise GenlabError("float8 precision needs torchao: pip install torchao==0.18.0 "
                          "(on the GPU machine: pip install --no-deps wheels/torchao-*.whl)") from None
    return f8


def check_float8_device(device: torch.device) -> None:
    """An SM89+ GPU (runtime.switches.check_float8_gpu) and torchao, refused before training otherwise."""
    check_float8_gpu(device)
    _import_torchao()


def skip_reason(module: nn.Module, name: str, min_dim: int = 0) -> str:
    """Why float8 leaves this nn.Linear alone ("" = it converts it)."""
    if any(p in SKIP_PARTS for p in name.split(".")):
        return "embedding, conditioning or output layer"
    if module.in_features % 16 or module.out_features % 16:
        return "a dim not divisible by 16"
    if min(module.in_features, module.out_features) < min_dim:
        return f"below train.float8_min_dim={min_dim}"
    return ""


def float8_plan(model: nn.Module, min_dim: int = 0) -> list[tuple[str, int, int, str]]:
    """(name, in_features, out_features, why skipped or "") for every nn.Linear of the model, in module order."""
    return [(name, m.in_features, m.out_features, skip_reason(m, name, min_dim))
            for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def plan_summary(plan) -> str:
    """One line: how many linears float8 converts, and the skipped ones grouped by reason."""
    kept = sum(not why for *_, why in plan)
    skipped: dict[str, list[str]] = {}
    for name, i, o, why in plan:
        if why:
            skipped.setdefault(why, []).append(f"{name} ({i}->{o})")
    parts = [f"{len(v)} {why}: {', '.join(v[:4])}{' ...' if len(v) > 4 else ''}" for why, v in skipped.items()]
    return f"float8 converts {kept} of {len(plan)} linears" + (f"; skipped {'; '.join(parts)}" if parts else "")


def convert_float8(model: nn.Module, recipe: str, emulate: bool = False, min_dim: int = 0,
                   all_gather: bool = False) -> nn.Module:
    """Swap eligible nn.Linear modules for torchao Float8Linear in place (plan in `model.float8_plan`). `emulate`: plain
    torch ops (a CPU sampling a float8 run). `all_gather`: FSDP2 all-gathers the weights in float8 (tensorwise only;
    scales precomputed after each optimizer step: nn/convert.py)."""
    if recipe not in RECIPES:
        raise GenlabError(f"unknown float8 recipe '{recipe}'; valid: {', '.join(RECIPES)}")
    plan = float8_plan(model, min_dim)
    keep = {name for name, *_, why in plan if not why}
    if not keep:
        sizes = [min(i, o) for _, i, o, why in plan if why.startswith("below")]
        if not sizes:
            raise GenlabError("float8 finds no linear to convert in this model (block linears with both dims divisible "
                              "by 16); train without float8")
        raise GenlabError(f"train.float8_min_dim={min_dim} keeps no linear of this model (the largest smaller dim of its "
                          f"eligible linears is {max(sizes)}); lower it, or train without float8")
    f8 = _import_torchao()
    config = f8.Float8LinearConfig.from_recipe_name(recipe)
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    if all_gather:
        if recipe != "tensorwise":
            raise GenlabError(f"train.float8_all_gather needs the tensorwise recipe (one scale per weight); got {recipe}")
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    f8.convert_to_float8_training(model, module_filter_fn=lambda m, name: name in keep, config=config)
    model.float8_plan = plan
    return model


def count_float8(model: nn.Module) -> int:
    return sum(type(m).__name__ == "Float8Linear" for m in model.modules())
