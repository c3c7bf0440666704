"""Shared layers: attention backends and kernels, MLPs, norms, positions, conditions, converters, autoencoders."""
