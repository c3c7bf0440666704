"""Image flow matching: DiT and its relatives, rectified flow, REPA, EDM, MaskDiT, timestep samplers."""
from genlab.families.image_flow import (adaptive_timesteps, dit, flow, incontext, loss_weighting,  # noqa: F401,E402
                                        maskdit, maskdit_backbone, mmdit, repa, repa_encoders, timesteps)
