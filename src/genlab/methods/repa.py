"""REPA: representation alignment (Yu et al. 2024, arXiv:2410.06940).

Flow matching plus an alignment term: the DiT's tokens after block k, mapped by a trainable MLP projector,
should point the way a frozen image encoder's features of the clean image point, patch by patch:

    loss = flow loss + lambda * mean_n ( -cos(projector(h_k[n]), encoder(x)[n]) )

The projector is a trainable extra (a param group of the model's optimizer), the encoder a frozen one:
either the in-project feature CNN of eval/classifier.py (method.repa_encoder=classifier, trained on the
dataset and cached) or a frozen randomly initialised conv net of the same shape (repa_encoder=random: no
pretraining needed, for tests and ablations). Sampling and evaluation are flow matching's.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.errors import GenlabError
from genlab.methods.base import Extra
from genlab import config_fields as cf
from genlab.methods.flow import FLOW_KEYS, FLOW_SPEC, FlowMatching, check_flow_config, unwrap
from genlab.registry import method_registry, model_registry

ENCODERS = ("random", "classifier")


class ConvEncoder(nn.Module):
    """Convolutional features of the clean image pooled onto the DiT's patch grid: [B, C, H, W] -> [B, grid^2, 128]."""

    def __init__(self, features: nn.Sequential, channels: int, image_size: int, grid: int):
        super().__init__()
        self.features, self.grid = features, grid
        self.out_dim = [m for m in features if isinstance(m, nn.Conv2d)][-1].out_channels
        self._flops = _count_flops(self, torch.zeros(1, channels, image_size, image_size))

    def forward(self, x):
        f = F.adaptive_avg_pool2d(self.features(x), self.grid)
        return f.flatten(2).transpose(1, 2)

    def flops_per_sample(self) -> int:
        return self._flops


class Projector(nn.Module):
    """REPA's 3-layer MLP with SiLU, applied to every token."""

    def __init__(self, dim: int, hidden: int, out_dim: int, tokens: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU(),
                                 nn.Linear(hidden, out_dim))
        self.tokens = tokens

    def forward(self, h):
        return self.net(h)

    def flops_per_sample(self) -> int:
        return 2 * self.tokens * sum(m.in_features * m.out_features for m in self.net if isinstance(m, nn.Linear))


def _count_flops(module, x) -> int:
    from torch.utils.flop_counter import FlopCounterMode
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        module(x)
    return int(fc.get_total_flops())


def conv_features(channels: int) -> nn.Sequential:
    """The convolutional trunk of eval/classifier.SmallConvNet (strides 1, 2, 2; 128 channels out)."""
    from genlab.eval.classifier import SmallConvNet
    return SmallConvNet(channels, 2).features[:6]


class REPA(FlowMatching):
    def __init__(self, cfg, data_spec):
        super().__init__(cfg, data_spec)
        m = cfg.method
        if not model_registry.spec(cfg.model.name).block_tokens:
            raise GenlabError(f"method repa aligns the patch tokens a block outputs; model {cfg.model.name} has no such blocks")
        if m.repa_encoder not in ENCODERS:
            raise GenlabError(f"method.repa_encoder must be one of {', '.join(ENCODERS)}; got {m.repa_encoder!r}")
        from genlab.models.dit import dit_size
        dim, depth, _ = dit_size(cfg.model)
        if not 1 <= m.repa_block <= depth:
            raise GenlabError(f"method.repa_block must be in 1..{depth} (the model depth), got {m.repa_block}")
        grid = data_spec["image_size"] // cfg.model.patch_size
        self.block, self.weight, self.lr = m.repa_block, m.repa_weight, m.repa_lr or None
        self.encoder = ConvEncoder(self._encoder_trunk(cfg, data_spec), data_spec["channels"], data_spec["image_size"], grid)
        self.projector = Projector(dim, m.repa_hidden, self.encoder.out_dim, grid * grid)
        self._hidden, self._hooked = [], None

    def _encoder_trunk(self, cfg, spec):
        if cfg.method.repa_encoder == "random":
            return conv_features(spec["channels"])  # initialised from the seeded global RNG, then frozen
        from genlab.data import build_dataset
        from genlab.eval.classifier import get_classifier
        net, _ = get_classifier(build_dataset(cfg.data), epochs=cfg.eval.classifier_epochs)
        return net.features[:6]

    def extra_modules(self):
        return {**super().extra_modules(), "projector": Extra(self.projector, trainable=True, lr=self.lr),
                "encoder": Extra(self.encoder, trainable=False)}

    def _keep(self, module, args, out):
        if torch.is_grad_enabled():  # training forward only: sampling needs no hidden states
            self._hidden.append(out)

    def _hook(self, model):
        base = unwrap(model)
        if self._hooked is not base:
            # the hook is seen by compiled code because genlab compiles with hook guards (switches.guard_module_hooks)
            base.blocks[self.block - 1].register_forward_hook(self._keep)
            self._hooked = base

    def loss(self, model, batch, ctx):
        self._hook(model)
        self._hidden.clear()
        flow, metrics = super().loss(model, batch, ctx)
        h = self._hidden.pop()
        with torch.no_grad():
            target = ctx.extras["encoder"](batch["image"])
        align = -F.cosine_similarity(ctx.extras["projector"](h).float(), target.float(), dim=-1).mean()
        return flow + self.weight * align, {**metrics, "flow_loss": flow.detach(), "repa_align": align.detach()}


REPA_KEYS = cf.declare("method",
    repa_weight=cf.F(0.5, "repa: lambda of the alignment term -cos(projector(h_k), encoder(x))", ge=0),
    repa_block=cf.F(1, "repa: DiT block (1-based) whose output tokens are aligned", ge=1),
    repa_encoder=cf.F("random", "repa: frozen encoder (classifier: the in-project feature CNN; random: a frozen random conv net)", choices=("random", "classifier")),
    repa_hidden=cf.F(256, "repa: width of the trainable MLP projector", ge=1),
    repa_lr=cf.F(0.0, "repa: projector learning rate (0 = optim.lr)", ge=0),
)


def check_repa_config(cfg):
    check_flow_config(cfg)
    if not model_registry.spec(cfg.model.name).block_tokens:
        raise GenlabError(f"method.name=repa aligns the patch tokens a block outputs; model {cfg.model.name} has no such "
                          f"blocks: use a model whose blocks output them (genlab list: model.dit)")


@method_registry.register("repa", "flow matching + REPA alignment of a DiT block to frozen encoder features "
                                  "(trainable projector, frozen encoder; method.repa_*)",
                          keys=REPA_KEYS, **{**FLOW_SPEC, "check": check_repa_config,
                                             "reads": tuple(k.dotted for k in FLOW_KEYS)})
def build_repa(cfg, data_spec):
    return REPA(cfg, data_spec)
