"""Speed switches chosen by name (one override each, for sweeps): precision, compile, activation checkpointing; the
compiled optimizer + EMA update and LR setting without recompiles or host syncs."""
from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.core.registry import Registry
from genlab.runtime.parallel import local

precision_registry = Registry("precision")
compile_registry = Registry("compile")
compile_mode_registry = Registry("compile_mode")
ac_registry = Registry("activation_checkpointing")


@dataclass
class Precision:
    name: str
    autocast_dtype: torch.dtype | None = None   # None = no autocast
    loss_scaling: bool = False                  # fp16 needs a GradScaler
    tf32: bool = False
    convert: tuple = ()                         # model converters this precision implies (float8_* aliases)

    def autocast(self, device: torch.device, cache: bool = True):
        """cache=False for a region captured into a CUDA graph (PyTorch's rule for autocast under graphs: the cast
        cache would hold tensors across the capture's boundary)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.autocast_dtype, cache_enabled=cache)


# name -> (doc, the Precision's fields)
_PRECISIONS = {
    "fp32": ("full float32 (matmuls in IEEE fp32)", {}),
    "tf32": ("float32 weights, TF32 tensor-core matmuls (CUDA)", {"tf32": True}),
    "bf16": ("bf16 autocast, fp32 master weights and optimizer state", {"autocast_dtype": torch.bfloat16}),
    "fp16": ("fp16 autocast with dynamic loss scaling (skips overflowing steps)",
             {"autocast_dtype": torch.float16, "loss_scaling": True}),
}
for _name, (_doc, _kw) in _PRECISIONS.items():
    precision_registry.register(_name, _doc)(lambda device, _name=_name, _kw=_kw: Precision(_name, **_kw))


@precision_registry.register("auto", "bf16 autocast on CUDA, fp32 on CPU")
def _auto(device):
    return precision_registry.get("bf16" if device.type == "cuda" else "fp32")(device)


def check_float8_gpu(device: torch.device) -> None:
    """Float8 tensor cores exist from SM89 (Ada) / SM90 (Hopper) on; refuse anything else before training."""
    if device.type != "cuda":
        raise GenlabError(f"float8 precision needs an SM89+/SM90 CUDA GPU (H100/H200); this run is on {device.type}. "
                          "Use train.precision=bf16 here")
    cap = torch.cuda.get_device_capability(device)
    if cap < (8, 9):
        raise GenlabError(f"float8 precision needs compute capability >= 8.9 (H100/H200/L40S); "
                          f"{torch.cuda.get_device_name(device)} is {cap[0]}.{cap[1]}")


def _float8(recipe):
    # an alias kept for existing configs and sweeps: bf16 autocast + the train.convert entry float8_<recipe>
    def build(device):
        check_float8_gpu(device)  # before any model is built: H100/H200, else GenlabError (torchao: train.convert's check)
        return Precision(f"float8_{recipe}", autocast_dtype=torch.bfloat16, convert=(f"float8_{recipe}",))
    return build


for _recipe in ("tensorwise", "rowwise"):
    precision_registry.register(f"float8_{_recipe}", f"bf16 + train.convert=[\"float8_{_recipe}\"] (torchao float8 "
                                "linears, SM89+/H100)", reads=("train.float8_min_dim",))(_float8(_recipe))


def build_precision(name: str, device: torch.device) -> Precision:
    p = precision_registry.get(name)(device)
    torch.backends.cuda.matmul.allow_tf32 = p.tf32
    torch.backends.cudnn.allow_tf32 = p.tf32
    return p


def checkpoint_block(block: nn.Module, context_fn=None) -> nn.Module:
    """Recompute `block` in the backward pass instead of storing its activations. Its forward is replaced on the
    instance: the state-dict keys stay the plain model's and a later torch.compile / fully_shard sees the block itself."""
    inner = block.forward
    extra = {"context_fn": context_fn} if context_fn is not None else {}

    def forward(*args, **kwargs):
        return checkpoint(inner, *args, use_reentrant=False, **extra, **kwargs)
    block.forward = forward
    block._genlab_checkpointed = True
    return block


