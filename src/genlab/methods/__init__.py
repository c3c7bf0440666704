"""Methods own the objective, sampling, evaluation and their extra modules: `loss(model, batch, ctx) -> (loss, metrics)`
(methods/base.py: Method, StepContext, Extra)."""
from genlab.methods import timesteps, adaptive_timesteps, loss_weighting, samplers, flow  # noqa: F401
from genlab.methods import autoregressive, mdlm, repa  # noqa: F401,E402
from genlab.methods import image_ar  # noqa: F401,E402
from genlab.methods import world  # noqa: F401,E402
