"""`genlab analyze RUN`: what the layers of a trained image backbone learn and how much each one matters.
cka.py (layer similarity), skip.py (sampling with blocks skipped), cache.py (a cached-block sampler),
report.py (heat maps, tables, plots), run.py (the command's work on a run)."""