# ops whose outputs the selective policy keeps (the expensive ones); everything else is recomputed
_SAVE_OPS = {
    torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
}


def _selective_context():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


def _wrap_blocks(model, which, context_fn=None):
    for i, block in enumerate(model.blocks):
        if which(i) and not getattr(block, "_genlab_checkpointed", False):
            checkpoint_block(block, context_fn)
    return model


@ac_registry.register("none", "store all activations")
def ac_none(model, tcfg):
    return model


@ac_registry.register("full", "recompute every block in the backward pass")
def ac_full(model, tcfg):
    return _wrap_blocks(model, lambda i: True)


class AcEveryKeys(cf.Keys, section="train"):
    ac_every: int = cf.F(2, "activation_checkpointing=every_k: recompute every k-th block; =segments: the number of segments", ge=1)


@ac_registry.register("every_k", "recompute every train.ac_every-th block", keys=AcEveryKeys)
def ac_every_k(model, tcfg):
    k = max(1, AcEveryKeys.of(tcfg).ac_every)
    return _wrap_blocks(model, lambda i: i % k == 0)


@ac_registry.register("selective", "op-level policy: keep matmul/attention outputs, recompute the rest")
def ac_selective(model, tcfg):
    return _wrap_blocks(model, lambda i: True, context_fn=_selective_context)


@compile_registry.register("off", "eager")
def compile_off(model, tcfg):
    return model


# train.compile_mode: the `mode` handed to torch.compile (None = torch's default).
for _name, _doc in (("default", "torch.compile's default: inductor kernels, no CUDA graphs, no GEMM autotuning"),
                    ("reduce-overhead", "CUDA graphs around the compiled graphs (fewer launches; more memory)"),
                    ("max-autotune", "autotuned GEMM/conv templates and CUDA graphs (long first compile)"),
                    ("max-autotune-no-cudagraphs", "autotuned GEMM/conv templates, no CUDA graphs")):
    compile_mode_registry.register(_name, _doc)(None if _name == "default" else _name)


def _mode(tcfg):
    return compile_mode_registry.get(tcfg.compile_mode)


def guard_module_hooks():
    """Compiled code is shared by every instance of a module class and by default does not guard forward hooks: a model
    compiled after another of its class would silently skip its own (REPA's feature tap). Set before each compile."""
    import torch._dynamo
    torch._dynamo.config.skip_nnmodule_hook_guards = False


def allow_retained_backward():
    """A method with several optimizers back-propagates each loss with retain_graph=True through graph parts they
    share (a discriminator's forward); compiled backwards that donate their saved buffers refuse that, so they
    keep them (a little more memory, only in such runs)."""
    import torch._functorch.config as functorch_config
    functorch_config.donated_buffer = False


@compile_registry.register("model", "torch.compile the whole model")
def compile_model(model, tcfg):
    guard_module_hooks()
    return torch.compile(model, mode=_mode(tcfg))


@compile_registry.register("blocks", "torch.compile each block (composes with FSDP and checkpointing)")
def compile_blocks(model, tcfg):
    guard_module_hooks()
    for block in model.blocks:
        block.compile(mode=_mode(tcfg))  # in place: parameter names stay those of the plain model
    return model


def apply_switches(model, tcfg):
    return ac_registry.get(tcfg.activation_checkpointing)(model, tcfg)


def compile_model_by_name(model, tcfg):
    return compile_registry.get(tcfg.compile)(model, tcfg)


def compile_extra(module, tcfg):
    """A method's extra module is compiled whole whenever the model is compiled at all (extras have no blocks)."""
    return module if tcfg.compile == "off" else compile_model(module, tcfg)


# -- compiled autograd, compiled optimizer step, recompile counting -------------------------------
def backward_context(tcfg):
    """Around loss.backward(): compiled autograd traces the whole backward graph (one graph, fusable)."""
    if not tcfg.compiled_autograd:
        return contextlib.nullcontext()
    from torch._dynamo import compiled_autograd
    enable = getattr(compiled_autograd, "_enable", None) or compiled_autograd.enable
    return enable(torch.compile(dynamic=False))


