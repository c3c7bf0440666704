"""The dtype of an image backbone's residual stream under autocast (registry `residual`): an entry maps the
input tensor to the dtype the stream is kept in."""
from __future__ import annotations

from genlab.core.registry import Registry
from genlab.nn.kernels import compute_dtype

residual_registry = Registry("residual")


@residual_registry.register("fp32", "residual stream in the input dtype (fp32 under bf16 autocast, as in the DiT reference)")
def residual_fp32(x):
    return x.dtype


residual_registry.register("compute", "residual stream in the autocast dtype (bf16): half the bytes of every "
                                     "residual add, LayerNorm read and residual gradient; LayerNorm stats stay fp32")(compute_dtype)
