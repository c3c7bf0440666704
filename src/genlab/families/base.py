"""What every method is: a loss over a batch dict, the batch keys it reads, the extra modules it owns, and how it
generates (files: its family's render.py). The trainer runs whatever a method declares, never an `if` per family.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn
from torch import Tensor

from genlab.core.errors import GenlabError
from genlab.core.registry import Registry, Spec
from genlab.families.baselines import Baseline


@dataclass
class StepContext:
    step: int                 # optimizer step about to be taken (0-based)
    total_steps: int
    generator: torch.Generator
    device: torch.device
    precision: str            # train.precision resolved (e.g. "fp32", "bf16")
    ema: nn.Module | None     # EMA of the model (read-only; compiled when the model is)
    extras: dict[str, nn.Module] = field(default_factory=dict)  # the method's extra modules as the trainer placed/wrapped them


@dataclass
class Extra:
    module: nn.Module
    trainable: bool                 # False: frozen (requires_grad_(False), eval mode, no optimizer, not in EMA)
    optimizer: str | None = None    # trainable only: None = joins the model's optimizer as its own param group; a name = its own optimizer
    lr: float | None = None         # None = cfg.optim.lr
    betas: tuple[float, float] | None = None  # a named optimizer's Adam betas; None = cfg.optim.betas (GAN critics: beta1 0)


class Method:
    """Base class of every method: its whole contract, with defaults. Subclasses set `batch_keys` and implement
    `loss`; the rest is optional. Front ends (CLI, API, eval, play) call only these, never ask which method it is."""

    batch_keys: tuple[str, ...] = ()     # batch dict keys loss() reads; validated against the dataset spec's "batch_keys"
    best_metric: str | None = None       # log.keep_best keeps the checkpoint with the lowest value of this eval metric
    sample_options: tuple[str, ...] = ()  # keyword options of draw() (Run.sample); anything else is refused
    interactive: bool = False            # generates frames from live controls (`genlab play`)
    render = None  # the family's render module: sample_to_file(method, model, out, ...), preview(method, model, path, ctx)

    # capabilities, read from the registered class where they are used (config/check.py reaches it by name)
    data_kinds: tuple[str, ...] = ()      # dataset kinds it trains on (DatasetSpec.kind)
    model_families: tuple[str, ...] = ()  # backbone families it drives (ModelSpec.family)
    causal: bool | None = None            # the attention a model with a `model.causal` key must use (and gets)
    sampling_keys: tuple[str, ...] = ()   # its keys that act only at sampling time (eval/sample may override them)
    conditions: dict | None = None        # extra model inputs {name: embedder} (nn/conditions.py), e.g. a step size
    output: str = ""                      # what its model predicts ("velocity": a flow teacher for few-step methods)
    # what its loss vouches for, so never inherited: a subclass that keeps them says so again (__init_subclass__)
    batched_seeds: bool = False           # train.seeds (training/seeds.py): loss == loss_from(loss_inputs), below
    final_loss: bool = False              # its loss runs through the backbone's final layer + loss (model.final_kernel)
    graph_step: bool = False              # train.graph_step (training/graph_step.py): the same computation every step
                                          # (no Python on the step number, no host reads or host randomness)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in ("batched_seeds", "final_loss", "graph_step"):
            setattr(cls, name, vars(cls).get(name, False))

    @staticmethod
    def check_config(cfg) -> None:
        """The method's own config checks, before any work (config validation): one-line GenlabErrors."""

    def extra_modules(self) -> dict[str, Extra]:
        return {}

    def init_weights(self, model) -> None:
        """A fresh run's starting weights (not on resume or train.init_from); default: the backbone's own init."""

    def loss(self, model, batch: dict, ctx: StepContext) -> tuple[Tensor | dict[str, Tensor], dict]:
        """One scalar loss, or {"model": loss for the model's optimizer, "<optimizer name>": loss for that optimizer};
        the trainer back-propagates each loss only into its optimizer's parameters, in dict order."""
        raise NotImplementedError

    # batched seeds (docs/performance.md): loss == loss_from(model, loss_inputs(...)), the draws outside torch.vmap
    def loss_inputs(self, model, batch: dict, ctx: StepContext) -> dict[str, Tensor]:
        """The tensors one loss draws (noise, times, masks), each with the batch as its leading dimension or a scalar."""
        raise NotImplementedError

    def loss_from(self, model, inputs: dict[str, Tensor]) -> tuple[Tensor, dict]:
        """The loss and metrics given loss_inputs' draws; `model` is any callable with the backbone's signature."""
        raise NotImplementedError

    def train_flops_per_sample(self, model, total_steps: int) -> int:
        """Training FLOPs of one sample in one step (forward + backward; steps that differ in cost: the run's mean)."""
        return 3 * model.flops_per_sample()  # forward + backward (2x): docs/performance.md, MFU

    def trivial_baselines(self, data, generator: torch.Generator) -> list[Baseline]:
        """The levels of predictors that ignore their input (families/baselines.py), for the stall watcher; a method
        without any says why in a comment (tests/unit/families/test_baselines.py)."""
        return []

    def check_eval(self, cfg) -> None:
        """Before training or sampling: evaluation settings that need files (weights) or the data."""

    def evaluate(self, model, data, ctx) -> dict:
        """Metrics of a trained model (ctx: sampling.eval_context). Default: none."""
        return {}

    def preview(self, model, path, ctx):
        """The trainer's picture/text/video of samples at `path` (its suffix the renderer's); None = no preview."""
        return self.render.preview(self, model, path, ctx) if self.render else None

    def synthetic_batch(self, batch_size: int, device, generator) -> dict:
        """A batch of the right shapes for `genlab bench` (random values). Default: class-labelled images."""
        spec = getattr(self, "spec", {})
        if spec.get("kind") != "image":
            raise GenlabError(f"method {type(self).__name__} has no synthetic_batch for data of kind {spec.get('kind')!r}")
        C, S = spec["channels"], spec["image_size"]
        return {"image": torch.randn((batch_size, C, S, S), generator=generator, device=device),
                "label": torch.randint(0, spec["num_classes"], (batch_size,), generator=generator, device=device)}

    def draw(self, model, n: int, *, steps=None, generator=None, device=None, **options):
        """n samples as tensors (images in [-1, 1] [n, C, H, W], or token ids [n, L]); `options` are sample_options."""
        raise GenlabError(f"method {type(self).__name__} samples from data context (e.g. past frames and controls), "
                          f"not from noise alone: use `genlab sample RUN`")

    def decode(self, samples) -> list[str]:
        """Samples from draw() as text (language models)."""
        raise GenlabError(f"method {type(self).__name__} does not draw text")


