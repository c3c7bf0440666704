"""Name -> spec registries, so every interchangeable part is chosen by a config string.

An entry is registered next to its code with a typed spec: its builder, a one-line doc, the config keys it reads
(`keys`: its typed `config.fields.Keys` classes; `reads`: keys another component declares) and its
capabilities as fields of the registry's spec class. A misspelt capability is a TypeError at import, and config
validation, `genlab config` and docs/config.md are derived from the specs.

Registration without an import cycle: this module imports nothing of genlab but its errors. The modules that
register entries import it; a lookup imports them on first use (`load_entries`): each component package's
__init__ imports its own registering modules, and load_entries imports those packages by name.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from genlab.core.errors import GenlabError, did_you_mean

REGISTRIES: dict[str, "Registry"] = {}
_loaded = False
generation = 0  # bumped on every registration: derived config classes are rebuilt when it moves


# the packages whose __init__ imports the modules that register components (each package lists its own files)
COMPONENT_PACKAGES = ("genlab.runtime", "genlab.nn", "genlab.optim", "genlab.data", "genlab.sampling", "genlab.eval",
                      "genlab.families")


def load_entries():
    """Import every registering module once (idempotent), then the files named by $GENLAB_PLUGINS
    (os.pathsep-separated module names or .py paths: a component of your own in one file)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for name in COMPONENT_PACKAGES:  # by name: the registry sits below every floor it loads
        importlib.import_module(name)
    families = importlib.import_module("genlab.families")
    for info in pkgutil.iter_modules(families.__path__):  # one package per family: its folder is its registration
        if info.ispkg:
            importlib.import_module(f"genlab.families.{info.name}")
    for item in filter(None, os.environ.get("GENLAB_PLUGINS", "").split(os.pathsep)):
        load_plugin(item)


def load_plugin(item: str):
    """Import one plugin: a module name, or a .py file (registered under its file stem)."""
    if not item.endswith(".py"):
        return importlib.import_module(item)
    import sys
    p = Path(item)
    if not p.is_file():
        raise GenlabError(f"plugin file '{item}' not found ($GENLAB_PLUGINS)")
    name = f"genlab_plugin_{p.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, p)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


# -- specs: what an entry declares about itself --------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Spec:
    builder: Any                  # the registered function, class or value
    doc: str = ""
    keys: Any = ()                # the config.fields.Keys class (or a tuple of them) this entry reads (it owns them)
    reads: tuple[str, ...] = ()   # dotted keys declared by another component that this entry reads too
    defaults: dict | None = None  # {dotted key: value} this entry brings when chosen: over what an earlier config
                                  # layer set for the entry it replaced (config.component_defaults)


@dataclass(frozen=True, kw_only=True)
class MethodSpec(Spec):
    data_kinds: tuple[str, ...] = ()      # dataset kinds it trains on (DatasetSpec.kind)
    model_families: tuple[str, ...] = ()  # backbone families it drives (ModelSpec.family)
    causal: bool | None = None            # the attention a model with a `model.causal` key must use
    check: Callable | None = None         # check(cfg): the method's own config checks, before any work
    sampling_keys: tuple[str, ...] = ()   # its keys that act only at sampling time (eval/sample may override them)
    conditions: dict | None = None        # extra model inputs {name: embedder} (nn/conditions.py), e.g. a step size
    output: str = ""                      # what its model predicts ("velocity": a flow teacher for few-step methods)
    batched_seeds: bool = False           # train.seeds: its loss splits into loss_inputs (draws) + loss_from (vmappable)
    final_loss: bool = False              # its loss runs through the backbone's final layer + loss (model.final_kernel)
    graph_step: bool = False              # train.graph_step: its loss is the same computation every step (no Python on
                                          # the step number, no host reads or host randomness), so one capture replays it

    def __post_init__(self):  # the attention it needs is also the one it brings when chosen (component defaults)
        if self.causal is not None:
            object.__setattr__(self, "defaults", {"model.causal": self.causal, **(self.defaults or {})})


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


