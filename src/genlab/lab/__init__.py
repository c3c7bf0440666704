"""Experiments over runs: sweeps (the one job engine), bench, layer analysis."""
