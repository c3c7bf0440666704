"""Device, distributed, checkpoints, precision/compile switches, metric sinks, stop signals, the export-folder format.
Used by every floor above; imports no model, method or trainer."""

# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan)
from genlab.runtime import parallel, switches  # noqa: F401,E402
