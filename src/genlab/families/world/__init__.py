"""The world-model method (method.name=world, method.py) and its objectives, the entries of the `world_objective`
registry (flow.py, edm.py, l1.py); the adversarial term lives in adversarial.py."""
from genlab.families.world import edm, flow, l1, method, world_dit  # noqa: F401  (world objectives)  # noqa: F401,E402  (method "world", model "world_dit")
