"""Language models: GPT, next-token cross-entropy, masked diffusion (MDLM), their text helpers."""

# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan)
from genlab.families.lm import autoregressive, gpt, mdlm  # noqa: F401,E402
