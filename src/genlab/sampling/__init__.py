"""Every sampler (k-diffusion signature), step schedules, guidance, the block cache, the batched image sampler and latent decoding."""
