"""The model families, one folder each: model(s), objective(s), rendering, presets and docs."""
