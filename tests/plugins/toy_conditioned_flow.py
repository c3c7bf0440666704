"""A method in one file, registered at run time: flow matching with the model conditioned on a new per-sample
scalar ("strength", drawn uniformly in training, `method.toy_strength` at sampling time) and its own config key.
Nothing else in genlab is edited for it (tests/integration/test_components.py)."""
import torch
import torch.nn.functional as F

from genlab.config import fields as cf
from genlab.families.base import method_registry
from genlab.families.image_flow.flow import FLOW_KEYS, FlowMatching, interpolate


class ToyKeys(cf.Keys, section="method"):
    toy_strength: float = cf.F(0.5, "toy: the strength every sample is conditioned on at sampling time", ge=0, le=1)


class ToyConditioned(FlowMatching):
    conditions = {"strength": "scalar"}  # a model input every image backbone embeds (nn/conditions.py)

    def loss(self, model, batch, ctx):
        data, y, g = batch["image"], batch["label"], ctx.generator
        t = self.draw_t(data.shape[0], g, data.device, ctx.step)
        strength = torch.rand(data.shape[0], generator=g, device=data.device)
        noise = torch.randn(data.shape, generator=g, device=data.device, dtype=data.dtype)
        v = model(interpolate(noise, data, t), t, y, strength=strength)
        return F.mse_loss(v.float(), (data - noise).float()), {}

    def sample_conditions(self, n, device):
        return {"strength": torch.full((n,), ToyKeys.of(self.mcfg).toy_strength, device=device)}


method_registry.register("toy_conditioned", "flow matching conditioned on a per-sample strength (a test plugin)",
                         keys=ToyKeys, reads=cf.dotted_of(FLOW_KEYS))(ToyConditioned)
