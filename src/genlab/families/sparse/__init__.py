"""Sparse Transformers over image bytes and tokens (Child et al. 2019)."""

# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan)
from genlab.families.sparse import image_ar, sparse_transformer  # noqa: F401,E402
