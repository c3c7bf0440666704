"""The config package: typed component configs (fields), the config tree and presets (tree), validation (check), the generated reference (doc)."""
