"""Training: the loop (trainer.py), the step and its strategies (step.py: eager and compiled; graph_step.py: graphed;
seeds.py: stacked, batched seeds and variants). `genlab.train(cfg)` is the plain function seeds.train.
Each strategy is an entry of train_step_registry with its config check; config validation runs them."""
from genlab.training import graph_step, seeds, step  # noqa: F401 (registering modules)
