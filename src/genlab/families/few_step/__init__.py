"""Few-step generation (1-8 network calls): one module per `method.name`; base.py holds what they share."""
from genlab.families.few_step import ect, ladd, lcm, meanflow, pcm, perflow, reflow, shortcut  # noqa: F401,E402