@dataclass(frozen=True, kw_only=True)
class DatasetSpec(Spec):
    kind: str                              # image | token | episodes
    needs_path: bool = False               # reads a folder written by `genlab data ...` (data.path)
    synthetic: bool = False                # random data for benchmarks: `shape` gives its whole data spec
    shape: Callable | None = None          # shape(cfg_data) -> {kind, image_size, channels, num_classes} or None,
                                           # known without loading the data
    check: Callable | None = None          # check(cfg_data): its own option checks
    eval_check: Callable | None = None     # eval_check(cfg): files its evaluation reads (a latent set's source
                                           # pixels), before training or evaluation starts


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(Spec):
    cpu_backward: bool = True              # has a backward pass on the CPU
    flops: Callable | None = None          # flops(n, m, head_dim) of one head, n queries over m keys (None: softmax's)
    causal_flops: Callable | None = None   # the causal form's, where it runs different matmuls
    check: Callable | None = None          # check(head_dim): GenlabError at build time where it cannot run
    head_multiple: int = 1                 # the head width must be a multiple of this (checked with the config)
    # forward-mode AD (a JVP: MeanFlow's target) through the entry as it runs in training: plain torch ops have it,
    # fused kernels (SDPA's flash/cuDNN/efficient, flex, Triton) do not; models/attention.forward_ad_attention
    # then holds SDPA to its math kernel and runs `jvp_fallback` in the entry's place (the same function in ops
    # that have it; None = the entry itself, whose SDPA calls the math kernel then serves)
    forward_ad: bool = True
    jvp_fallback: Callable | None = None
    # the same function in ops that run under torch.vmap where the entry's kernels do not (SDPA's, for a bf16 model
    # on CUDA: batched seeds); models/attention.plain_softmax_attention swaps it in
    vmap_fallback: Callable | None = None


@dataclass(frozen=True, kw_only=True)
class KernelSpec(Spec):
    """A kernel choice with a plain-PyTorch path elsewhere: `cuda_only` entries refuse CPU training at config time
    (their forward still runs anywhere, as the plain composition), `package` names the import it needs."""
    cuda_only: bool = False                # its fused kernel runs on CUDA tensors only
    package: str = ""                      # top-level module it imports on CUDA (checked with the config)


@dataclass(frozen=True, kw_only=True)
class MlpSpec(KernelSpec):  # kernel variants (swiglu_liger) refuse CPU training like the other kernel keys
    needs_grid: bool = False               # convolves over the 2-D patch grid
    hidden_of: Callable = lambda hidden: hidden  # its own width from the GELU width of model.mlp_ratio
    matrices: int = 2                      # dim x hidden matrices it multiplies (FLOPs)
    grid_flops: Callable | None = None     # grid_flops(grid_tokens, hidden): extra FLOPs over the patch grid


@dataclass(frozen=True, kw_only=True)
class MetricSpec(Spec):
    check: Callable | None = None          # check(cfg.eval): before training or sampling (weights present, enough samples)


@dataclass(frozen=True, kw_only=True)
class PositionSpec(Spec):
    axes: tuple[int, ...] = ()             # token-grid ranks it fits (1: sequences, 2: patch grids)
    head_multiple: int = 1                 # the head width must be a multiple of this (rotations in pairs per axis)
    dim_multiple: int = 1                  # the model width must be a multiple of this (sin-cos per axis)


@dataclass(frozen=True, kw_only=True)
class SamplerSpec(Spec):
    nfe_per_step: int = 1                  # model evaluations per step (NFE = steps * this)
    condition: str | None = None           # a model condition it sets itself at every step (e.g. "d", the step size)


@dataclass(frozen=True, kw_only=True)
class ParallelSpec(Spec):
    sharded: bool = False                  # shards parameters and optimizer state (the optimizer must update DTensors)


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec(Spec):
    fsdp: bool = True                      # can update DTensor shards (train.parallel=fsdp|hsdp)
    preconditioned: bool = False           # keeps a preconditioner (optim.precondition_every)
    muon_groups: bool = False              # splits parameters into Muon and AdamW groups (optim.muon_scope)
    heavyball: bool = False                # backed by heavyball (optim.heavyball_compile)


@dataclass(frozen=True, kw_only=True)
class AdalnSpec(KernelSpec):
    # fused forms of the two residual steps around it in a DiT block (models/norm.residual_ops_by); None = plain
    add_norm: Callable | None = None       # (x, y, gate, shift, scale, eps) -> (x + gate*y, norm_modulate(that))
    gated_add: Callable | None = None      # (x, y, gate) -> x + gate*y


def spec_with_arg(registry: "Registry", value: str, label: str) -> tuple[str, str, Any]:
    """'NAME[:ARG]' chosen by `label` (a config key or option) -> (name, arg, spec), for registries whose specs
    declare `arg` (what ARG names, "" = none): one-line GenlabErrors for an unknown name or a missing/extra ARG."""
    name, _, arg = str(value).partition(":")
    try:
        spec = registry.spec(name)
    except GenlabError as e:  # unknown name: one line with the valid choices
        raise GenlabError(f"{label}: {e}") from None
    if spec.arg and not arg:
        raise GenlabError(f"{label}={name} needs {spec.arg}: {label}={name}:<{spec.arg}>")
    if not spec.arg and arg:
        raise GenlabError(f"{label}={name} takes no ':{arg}'")
    return name, arg, spec


