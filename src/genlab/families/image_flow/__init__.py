"""Image flow matching: DiT and its relatives, rectified flow, REPA, EDM, MaskDiT, timestep samplers."""
