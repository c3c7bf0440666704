"""Image autoencoders trained by genlab, for latent diffusion."""

# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan)
from genlab.families.autoencoder import method, model, run_autoencoder  # noqa: F401,E402
