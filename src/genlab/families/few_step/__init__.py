"""Few-step generation (1-8 network calls): one module per `method.name`; base.py holds what they share."""

# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan)
from genlab.families.few_step import ect, ladd, lcm, meanflow, pcm, perflow, reflow, shortcut  # noqa: F401,E402
