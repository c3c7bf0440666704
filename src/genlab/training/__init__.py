"""Training: the loop (trainer.py), the step and its strategies (step.py, graph_step.py), batched seeds and
variants (seeds.py). The public entry is the plain function `genlab.train(cfg)` (runs/api.py)."""
