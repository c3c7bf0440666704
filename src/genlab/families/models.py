"""The backbone registry (`model.name`): what a model declares about itself, and the tiny instance the contract test
(tests/unit/nn/test_contract.py) builds it from. Each backbone registers itself in its family's folder."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from genlab.core.registry import Registry, Spec


@dataclass(frozen=True)
class ModelExample:
    """What the contract test (tests/unit/nn/test_contract.py) builds a model from: a tiny data spec, inputs, the output shape,
    and extra option values to cover beyond each layer registry's entries."""
    spec: dict
    inputs: Callable              # inputs(spec, batch, generator) -> tuple of forward arguments
    output_shape: Callable        # output_shape(spec, batch) -> tuple
    option_cases: dict = None     # model.<key> -> values
    idle_params: tuple = ()       # parameters that these inputs leave at a zero gradient (MaskDiT's mask token, which
                                  # only masked forwards read); the contract checks them for a finite gradient only


@dataclass(frozen=True, kw_only=True)
class ModelSpec(Spec):
    family: str                            # what methods name in model_families
    sizes: dict | None = None              # model.size name -> (dim, depth, heads)
    grid_rank: int | None = None           # token grid: 2 = image patches, 1 = a sequence, None = neither
    layer_keys: tuple[str, ...] = ()       # model.* layer choices it builds from the registries (contract test)
    block_tokens: bool = False             # its blocks output the patch tokens [B, N, D] alone (REPA hooks them)
    masked_tokens: bool = False            # forward(..., keep=[B, K]) runs its encoder on those tokens only (MaskDiT)
    example: ModelExample | None = None    # the contract test's tiny instance
    default_position: str | None = None    # the position entry model.pos_emb=auto means
    check: Callable | None = None          # check(cfg, dim, heads, depth): shape constraints of its own options


model_registry = Registry("model", ModelSpec)
