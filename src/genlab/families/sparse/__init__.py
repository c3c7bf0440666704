"""Sparse Transformers over image bytes and tokens (Child et al. 2019)."""
