"""MeanFlow (Geng et al. 2025), trained from scratch; docs/few_step.md has the maths (the paper's (t, r) are genlab's
(1 - t, 1 - s)). The JVP target runs on the unwrapped module under no_grad: no wrapper differentiates through it.
"""
from __future__ import annotations

import sys

import torch
import torch.nn as nn

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.base import method_registry
from genlab.families.baselines import Baseline
from genlab.families.few_step.base import FewStepFlow
from genlab.families.image_flow.flow import FLOW_KEYS, MEAN_VELOCITY, check_flow_config, interpolate, unwrap
from genlab.nn.attention import forward_ad_attention


class MeanflowKeys(cf.Keys, section="method"):
    meanflow_share: float = cf.F(0.25, "meanflow: share of each batch with a step d = s - t > 0 and the JVP target; the rest "
                                       "has d = 0, plain flow matching (paper's best on ImageNet: 25%)", ge=0, le=1)
    meanflow_norm_p: float = cf.F(1.0, "meanflow: power p of the adaptive loss weight 1 / (||u - target||^2 + c)^p, without "
                                       "gradient (paper 1; 0 = the plain summed squared error)", ge=0)
    meanflow_norm_c: float = cf.F(1e-3, "meanflow: c of the adaptive loss weight (paper 1e-3)", gt=0)
    meanflow_embed_scale: float = cf.F(1.0, "meanflow: the model's sinusoidal embedders see this times t and d (1: SiT's convention, "
                                            "on which the MeanFlow code builds; genlab's flow uses 1000, DiT's); du/dt carries the "
                                            "embedding's derivative, and at 1000 the JVP target diverged on digits", gt=0, le=1000)
    meanflow_omega: float = cf.F(1.0, "meanflow: guidance scale baked into the target, v~ = w v + (1 - w) u(x_t, t, 0 | null) "
                                      "(paper sec. 4.2; 1 = off); sample with cfg_scale 1", gt=0)


_NOTED = set()


def mean_velocity_jvp(fn, x, t, d, v):
    """(u, du/dt) of u = fn(x, t, d) with the end time t + d fixed: the JVP with tangent (v, 1, -1)."""
    return torch.func.jvp(fn, (x, t, d), (v, torch.ones_like(t), -torch.ones_like(d)))


def check_meanflow_config(cfg):
    check_flow_config(cfg)
    if cfg.method.timestep_sampler == "adaptive":
        raise GenlabError("method.timestep_sampler=adaptive learns from flow-matching probes that meanflow does not "
                          "run; use logit_normal (the paper's) or another fixed sampler")
    if cfg.train.parallel in ("fsdp", "hsdp"):
        raise GenlabError(f"meanflow's JVP target runs on the unwrapped model; train.parallel={cfg.train.parallel} "
                          "shards it: use ddp")
    if cfg.model.qkv_kernel != "plain":  # its custom ops have no forward-mode AD rule
        raise GenlabError(f"meanflow's JVP target needs forward-mode AD through the model; model.qkv_kernel="
                          f"{cfg.model.qkv_kernel} has none: use model.qkv_kernel=plain")


class EmbedScaled(nn.Module):
    """The model with its time and step inputs scaled by k before its embedders (which multiply by 1000)."""

    def __init__(self, module, k: float):
        super().__init__()
        self.module, self.k = module, k  # `module`: flow.unwrap reaches the backbone through it

    def forward(self, x, t, y, d):
        return self.module(x, t * self.k, y, d=d * self.k)


