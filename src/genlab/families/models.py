"""The backbone registry (`model.name`): what a model declares about itself, and the tiny instance the contract test
(tests/unit/nn/test_contract.py) builds it from. Each backbone registers itself in its family's folder."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from genlab.config.check import _trains_on_cpu, read_keys
from genlab.core.errors import GenlabError, did_you_mean
from genlab.core.registry import Registry, Spec
from genlab.data.datasets import dataset_registry
from genlab.nn.attention_spec import attention_registry
from genlab.nn.mlp import mlp_registry
from genlab.nn.positions import position_registry


@dataclass(frozen=True)
class ModelExample:
    """What the contract test (tests/unit/nn/test_contract.py) builds a model from."""
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

    def check_choice(self, cfg, key, name, registry):
        """model.name=NAME: its size, and the layer entries it builds (model.attention, mlp, pos_emb) against its width,
        heads and token grid; its own check; the patch size against the data's image size."""
        m = cfg.model
        if self.sizes is None:
            return
        if m.size not in self.sizes:
            raise GenlabError(f"unknown model.size '{m.size}' for model {m.name}{did_you_mean(m.size, self.sizes)}; valid: {', '.join(self.sizes)}")
        dim, depth, heads = model_size(m, self.sizes, m.name)
        if dim % heads:
            raise GenlabError(f"model.heads ({heads}) must divide model.dim ({dim})")
        if m.pos_emb != "auto":  # the entry must fit the token grid
            fits = [n for n, s in position_registry.specs() if self.grid_rank in s.axes]
            position_registry.get(m.pos_emb)
            if self.grid_rank is not None and m.pos_emb not in fits:
                raise GenlabError(f"model.pos_emb={m.pos_emb} does not fit model {m.name}; valid choices: auto, {', '.join(fits)}")
        if self.check is not None:
            self.check(cfg, dim, heads, depth)
        self._check_layers(m, dim, heads, registry)
        if _trains_on_cpu(cfg.train.device) and not attention_registry.spec(m.attention).cpu_backward:
            raise GenlabError(f"model.attention={m.attention} has no backward pass on the CPU (train.device=cpu); "
                              f"train with sdpa or math there (sampling and eval run the forward anywhere)")
        if self.grid_rank == 2 and "model.patch_size" in read_keys(cfg):
            shape_of = dataset_registry.spec(cfg.data.name).shape
            shape = shape_of(cfg.data) if shape_of is not None else None
            side = shape["image_size"] if shape else None
            if side is not None and side % m.patch_size:
                raise GenlabError(f"model.patch_size ({m.patch_size}) must divide the image size ({side}) of data.name={cfg.data.name}")

    def _check_layers(self, m, dim: int, heads: int, registry):
        """Layer choices that cannot work with this model's shape or token layout, from the entries' specs."""
        hd = dim // heads
        if "mlp" in self.layer_keys and mlp_registry.spec(m.mlp).needs_grid and self.grid_rank != 2:
            grids = [n for n, s in registry.specs() if s.grid_rank == 2 and "mlp" in s.layer_keys]
            raise GenlabError(f"model.mlp={m.mlp} convolves over the patch grid; model {m.name} has no grid: "
                              f"choose model.mlp=gelu|swiglu or model.name={'|'.join(grids)}")
        k = attention_registry.spec(m.attention).head_multiple
        if hd % k:
            raise GenlabError(f"model.attention={m.attention} needs a head width divisible by {k}; model.dim/model.heads = {hd}")
        pos = self.default_position if m.pos_emb == "auto" else m.pos_emb
        if pos is not None and "pos_emb" in self.layer_keys:
            p = position_registry.spec(pos)
            if hd % p.head_multiple:
                raise GenlabError(f"model.pos_emb={pos} needs a head width divisible by {p.head_multiple}; "
                                  f"model.dim/model.heads = {hd}")
            if dim % p.dim_multiple:
                raise GenlabError(f"model.pos_emb={pos} needs model.dim divisible by {p.dim_multiple}, got {dim}")


model_registry = Registry("model", ModelSpec)


def model_size(cfg_model, sizes: dict, model: str) -> tuple[int, int, int]:
    """(dim, depth, heads) of model.size, each replaced by model.dim|depth|heads where set."""
    if cfg_model.size not in sizes:
        raise GenlabError(f"unknown {model} size '{cfg_model.size}'; valid: {', '.join(sizes)}")
    dim, depth, heads = sizes[cfg_model.size]
    return cfg_model.dim or dim, cfg_model.depth or depth, cfg_model.heads or heads
