"""Image autoencoders trained by genlab, for latent diffusion."""
