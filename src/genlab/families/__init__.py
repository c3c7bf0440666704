"""The model families, one folder each: model(s), objective(s), rendering, presets and docs. core.registry.load_entries
imports every family package found here (each package's __init__ imports its registering modules: no scan)."""
