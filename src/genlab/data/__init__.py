"""Datasets (registry), on-disk formats, converters and device-side loaders."""
from genlab.data import datasets  # noqa: F401
from genlab.data.datasets import build_dataset  # noqa: F401
from genlab.data.loader import build_loader  # noqa: F401
from genlab.data import text  # noqa: F401,E402
from genlab.data import windows  # noqa: F401,E402  (dataset "episodes")
