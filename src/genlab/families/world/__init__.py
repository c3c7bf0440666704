"""The world-model family: the method (method.name=world, method.py), its objectives and adversarial term
(objectives.py, the `world_objective` registry) and its videos (render.py)."""
from genlab.families.world import method, objectives, world_dit  # noqa: F401  (objectives, method "world", model "world_dit")