@dataclass(frozen=True, kw_only=True)
class RepaEncoderSpec(Spec):
    """A frozen image encoder REPA aligns to, chosen by `method.repa_encoder=NAME[:ARG]`: builder(arg, cfg, data_spec,
    grid) -> module mapping images in [-1, 1] to [B, grid^2, D] (attributes out_dim, flops_per_sample())."""
    check: Callable | None = None          # check(arg, cfg): one-line GenlabError before any work (missing files...)
    arg: str = ""                          # what ARG names ("" = takes none)


@dataclass(frozen=True, kw_only=True)
class AutoencoderSpec(Spec):
    """An image autoencoder for latent diffusion, chosen by a string NAME[:ARG] (`genlab data encode --vae`,
    data.vae): builder(arg, device) -> genlab.nn.autoencoders.LatentCodec."""
    check: Callable | None = None          # check(arg): one-line GenlabError before any work (missing files...)
    arg: str = ""                          # what ARG names ("" = takes none)


class Registry:
    def __init__(self, kind: str, spec: type = Spec):
        self.kind = kind
        self.spec_type = spec
        self._specs: dict[str, Spec] = {}
        REGISTRIES[kind] = self

    def register(self, name: str, doc: str = "", **fields):
        """Decorator: `@registry.register("name", "doc", keys=..., <capability>=...)`; the registered object is
        returned unchanged. Also usable as `registry.register(name, doc, ...)(value)` for plain values."""
        def wrap(fn):
            global generation
            if name in self._specs:
                raise ValueError(f"{self.kind} '{name}' registered twice")
            first_line = doc or (getattr(fn, "__doc__", None) or "").strip().split("\n")[0]
            self._specs[name] = self.spec_type(builder=fn, doc=first_line, **fields)
            generation += 1
            return fn
        return wrap

    def unregister(self, name: str):
        """Remove an entry (tests that register a toy component)."""
        global generation
        self._specs.pop(name, None)
        generation += 1

    def _find(self, name: str) -> Spec:
        if name not in self._specs:
            load_entries()
        if name not in self._specs:
            raise GenlabError(f"unknown {self.kind} '{name}'{did_you_mean(str(name), self._specs)}; "
                              f"valid choices: {', '.join(sorted(self._specs))}")
        return self._specs[name]

    def get(self, name: str):
        """The registered builder (function, class or value)."""
        return self._find(name).builder

    def spec(self, name: str) -> Spec:
        return self._find(name)

    def doc(self, name: str) -> str:
        load_entries()
        return self._specs[name].doc if name in self._specs else ""

    def names(self):
        load_entries()
        return sorted(self._specs)

    def __contains__(self, name):
        if name not in self._specs:
            load_entries()
        return name in self._specs

    def items(self):
        """(name, builder) pairs, sorted by name."""
        load_entries()
        return [(n, s.builder) for n, s in sorted(self._specs.items())]

    def specs(self):
        """(name, spec) pairs, sorted by name."""
        load_entries()
        return sorted(self._specs.items())


def all_registries():
    """Import every module that registers something, then return the registries."""
    load_entries()
    return dict(sorted(REGISTRIES.items()))


# Every registry of the project; `genlab list` prints them all.
model_registry = Registry("model", ModelSpec)
attention_registry = Registry("attention", AttentionSpec)
method_registry = Registry("method", MethodSpec)
timestep_sampler_registry = Registry("timestep_sampler")
sampler_registry = Registry("sampler", SamplerSpec)
step_schedule_registry = Registry("step_schedule")
loss_weighting_registry = Registry("loss_weighting")
dataset_registry = Registry("dataset", DatasetSpec)
optimizer_registry = Registry("optimizer", OptimizerSpec)
lr_schedule_registry = Registry("lr_schedule")
precision_registry = Registry("precision")
compile_registry = Registry("compile")
ac_registry = Registry("activation_checkpointing")
parallel_registry = Registry("parallel", ParallelSpec)
adaln_registry = Registry("adaln", AdalnSpec)
ce_kernel_registry = Registry("ce_kernel", KernelSpec)
qkv_kernel_registry = Registry("qkv_kernel", KernelSpec)
final_kernel_registry = Registry("final_kernel", KernelSpec)
residual_registry = Registry("residual")
compile_mode_registry = Registry("compile_mode")
convert_registry = Registry("convert")
mlp_registry = Registry("mlp", MlpSpec)
norm_registry = Registry("norm")
position_registry = Registry("position", PositionSpec)
eval_metric_registry = Registry("eval_metric", MetricSpec)
world_objective_registry = Registry("world_objective")
ptq_registry = Registry("quant_format")  # post-training weight formats (`genlab quantize RUN --to NAME`), genlab/nn/ptq.py
repa_encoder_registry = Registry("repa_encoder", RepaEncoderSpec)
autoencoder_registry = Registry("autoencoder", AutoencoderSpec)  # genlab/nn/autoencoders/
