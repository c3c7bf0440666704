"""Few-step generation: methods whose samples take 1-8 network calls (shortcut models, MeanFlow, consistency
distillation and tuning, phased consistency, piecewise and plain reflow, adversarial distillation).

Each method is one module with its own `method.name` entry; `base.py` holds what they share (the flow teacher,
initialising the student from it, the few-step samplers' conventions), `samplers.py` the samplers.
"""

# the modules that register components (core.registry.load_entries imports this package: explicit imports, no scan)
from genlab.families.few_step import ect, ladd, lcm, meanflow, pcm, perflow, reflow, shortcut  # noqa: F401,E402
