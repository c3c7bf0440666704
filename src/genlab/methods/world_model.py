"""Action-conditioned next-frame diffusion (DIAMOND, Alonso et al. 2024, arXiv:2405.12399).

A batch is a window of frames [B, L+H, C, H, W] and the actions taken on them. The model denoises
frame j given frames j-L..j-1 and actions j-L..j-1 (actions[t] leads from frame t to t+1).

- objective: `flow` (rectified flow, x_t = (1-t)·noise + t·data, v = data - noise), `edm` (Karras et
  al. 2022 preconditioning, DIAMOND's choice) or `l1` (one-step regression from noise, the users' GAN
  setting; add method.adv_weight > 0 for the adversarial term with a spectral-normed patch discriminator).
- prediction (flow): the network outputs the clean frame x (`x`, default) or the velocity (`v`). With v
  the clean frame is x_t + (1-t)·v, so the network has to reproduce and cancel the sampling noise itself;
  what it misses stays in the static background, compounds over a rollout and loses to copy-last. With x
  (and the residual) an output of zero is exactly the last frame, whatever the noise.
- context noise augmentation: the context frames get Gaussian noise of a random level that the model is
  told, so at rollout time it tolerates its own imperfect frames.
- schedule: teacher-forced until `closed_loop_start` of training, then closed-loop: the context of the
  trained frame contains up to h-1 frames the model generated itself (no gradient through them), with h
  drawn up to a maximum that grows linearly to data.horizon by the end of training.
"""
from __future__ import annotations

import random

import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.data.pixels import quantize
from genlab.errors import GenlabError
from genlab.methods.flow import interpolate, unwrap
from genlab.methods.samplers import time_grid
from genlab import config_fields as cf
from genlab.registry import method_registry, timestep_sampler_registry
from genlab.methods.base import Extra, Method, StepContext

OBJECTIVES = ("flow", "edm", "l1")
EDM_P_MEAN, EDM_P_STD, EDM_SIGMA_MIN, EDM_SIGMA_MAX, EDM_RHO = -0.4, 1.2, 2e-3, 5.0, 7.0


class PatchDiscriminator(nn.Module):
    """Small PatchGAN (Isola et al. 2017) on (frame, last context frame); spectral norm keeps it Lipschitz,
    which is what stops the NaN blow-ups of an unconstrained discriminator."""

    def __init__(self, channels: int, width: int = 32):
        super().__init__()
        sn = nn.utils.parametrizations.spectral_norm
        self.net = nn.Sequential(
            sn(nn.Conv2d(2 * channels, width, 4, 2, 1)), nn.LeakyReLU(0.2),
            sn(nn.Conv2d(width, 2 * width, 4, 2, 1)), nn.LeakyReLU(0.2),
            sn(nn.Conv2d(2 * width, 1, 3, 1, 1)))

    def forward(self, frame, last_context):
        with torch.autocast(frame.device.type, enabled=False):  # logits in fp32
            return self.net(torch.cat([frame, last_context], 1).float())


def augment_context(context: torch.Tensor, generator, max_level: float):
    """Noise the context frames only: returns (noisy context, level [B]). The input is not modified."""
    B = context.shape[0]
    level = torch.rand(B, generator=generator, device=context.device) * max_level
    noise = torch.randn(context.shape, generator=generator, device=context.device, dtype=context.dtype)
    return context + level.view(B, 1, 1, 1, 1).to(context.dtype) * noise, level


def finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    """A non-finite loss term becomes 0 (no host sync); the counter metric says how often it happened."""
    return torch.where(torch.isfinite(x), x, torch.zeros_like(x))


