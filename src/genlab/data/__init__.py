"""Datasets (registry), on-disk formats, converters and device-side loaders."""
from genlab.data import datasets  # noqa: F401
from genlab.data.datasets import build_dataset  # noqa: F401
from genlab.data.loader import build_loader  # noqa: F401
from genlab.data import text  # noqa: F401,E402
from genlab.data import windows  # noqa: F401,E402  (dataset "episodes")

# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan)
from genlab.data import latents, pairs, shards  # noqa: F401,E402