@dataclass(frozen=True, kw_only=True)
class MethodSpec(Spec):
    """A method's entry: its builder is its Method class, whose attributes are its capabilities."""

    def __post_init__(self):
        if not (isinstance(self.builder, type) and issubclass(self.builder, Method)):
            raise TypeError(f"method_registry registers a Method subclass (capabilities are its attributes), got {self.builder!r}")
        if self.builder.causal is not None:  # the attention it needs is also the one it brings when chosen
            object.__setattr__(self, "defaults", {"model.causal": self.builder.causal, **(self.defaults or {})})


method_registry = Registry("method", MethodSpec)  # `@method_registry.register(name, doc, keys=...)` on the class


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
        if not e.trainable and (e.optimizer is not None or e.lr is not None or e.betas is not None):
            raise GenlabError(f"method {method_name}: frozen extra '{name}' cannot have an optimizer, lr or betas")
        if e.betas is not None and e.optimizer is None:
            raise GenlabError(f"method {method_name}: extra '{name}' has betas of its own, so it needs its own optimizer "
                              "(Extra(optimizer='name')), not a group of the model's")
        if e.optimizer == "model":
            raise GenlabError(f"method {method_name}: extra '{name}': optimizer=None joins the model's optimizer; "
                              "'model' is not an optimizer name")


def as_loss_dict(loss) -> dict[str, Tensor]:
    """A method's loss as {optimizer name: scalar}; a bare scalar belongs to the model's optimizer."""
    return dict(loss) if isinstance(loss, dict) else {"model": loss}