class WorldModel(Method):
    family = "world"
    batch_keys = ("frames", "actions")
    best_metric = "tf_mse"

    def __init__(self, cfg, spec):
        if spec.get("kind") != "episodes":
            raise GenlabError("method.name=world needs episode data (data.name=episodes)")
        self.cfg, self.mcfg, self.spec = cfg, cfg.method, spec
        self.L, self.H = spec["context"], spec["horizon"]
        self.objective = self.mcfg.objective
        if self.objective not in OBJECTIVES:
            raise GenlabError(f"unknown method.objective '{self.objective}'; valid choices: {', '.join(OBJECTIVES)}")
        self.sample_t = timestep_sampler_registry.get(self.mcfg.timestep_sampler)
        self.sigma_data = 0.5
        self._shim_step, self._shim_extras, self._shim_opt = 0, None, None

    # -- extra modules ------------------------------------------------------------------------------
    def extra_modules(self) -> dict:
        if self.mcfg.adv_weight <= 0:
            return {}
        return {"disc": Extra(PatchDiscriminator(self.spec["channels"]), trainable=True, optimizer="disc",
                              lr=self.mcfg.disc_lr)}

    # -- one denoiser call per objective -------------------------------------------------------------
    def _edm_scalings(self, sigma):
        s2, sd2 = sigma ** 2, self.sigma_data ** 2
        return sd2 / (s2 + sd2), sigma * self.sigma_data / (s2 + sd2).sqrt(), 1 / (s2 + sd2).sqrt(), sigma.log() / 4

    def _bc(self, v, x):
        return v.view(-1, *([1] * (x.ndim - 1))).to(x.dtype)

    def _v_from_x(self, x_hat, x_t, t):
        # v = (x - x_t) / (1 - t) = data - noise; the floor (applied to the target alike) keeps the rare t ~ 1
        # samples from dominating the loss, which is ||x_hat - x||^2 / max(1 - t, 0.05)^2
        return (x_hat - x_t) / self._bc((1 - t).clamp_min(0.05), x_t)

    def denoise_loss(self, model, target, context, actions, level, gen, base=None):
        """(loss, one-step estimate of the clean target) for the configured objective. With `base` (the last
        clean context frame) the diffused quantity is target - base: zero output = copy the last frame."""
        if base is not None:  # scaled: the small residual gets a variance closer to the unit noise it is drawn from
            k = self.mcfg.residual_scale
            loss, est = self.denoise_loss(model, (target - base) * k, context, actions, level, gen)
            return loss, est / k + base
        B = target.shape[0]
        noise = torch.randn(target.shape, generator=gen, device=target.device, dtype=target.dtype)
        if self.objective == "flow":
            t = self.sample_t(B, gen, target.device, self.mcfg)
            x_t = interpolate(noise, target, t)
            out = model(x_t, t, context, actions, level)
            if self.mcfg.prediction == "x":  # the network outputs the clean target; the loss stays on v
                est, v, v_target = out, self._v_from_x(out, x_t, t), self._v_from_x(target, x_t, t)
            else:
                est, v, v_target = x_t + self._bc(1 - t, x_t) * out, out, target - noise
            return F.mse_loss(v.float(), v_target.float()), est
        if self.objective == "edm":
            sigma = (torch.randn(B, generator=gen, device=target.device) * EDM_P_STD + EDM_P_MEAN).exp()
            c_skip, c_out, c_in, c_noise = self._edm_scalings(sigma)
            x_noisy = target + self._bc(sigma, target) * noise
            out = model(self._bc(c_in, x_noisy) * x_noisy, c_noise, context, actions, level)
            est = self._bc(c_skip, x_noisy) * x_noisy + self._bc(c_out, x_noisy) * out
            # the EDM-weighted loss on D equals the plain MSE on the network's target
            tgt = (target - self._bc(c_skip, x_noisy) * x_noisy) / self._bc(c_out, x_noisy)
            return F.mse_loss(out.float(), tgt.float()), est
        est = noise + model(noise, torch.zeros(B, device=target.device), context, actions, level)
        return F.l1_loss(est.float(), target.float()), est

    @torch.no_grad()
    def generate(self, model, context, actions, steps=None, generator=None, noise=None):
        """One next frame [B,C,H,W] in [-1, 1] from context [B,L,C,H,W] and actions [B,L]; `noise` (the
        starting sample, before method.sample_temperature scales it) may be given, so a compiled / CUDA-graphed
        caller keeps the RNG outside the graph."""
        steps = steps or self.mcfg.sample_steps
        B = context.shape[0]
        dev = context.device
        level = torch.zeros(B, device=dev)
        if noise is None:
            noise = torch.randn(context[:, -1].shape, generator=generator, device=dev, dtype=context.dtype)
        x = noise * self.mcfg.sample_temperature  # 0: the deterministic frame from the noise mean (best PSNR)
        if self.objective == "l1":
            x = x + model(x, torch.zeros(B, device=dev), context, actions, level)
        elif self.objective == "flow":  # Euler on the ODE, t: 0 (noise) -> 1 (data)
            ts = time_grid(steps, device=dev)
            for i in range(steps):
                out = model(x, ts[i].expand(B), context, actions, level)
                if self.mcfg.prediction == "x":  # the last step (to t=1) lands exactly on the predicted frame
                    out = (out - x) / (1 - ts[i])
                x = x + (ts[i + 1] - ts[i]) * out
        else:  # Euler on the EDM probability-flow ODE over the Karras sigma schedule
            r = 1 / EDM_RHO
            i = torch.arange(steps, device=dev, dtype=torch.float32)
            sig = (EDM_SIGMA_MAX ** r + i / max(steps - 1, 1) * (EDM_SIGMA_MIN ** r - EDM_SIGMA_MAX ** r)) ** EDM_RHO
            sig = torch.cat([sig, sig.new_zeros(1)])
            x = x * sig[0]
            for k in range(steps):
                s = sig[k].expand(B)
                c_skip, c_out, c_in, c_noise = self._edm_scalings(s)
                den = self._bc(c_skip, x) * x + self._bc(c_out, x) * model(self._bc(c_in, x) * x, c_noise, context, actions, level)
                x = x + (sig[k + 1] - sig[k]) * (x - den) / sig[k]
        x = (x / self.mcfg.residual_scale + context[:, -1] if self.mcfg.residual else x).clamp(-1, 1)
        return quantize(x) if self.mcfg.quantize_frames else x

    @torch.no_grad()
    def rollout(self, model, context, actions, steps=None, generator=None):
        """Autoregressive rollout: frames [B,K,C,H,W] from real context [B,L,...] and actions [B,L+K-1].

        Generated frames are fed back as context; future ground truth is never an input here."""
        L = self.L
        K = actions.shape[1] - L + 1
        frames = list(context.unbind(1))
        for k in range(K):
            frames.append(self.generate(model, torch.stack(frames[-L:], 1), actions[:, k:k + L], steps, generator))
        return torch.stack(frames[L:], 1)

    # -- training -----------------------------------------------------------------------------------
    def closed_loop_horizon(self, step: int, total: int) -> int:
        """Largest number of frames (1 = teacher forcing) the model may roll out before the trained frame."""
        start = int(self.mcfg.closed_loop_start * total)
        if self.H <= 1 or step < start or self.mcfg.closed_loop_start >= 1:
            return 1
        frac = (step - start + 1) / max(total - start, 1)
        return max(1, min(self.H, 1 + int(round(frac * (self.H - 1)))))

    def choose_horizon(self, step: int, total: int) -> int:
        """This step's horizon, uniform in 1..max: teacher-forced examples stay in the mix. A per-step Python
        RNG keeps it a host int (no device sync) and reproducible on resume."""
        h_max = self.closed_loop_horizon(step, total)
        return random.Random(self.cfg.train.seed * 100003 + step).randint(1, h_max) if h_max > 1 else 1

    def _as_ctx(self, ctx_or_gen, device) -> tuple[StepContext, bool]:
        # shim for the current trainer (loss(model, batch, generator)); remove once the spine trainer passes ctx
        if isinstance(ctx_or_gen, torch.Generator):
            if self._shim_extras is None:
                self._shim_extras = {k: e.module.to(device) for k, e in self.extra_modules().items()}
                self._shim_opt = {k: torch.optim.Adam(m.parameters(), lr=e.lr or 2e-4, betas=(0.5, 0.99))
                                  for (k, m), e in zip(self._shim_extras.items(), self.extra_modules().values())}
            ctx = StepContext(step=self._shim_step, total_steps=self.cfg.train.steps, generator=ctx_or_gen,
                              device=device, precision=self.cfg.train.precision, ema=None, extras=self._shim_extras)
            self._shim_step += 1
            return ctx, True
        return ctx_or_gen, False

    def loss(self, model, batch, ctx):
        frames, actions = batch["frames"], batch["actions"]
        ctx, shim = self._as_ctx(ctx, frames.device)
        if shim and getattr(self, "_shim_pending", None) is not None:
            params = [p for p in ctx.extras["disc"].parameters() if p.requires_grad]
            for p, g in zip(params, self._shim_pending):
                p.grad = g
            self._shim_opt["disc"].step()
            self._shim_opt["disc"].zero_grad(set_to_none=True)
            self._shim_pending = None
        gen, L = ctx.generator, self.L
        h = self.choose_horizon(ctx.step, ctx.total_steps)
        context = frames[:, :L]
        if h > 1:  # closed loop: roll out h-1 frames from the real context, then train on frame L+h-1
            # no train/eval switch: the backbone has no dropout or batch norm, and a switch recompiles compiled models
            gen_frames = self.rollout(model, context, actions[:, :L + h - 2], self.mcfg.sample_steps, gen)
            context = torch.cat([context, gen_frames], 1)[:, -L:]
        target, acts = frames[:, L + h - 1], actions[:, h - 1:h - 1 + L]
        last = context[:, -1]  # clean (possibly generated) previous frame: the discriminator's condition
        context, level = augment_context(context, gen, self.mcfg.ctx_noise_max)
        # residual base = the clean (in closed loop: self-generated) last frame, so zero output copies it and closed-loop
        # steps teach the model to correct its own artifacts. Basing on the noised frame was tried on 32x32 Pong
        # (tiny model, 1000 CPU steps): 4 dB worse one-step PSNR, slower drift; the clean base is the default.
        base = last if self.mcfg.residual else None
        loss, est = self.denoise_loss(model, target, context, acts, level, gen, base)
        metrics = {"horizon": h}
        if "disc" not in ctx.extras or self.mcfg.adv_weight <= 0:
            return loss, metrics
        disc = ctx.extras["disc"]
        # one discriminator forward for both losses: spectral norm updates its power-iteration vector in place
        # on every training forward, which would invalidate the graph of an earlier call
        fake, real = disc(torch.cat([est, target]), torch.cat([last, last])).chunk(2)
        adv = finite_or_zero(F.softplus(-fake).mean())
        d_loss = F.softplus(-real).mean() + F.softplus(fake).mean()  # the trainer applies it to the disc params only
        metrics.update({"adv": adv.detach(), "disc_loss": d_loss.detach(),
                        "disc_nonfinite": (~torch.isfinite(d_loss)).float()})
        d_loss = finite_or_zero(d_loss)
        g_loss = loss + self.mcfg.adv_weight * adv
        if shim:  # the disc's gradient now, its step at the next call: stepping now would break this graph's backward
            params = [p for p in disc.parameters() if p.requires_grad]
            self._shim_pending = torch.autograd.grad(d_loss, params, retain_graph=True)
            return g_loss, metrics
        return {"model": g_loss, "disc": d_loss}, metrics

    # -- evaluation, pictures, files ----------------------------------------------------------------
    def evaluate(self, model, data, ctx) -> dict:
        from genlab.world.evaluate import evaluate_world
        return evaluate_world(self, model, data, ctx)

    def preview(self, model, path, ctx):
        from genlab.world.evaluate import rollout_video_from_data
        from genlab.data import build_dataset
        data = build_dataset(ctx["cfg"].data)
        return rollout_video_from_data(self, model, data.val, path.with_suffix(".gif"), ctx["device"],
                                       ctx["generator"], horizon=max(self.H, 16), n=4)

    def sample_to_file(self, model, out, n=4, steps=None, generator=None, device=None, **_):
        from genlab.world.evaluate import rollout_video_from_data
        from genlab.data import build_dataset
        data = build_dataset(self.cfg.data)
        out = out.with_name("rollout.gif") if out.suffix == ".png" else out
        return rollout_video_from_data(self, model, data.val, out, device, generator, horizon=32, n=min(n, 8),
                                       steps=steps)


def psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-sample PSNR in dB of images in [-1, 1] (peak-to-peak 2)."""
    mse = (a.float() - b.float()).pow(2).flatten(1).mean(1)
    return 10 * torch.log10(4.0 / mse.clamp_min(1e-10))


WORLD_KEYS = cf.declare("method",
    objective=cf.F("flow", "world: flow (rectified flow) | edm (Karras preconditioning) | l1 (one-step regression)", choices=("flow", "edm", "l1")),
    residual=cf.F(True, "world: diffuse target - last context frame (zero output = copy the last frame)"),
    residual_scale=cf.F(1.0, "world, residual: the diffused quantity is (target - last frame) * this", gt=0),
    prediction=cf.F("x", "world, flow: the network outputs the clean frame (x; v is derived, the loss stays on v) or "
                             "v = data - noise (v: the net must cancel the noise itself, which leaks into static pixels)", choices=("x", "v")),
    sample_temperature=cf.F(0.0, "world: scale of the starting noise when generating frames (rollouts, play, closed-loop "
                                        "contexts); 1 draws samples, 0 the deterministic frame from the noise mean, whose "
                                        "rollouts track the real frames best (PSNR)", ge=0),
    quantize_frames=cf.F(True, "world: round generated frames to the 256 uint8 levels of real frames (rollouts, "
                                     "closed-loop contexts)"),
    ctx_noise_max=cf.F(0.7, "world: context frames get Gaussian noise of level U(0, this), told to the model", ge=0),
    closed_loop_start=cf.F(0.5, "world: fraction of training after which own rollouts fill the context (1 = never)", ge=0, le=1),
    adv_weight=cf.F(0.0, "world: weight of the adversarial term of a patch discriminator (0 = off)", ge=0),
    disc_lr=cf.F(2e-4, "world: discriminator learning rate (method.adv_weight > 0)", gt=0),
)
WORLD_EVAL_KEYS = cf.declare("eval",
    world_rollouts=cf.F(32, "world: held-out windows per rollout evaluation", ge=1),
    world_horizons=cf.F("16,32", "world: rollout lengths evaluated (per-step PSNR vs copy-last)", free="comma-separated integers >= 1"),
)


def check_world_config(cfg):
    if cfg.method.timestep_sampler == "adaptive":  # its state lives in the flow method
        raise GenlabError("method.timestep_sampler=adaptive is supported by method.name=flow or repa, not world")


@method_registry.register("world", "action-conditioned next-frame diffusion (flow|edm|l1[+adv]), noise-augmented context, "
                                   "closed-loop fine-tuning, few-step Euler rollouts",
                          keys=WORLD_KEYS + WORLD_EVAL_KEYS,
                          reads=("method.timestep_sampler", "method.sampler", "method.sample_steps", "eval.sample_steps"),
                          data_kinds=("episodes",), model_families=("world_dit",), check=check_world_config,
                          sampling_keys=("method.sample_steps", "method.sample_temperature", "method.quantize_frames"))
def build_world(cfg, data_spec):
    if cfg.method.sample_steps < 1:
        raise GenlabError("method.sample_steps must be >= 1")
    return WorldModel(cfg, data_spec)
