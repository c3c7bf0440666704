"""Language models: GPT, next-token cross-entropy, masked diffusion (MDLM), their text helpers."""
from genlab.families.lm import autoregressive, gpt, mdlm  # noqa: F401,E402
