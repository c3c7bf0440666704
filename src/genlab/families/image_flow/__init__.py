"""Image flow matching: DiT and its relatives, rectified flow, REPA, EDM, MaskDiT, timestep samplers."""

# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan)
from genlab.families.image_flow import (  # noqa: F401,E402
    adaptive_timesteps,
    dit,
    flow,
    incontext,
    loss_weighting,
    maskdit,
    maskdit_backbone,
    mmdit,
    repa,
    repa_encoders,
    timesteps,
)
