"""Image autoencoders trained by genlab, for latent diffusion."""
from genlab.families.autoencoder import method, model  # noqa: F401,E402
