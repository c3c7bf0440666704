"""Few-step generation: methods whose samples take 1-8 network calls (shortcut models, MeanFlow, consistency
distillation and tuning, phased consistency, piecewise and plain reflow, adversarial distillation).

Each method is one module with its own `method.name` entry; `base.py` holds what they share (the flow teacher,
initialising the student from it, the few-step samplers' conventions), `samplers.py` the samplers.
"""
