"""Finished runs: loading, sampling and evaluating one, export with a model card, post-training quantization."""