def compile_optimizer_step(optimizer, device):
    """Rebuild a torch optimizer for a compiled `step` (train.compile_optimizer, docs/performance.md): the LR a 0-d
    tensor per group (a float would recompile at every schedule change), the single-tensor path, capturable on CUDA."""
    if type(optimizer) not in (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD):
        raise GenlabError(f"train.compile_optimizer=true works with torch's adamw, adam and sgd; "
                          f"{type(optimizer).__module__}.{type(optimizer).__name__} cannot (heavyball compiles its own step)")
    groups = []
    for g in optimizer.param_groups:
        g = {k: v for k, v in g.items() if k not in ("fused", "foreach", "capturable")}
        g["lr"] = torch.tensor(float(g["lr"]), device=device)
        g["capturable"] = torch.device(device).type == "cuda"
        groups.append(g)
    new = type(optimizer)(groups, lr=groups[0]["lr"], foreach=False, fused=False)
    new.step = torch.compile(new.step, fullgraph=False)
    return new


def update_mode(tcfg):
    """The torch.compile mode of the optimizer + EMA update: the run's mode without CUDA graphs (cudagraph trees count
    the gradients of the backward's graph pool as overwritten and the first step fails: pytorch/pytorch#160281)."""
    mode = _mode(tcfg)
    return {"reduce-overhead": None, "max-autotune": "max-autotune-no-cudagraphs"}.get(mode, mode)


@torch.no_grad()
def ema_update_device_weight(ema: list, params: list, weight: torch.Tensor) -> None:
    """ema += w * (p - ema), w a 0-d device tensor: the decay warm-up needs no recompile or re-capture (foreach lerp has
    no tensor-weight overload: eagerly it reads the weight back to the host)."""
    diff = torch._foreach_sub(params, ema)
    torch._foreach_mul_(diff, weight)
    torch._foreach_add_(ema, diff)


class CompiledUpdate:
    """The optimizer steps and the EMA update (weight 1 - decay in a 0-d tensor) as one function compiled in
    `update_mode` (`train.compile_optimizer=true`); not with a GradScaler or after-step hooks."""

    def __init__(self, optimizers, ema_params, params, tcfg, device):
        self.optimizers = list(optimizers)
        # torch's Optimizer.step wrapper calls torch._dynamo.graph_break() around the step (so that aot sees a no-grad
        # graph); inside this function's loop that break made dynamo skip the whole update and run it eagerly. The
        # undecorated step, called under no_grad (`__call__`), traces into one graph with the EMA.
        self._steps = [functools.partial(inspect.unwrap(type(o).step), o) for o in self.optimizers]
        self.ema = [local(p) for p in ema_params] if ema_params is not None else None
        self.params = [local(p) for p in params] if ema_params is not None else None
        self.weight = torch.zeros((), device=device)
        self._fn = torch.compile(self._update, mode=update_mode(tcfg))

    def _update(self):
        for step in self._steps:
            step()
        if self.ema is not None:
            ema_update_device_weight(self.ema, self.params, self.weight)

    def __call__(self, decay: float | None):
        if self.ema is not None:
            self.weight.fill_(1.0 - decay)
        with torch.no_grad():
            self._fn()


def set_lr(optimizer, lr: float):
    """Set the LR of every group (times its `lr_scale`: extras with their own LR); tensor LRs are filled in place."""
    for g in optimizer.param_groups:
        v = lr * g.get("lr_scale", 1.0)
        if torch.is_tensor(g["lr"]):
            g["lr"].fill_(v)
        else:
            g["lr"] = v


def lr_value(optimizer) -> float:
    lr = optimizer.param_groups[0]["lr"]
    return float(lr) if torch.is_tensor(lr) else lr


def compile_counts() -> dict:
    """Dynamo's running totals: graphs compiled so far and frames it had to recompile after a guard failed."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # noqa: BLE001 - informational only
        return {"graphs": 0, "recompiles": 0}
    return {"graphs": int(counters["stats"].get("unique_graphs", 0)),
            "recompiles": int(sum(counters["recompiles"].values())) if "recompiles" in counters else 0}
