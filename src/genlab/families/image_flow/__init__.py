"""Image flow matching: DiT and its relatives, rectified flow, REPA, EDM, MaskDiT, timestep samplers."""
from genlab.families.image_flow import (dit, flow, incontext, loss_weighting, maskdit, mmdit, repa,  # noqa: F401,E402
                                        repa_encoders, timesteps)
