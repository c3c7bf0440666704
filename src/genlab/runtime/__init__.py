"""Device, distributed, checkpoints, precision/compile switches, metric sinks, stop signals, the export-folder format.
Used by every floor above; imports no model, method or trainer."""
