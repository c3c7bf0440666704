"""Sparse Transformers over image bytes and tokens (Child et al. 2019)."""
from genlab.families.sparse import image_ar, sparse_transformer  # noqa: F401,E402
