"""Datasets (registry), on-disk formats, converters and device-side loaders."""
# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan)
from genlab.data import (  # noqa: F401,E402
    datasets,  # noqa: F401
    latents,
    pairs,
    shards,
    text,  # noqa: F401,E402
    windows,  # noqa: F401,E402  (dataset "episodes")
)
from genlab.data.datasets import build_dataset  # noqa: F401
from genlab.data.loader import build_loader  # noqa: F401
