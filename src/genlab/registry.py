"""Name -> builder registries, so every interchangeable part is chosen by a config string.

Registration without an import cycle: this module imports nothing of genlab but its errors. The modules that
register entries import it; a lookup (`get`, `names`, ...) imports them by name on first use (ENTRY_MODULES),
so config validation needs no import of the models, methods or trainer.
"""
import importlib

from genlab.errors import GenlabError, did_you_mean

REGISTRIES = {}
# every module that registers something; imported on the first lookup of any registry
ENTRY_MODULES = ("genlab.models", "genlab.methods", "genlab.data", "genlab.optim", "genlab.train.switches",
                 "genlab.train.parallel", "genlab.train.convert", "genlab.eval.metrics")
_loaded = False


def load_entries():
    """Import every registering module once (idempotent)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for name in ENTRY_MODULES:
            importlib.import_module(name)


class Registry:
    def __init__(self, kind: str):
        self.kind = kind
        self._entries = {}
        self._docs = {}  # name -> one-line description (`genlab list`); entries may be plain values
        REGISTRIES[kind] = self

    def register(self, name: str, doc: str = ""):
        def wrap(fn):
            if name in self._entries:
                raise ValueError(f"{self.kind} '{name}' registered twice")
            self._entries[name] = fn
            self._docs[name] = doc or (fn.__doc__ or "").strip().split("\n")[0]
            return fn
        return wrap

    def get(self, name: str):
        if name not in self._entries:
            load_entries()
        if name not in self._entries:
            raise GenlabError(f"unknown {self.kind} '{name}'{did_you_mean(str(name), self._entries)}; "
                              f"valid choices: {', '.join(sorted(self._entries))}")
        return self._entries[name]

    def doc(self, name: str) -> str:
        load_entries()
        return self._docs.get(name, "")

    def names(self):
        load_entries()
        return sorted(self._entries)

    def __contains__(self, name):
        if name not in self._entries:
            load_entries()
        return name in self._entries

    def items(self):
        load_entries()
        return sorted(self._entries.items())


def all_registries():
    """Import every module that registers something, then return the registries."""
    load_entries()
    return dict(sorted(REGISTRIES.items()))


# Every registry of the project; `genlab list` prints them all.
model_registry = Registry("model")
attention_registry = Registry("attention")
method_registry = Registry("method")
timestep_sampler_registry = Registry("timestep_sampler")
sampler_registry = Registry("sampler")
step_schedule_registry = Registry("step_schedule")
loss_weighting_registry = Registry("loss_weighting")
dataset_registry = Registry("dataset")
optimizer_registry = Registry("optimizer")
lr_schedule_registry = Registry("lr_schedule")
precision_registry = Registry("precision")
compile_registry = Registry("compile")
ac_registry = Registry("activation_checkpointing")
parallel_registry = Registry("parallel")
adaln_registry = Registry("adaln")
residual_registry = Registry("residual")
compile_mode_registry = Registry("compile_mode")
convert_registry = Registry("convert")
mlp_registry = Registry("mlp")
norm_registry = Registry("norm")
position_registry = Registry("position")
eval_metric_registry = Registry("eval_metric")
world_objective_registry = Registry("world_objective")
