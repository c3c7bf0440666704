"""Every registry, with its entries loaded (kept for code that imports the registries from here)."""
from genlab.registry import (  # noqa: F401
    ac_registry, adaln_registry, attention_registry, compile_mode_registry, compile_registry, convert_registry,
    dataset_registry, load_entries, lr_schedule_registry, method_registry, mlp_registry, model_registry, norm_registry,
    optimizer_registry, parallel_registry, position_registry, precision_registry, residual_registry, sampler_registry,
    timestep_sampler_registry,
)

load_entries()
