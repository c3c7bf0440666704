"""Imports every module that registers an interchangeable part, and re-exports the registries."""
from genlab.registry import (  # noqa: F401
    ac_registry, adaln_registry, attention_registry, compile_mode_registry, compile_registry, dataset_registry, lr_schedule_registry,
    method_registry, model_registry, optimizer_registry, parallel_registry, precision_registry, residual_registry,
    sampler_registry, timestep_sampler_registry,
)
import genlab.models  # noqa: F401,E402
import genlab.methods  # noqa: F401,E402
import genlab.data  # noqa: F401,E402
import genlab.optim  # noqa: F401,E402
import genlab.train.switches  # noqa: F401,E402
import genlab.train.parallel  # noqa: F401,E402
