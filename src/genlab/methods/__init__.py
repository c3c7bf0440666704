"""Methods own the objective, sampling and evaluation: `loss(model, batch, gen) -> (loss, metrics)`."""
from genlab.methods import timesteps, samplers, flow  # noqa: F401
from genlab.methods import autoregressive, mdlm  # noqa: F401,E402
from genlab.methods import image_ar  # noqa: F401,E402
from genlab.methods import world_model  # noqa: F401,E402
