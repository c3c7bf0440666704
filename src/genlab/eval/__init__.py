# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan)
from genlab.eval import metrics  # noqa: F401
