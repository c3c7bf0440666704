"""Training: the loop (trainer.py), the step and its strategies (step.py: eager and compiled; graph_step.py: graphed;
seeds.py: stacked, batched seeds and variants). The public entry is the plain function `genlab.train(cfg)` (runs/api.py).
Each strategy registers itself (train_step_registry) with its config checks; config validation runs them."""
from genlab.training import graph_step, seeds, step  # noqa: F401 (registering modules)
