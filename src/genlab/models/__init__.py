"""Backbones. Each registers a builder `(cfg.model, data_spec) -> nn.Module` that exposes `.blocks`
(for FSDP wrapping, activation checkpointing and per-block compile) and `flops_per_sample()`."""
from genlab.models import layers, positions, dit, incontext, mmdit  # noqa: F401
from genlab.models import gpt  # noqa: F401,E402
from genlab.models import triton_attention  # noqa: F401,E402  (attention backend "triton"; triton imported lazily)
from genlab.models import sparse_transformer  # noqa: F401,E402
from genlab.models import world_dit  # noqa: F401,E402
