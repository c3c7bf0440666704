"""Datasets (registry), on-disk formats, converters and device-side loaders."""
# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan);
# encode registers the dataset "latents", windows "episodes"
from genlab.data import datasets, encode, pairs, shards, text, windows  # noqa: F401
from genlab.data.datasets import build_dataset  # noqa: F401
from genlab.data.loader import build_loader  # noqa: F401
