"""Shared layers: attention backends and kernels, MLPs, norms, positions, conditions, converters, autoencoders."""

# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan)
from genlab.nn import (attention, autoencoders, conditions, convert, cudnn_attention, fused_adaln,  # noqa: F401,E402
                       fused_ce, fused_final, fused_mlp, fused_qkv, mlp, norm, positions, ptq, quack_mlp, quantized_training,
                       sparse_attention, triton_attention)
