"""Image autoencoders trained by genlab, for latent diffusion."""
from genlab.families.autoencoder import method, model, run_autoencoder  # noqa: F401,E402
