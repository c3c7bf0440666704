"""The world-model family: method.name=world (method.py), its objectives (objectives.py) and its videos (render.py)."""
from genlab.families.world import method, objectives, world_dit  # noqa: F401  (objectives, method "world", model "world_dit")
