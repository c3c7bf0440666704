"""`genlab analyze RUN`: what the layers of a trained image backbone learn and how much each one matters.
cka.py (layer similarity), run.py (the command's work on a run: skips and the cached-block sampler of genlab.sampling;
its heat maps, tables and plots), compare.py (several runs' analyses side by side)."""