class MeanFlow(FewStepFlow):
    conditions = {"d": "scalar"}
    init_from_teacher = False
    check_config = staticmethod(check_meanflow_config)

    def __init__(self, cfg, data_spec):
        super().__init__(cfg, data_spec)
        self.keys = MeanflowKeys.of(cfg)  # this method's own keys, typed (the same object as self.mcfg)
        self.k = self.keys.meanflow_embed_scale / 1000.0  # the embedders compute sin(1000 * value * freq)

    def draw_times(self, B, generator, device, step=None):
        """Start times t and steps d = s - t: the smaller and larger of two draws; d = 0 after the first share."""
        a, b = self.draw_t(B, generator, device, step), self.draw_t(B, generator, device, step)
        t, s = torch.minimum(a, b), torch.maximum(a, b)
        n = int(round(B * self.keys.meanflow_share))
        d = torch.cat([(s - t)[:n], torch.zeros(B - n, device=device, dtype=t.dtype)])
        return t, d, n

    def trivial_baselines(self, data, generator):
        # the d = 0 samples are plain flow matching (mse_flow); a constant model meets the others' own targets
        share = self.mcfg.meanflow_share
        if share >= 1:
            return self.chance_accuracy()
        metric = "mse_flow" if share > 0 else "mse"
        return [Baseline(metric, self.mean_velocity_loss(data, generator, weighted=False), MEAN_VELOCITY)]

    def loss(self, model, batch, ctx):
        g, data, y = ctx.generator, batch["image"], batch["label"]
        B, dev = data.shape[0], data.device
        t, d, n = self.draw_times(B, g, dev, ctx.step)
        noise = torch.randn(data.shape, generator=g, device=dev, dtype=data.dtype)
        y = self.drop_labels(model, y, g)
        return self.loss_at(model, data, noise, t, d, y, n)

    def loss_at(self, model, data, noise, t, d, y, n_jvp):
        """The loss of a batch whose draws are given (d may be nonzero only in the first n_jvp samples)."""
        x_t = interpolate(noise, data, t)
        with torch.no_grad():
            target = self.target(unwrap(model), x_t, t, d, y, (data - noise).float(), n_jvp)
        u = model(x_t, t * self.k, y, d=d * self.k)
        sq = (u.float() - target).square().flatten(1).sum(1)
        w = (sq.detach() + self.keys.meanflow_norm_c).pow(-self.keys.meanflow_norm_p)
        per = sq.detach() / x_t[0].numel()  # the mean squared error per pixel, comparable with flow's loss
        metrics = {"mse": per.mean()}
        if 0 < n_jvp < len(per):
            metrics.update(mse_jvp=per[:n_jvp].mean(), mse_flow=per[n_jvp:].mean())
        return (w * sq).mean(), metrics

    def target(self, net, x_t, t, d, y, v, n):
        """sg(v + d du/dt) in fp32, with v the (guided) velocity; du/dt only for the first n samples (d = 0 after)."""
        u_net = EmbedScaled(net, self.k)
        work = torch.promote_types(x_t.dtype, torch.float32)  # float32 at least (float64 in the tests)
        with torch.autocast(x_t.device.type, enabled=False):
            x_t, t, d, v = x_t.to(work), t.to(work), d.to(work), v.to(work)
            if self.keys.meanflow_omega != 1.0:
                v = self.guided_velocity(u_net, x_t, t, y, v)
            if n == 0:
                return v
            with forward_ad_attention(net) as fell_back:
                note_fallback(fell_back)
                _, du = self.jvp_of(u_net, x_t.is_cuda)(x_t[:n], t[:n], d[:n], v[:n], y[:n])
            return torch.cat([v[:n] + d[:n].view(-1, *([1] * (v.ndim - 1))) * du, v[n:]])  # u = v + d du/dt

    def jvp_of(self, u_net, cuda: bool):
        """(u, du/dt) of u_net at given points; compiled on a GPU when the model is (eager: ~4/5 of an H100 step)."""
        def jvp(x, t, d, v, y):
            return mean_velocity_jvp(lambda a, b, c: u_net(a, b, y, c).to(x.dtype), x, t, d, v)
        if not (cuda and self.cfg.train.compile != "off"):
            return jvp
        if getattr(self, "_compiled_jvp", None) is None or self._compiled_jvp[0] is not u_net.module:
            self._compiled_jvp = (u_net.module, _eager_if_uncompilable(torch.compile(jvp), jvp))
        return self._compiled_jvp[1]

    def guided_velocity(self, net, x_t, t, y, v):
        """v~ = omega v + (1 - omega) u(x_t, t, 0 | null) for labelled samples, v for the null class (paper eq. 20)."""
        null = unwrap(net).null_class
        v_null = net(x_t, t, torch.full_like(y, null), torch.zeros_like(t)).to(v.dtype)
        om = self.keys.meanflow_omega
        keep = (y == null).view(-1, *([1] * (v.ndim - 1)))
        return torch.where(keep, v, om * v + (1 - om) * v_null)

    def sample(self, model, labels, *args, **kwargs):
        return super().sample(EmbedScaled(model, self.k), labels, *args, **kwargs)


def _eager_if_uncompilable(compiled, eager):
    """The compiled JVP, or from its first failure to compile on, the eager one (a one-line note: same numbers)."""
    state = {"fn": compiled}

    def call(*args):
        if state["fn"] is compiled:
            try:
                return compiled(*args)
            except Exception as e:  # noqa: BLE001  (torch._dynamo / inductor errors have no common public base)
                state["fn"] = eager
                print(f"genlab: note: meanflow's JVP could not be compiled ({type(e).__name__}); it runs eager",
                      file=sys.stderr)
        return state["fn"](*args)
    return call


def note_fallback(names):
    """One line per process the first time a JVP runs attention through a fallback."""
    key = tuple(names)
    if names and key not in _NOTED:
        _NOTED.add(key)
        print(f"genlab: note: meanflow's JVP runs attention {', '.join(names)} in ops with forward-mode AD (SDPA's "
              "math kernel, or the entry's declared fallback): fused kernels have none", file=sys.stderr)


method_registry.register("meanflow", "MeanFlow (Geng et al. 2025), from scratch: the network predicts the average "
                                     "velocity over a step d, trained on the MeanFlow identity with a JVP target; "
                                     "1- and 2-step sampling with sampler=flow_map",
                         keys=(*FLOW_KEYS, MeanflowKeys), defaults={"method.sampler": "flow_map"})(MeanFlow)
