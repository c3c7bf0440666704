"""Every sampler (k-diffusion signature), step schedules, guidance, the block cache, the batched image sampler and latent decoding."""

# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan)
from genlab.sampling import samplers  # noqa: F401,E402
