"""Language models: GPT, next-token cross-entropy, masked diffusion (MDLM), their text helpers."""
