"""Action-conditioned next-frame diffusion (DIAMOND, Alonso et al. 2024, arXiv:2405.12399); docs/world.md. The diffused
quantity is the target minus the last context frame (an output of zero at x prediction is exactly the last frame).
"""
from __future__ import annotations

import random

import torch

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.data.episodes import read_episodes
from genlab.data.pixels import quantize
from genlab.data.windows import spaced_windows
from genlab.eval.nfe import parse_int_list
from genlab.eval.rollouts import evaluate_world, moving_mask
from genlab.families.base import Extra, Method, StepContext, method_registry
from genlab.families.baselines import MAX_IMAGES, Baseline, mean_element_variance
from genlab.families.image_flow.flow import WEIGHT_DRAWS, check_sampler_conditions
from genlab.families.image_flow.timesteps import timestep_sampler_registry
from genlab.families.world import render
from genlab.families.world.objectives import PatchDiscriminator, adversarial_losses, world_objective_registry
from genlab.sampling.samplers import call_sampler, sampler_registry


def augment_context(context: torch.Tensor, generator, max_level: float):
    """Noise the context frames only: returns (noisy context, level [B]). The input is not modified."""
    B = context.shape[0]
    level = torch.rand(B, generator=generator, device=context.device) * max_level
    noise = torch.randn(context.shape, generator=generator, device=context.device, dtype=context.dtype)
    return context + level.view(B, 1, 1, 1, 1).to(context.dtype) * noise, level


def action_guided(model, context, actions, level, guidance: float):
    """net(x, t) for one frame's conditioning: the plain model, or classifier-free guidance on the actions (w != 1),
    both halves in one batched forward."""
    if guidance == 1:
        return lambda x, t: model(x, t, context, actions, level)
    B = context.shape[0]
    keep = torch.cat([torch.ones(B, device=context.device), torch.zeros(B, device=context.device)])
    two = lambda v: torch.cat([v, v])

    def net(x, t):
        cond, null = model(two(x), two(t), two(context), two(actions), two(level), action_keep=keep).chunk(2)
        return null + guidance * (cond - null)
    return net


def check_world_config(cfg):
    keys = WorldEvalKeys.of(cfg.eval)
    if cfg.method.timestep_sampler == "adaptive":  # its state lives in the flow method
        raise GenlabError("method.timestep_sampler=adaptive is supported by method.name=flow or repa, not world")
    parse_int_list(keys.world_horizons, "eval.world_horizons")  # before training, not at the final evaluation
    world = WorldKeys.of(cfg.method)
    if world.sample_ctx_noise > world.ctx_noise_max:  # a level the model never saw in training
        raise GenlabError(f"method.sample_ctx_noise={world.sample_ctx_noise} is above method.ctx_noise_max="
                          f"{world.ctx_noise_max}, the largest context noise level trained; choose 0..{world.ctx_noise_max}")
    if world.action_guidance != 1 and world.action_dropout <= 0:  # the null action was never trained
        raise GenlabError(f"method.action_guidance={world.action_guidance} needs method.action_dropout > 0 (e.g. 0.1): "
                          "guidance pushes away from the null-action prediction, which only dropout trains")
    if keys.world_episodes:  # a wrong folder is found now, not by the final evaluation
        read_episodes(keys.world_episodes)


def motion_weights(target: torch.Tensor, prev: torch.Tensor, motion_weight: float):
    """Per-pixel loss weights [B, H, W] (None when off): 1 + motion_weight where the real target differs from the real
    frame before it (the evaluation's moving pixels), so a ball of a few pixels is not outweighed by the static
    background that copying the last frame already gets right."""
    if motion_weight <= 0:
        return None
    return 1 + motion_weight * moving_mask(target, prev).float()


class WorldModel(Method):
    interactive = True  # `genlab play`: frames from live controls
    render = render  # rollout videos (world/render.py)
    batch_keys = ("frames", "actions")
    best_metric = "tf_mse"
    data_kinds, model_families = ("episodes",), ("world_dit",)
    sampling_keys = ("method.sample_steps", "method.world_sampler", "method.sample_temperature", "method.quantize_frames")

    check_config = staticmethod(check_world_config)

    def __init__(self, cfg, spec):
        m = cfg.method
        if m.world_sampler == "heun" and (m.objective, m.prediction) != ("flow", "v"):  # its 2nd call is at t=1
            raise GenlabError(f"method.world_sampler=heun evaluates the model at t=1, where objective {m.objective} has no "
                              f"velocity (a predicted frame); use euler, midpoint, euler_maruyama or consistency")
        if m.objective == "flow" and (m.prediction, m.loss_space) == ("v", "x"):
            raise GenlabError("method.loss_space=x measures the loss on the predicted frame: it needs method.prediction=x "
                              "(with prediction v the loss is on v; use loss_space=v)")
        check_sampler_conditions("world", [m.world_sampler])  # a step-size sampler needs a model trained with it
        if spec.get("kind") != "episodes":
            raise GenlabError("method.name=world needs episode data (data.name=episodes)")
        self.cfg, self.mcfg, self.spec = cfg, cfg.method, spec
        self.L, self.H = spec["context"], spec["horizon"]
        self.objective = world_objective_registry.get(self.mcfg.objective)()
        self.sample_t = timestep_sampler_registry.get(self.mcfg.timestep_sampler)

    def extra_modules(self) -> dict:
        keys = WorldKeys.of(self.mcfg)
        if keys.adv_weight <= 0:
            return {}
        return {"disc": Extra(PatchDiscriminator(self.spec["channels"]), trainable=True, optimizer="disc",
                              lr=keys.disc_lr)}

    def denoise_loss(self, model, target, context, actions, level, gen, base=None, keep=None, weight=None):
        """(loss, one-step estimate of the clean target) for the configured objective. With `base` (the last
        clean context frame) the diffused quantity is target - base: zero output = copy the last frame. `weight`
        [B, H, W] weighs each pixel's error."""
        k = WorldKeys.of(self.mcfg).residual_scale
        if base is not None:  # scaled: the small residual gets a variance closer to the unit noise it is drawn from
            target = (target - base) * k
        noise = torch.randn(target.shape, generator=gen, device=target.device, dtype=target.dtype)
        extra = {} if keep is None else {"action_keep": keep}  # a backbone without action dropout needs no such input
        loss, est = self.objective.loss(self, lambda x, t: model(x, t, context, actions, level, **extra), target, noise,
                                        gen, weight)
        return (loss, est / k + base) if base is not None else (loss, est)

    @torch.no_grad()
    def generate(self, model, context, actions, steps=None, generator=None, noise=None):
        """One next frame [B,C,H,W] in [-1, 1] from context [B,L,C,H,W] and actions [B,L]; a given `noise` keeps a
        compiled / CUDA-graphed caller's RNG outside the graph."""
        keys = WorldKeys.of(self.mcfg)
        steps = steps or self.mcfg.sample_steps
        last = context[:, -1]  # the residual's base stays the clean frame
        level = torch.full((context.shape[0],), keys.sample_ctx_noise, device=context.device)
        if keys.sample_ctx_noise > 0:  # the context noised as in training, and the model told its level
            context = context + keys.sample_ctx_noise * torch.randn(context.shape, generator=generator,
                                                                    device=context.device, dtype=context.dtype)
        if noise is None:
            noise = torch.randn(last.shape, generator=generator, device=context.device, dtype=context.dtype)
        ts = self.objective.grid(steps, context.device)
        x = noise * keys.sample_temperature * (1 - ts[0])  # temperature 0: the frame from the noise mean (best PSNR)
        net = action_guided(model, context, actions, level, keys.action_guidance)  # this frame's conditioning bound
        x = call_sampler(sampler_registry.get(keys.world_sampler), lambda x, t: self.objective.velocity(self, net, x, t),
                         x, ts, generator=generator, noise=self.mcfg.sde_noise)
        x = (x / keys.residual_scale + last if keys.residual else x).clamp(-1, 1)
        return quantize(x) if keys.quantize_frames else x

    @torch.no_grad()
    def rollout(self, model, context, actions, steps=None, generator=None):
        """Autoregressive rollout: frames [B,K,C,H,W] from real context [B,L,...] and actions [B,L+K-1]; generated
        frames are fed back as context, future ground truth never."""
        L = self.L
        K = actions.shape[1] - L + 1
        frames = list(context.unbind(1))
        for k in range(K):
            frames.append(self.generate(model, torch.stack(frames[-L:], 1), actions[:, k:k + L], steps, generator))
        return torch.stack(frames[L:], 1)

    def closed_loop_horizon(self, step: int, total: int) -> int:
        """Largest number of frames (1 = teacher forcing) the model may roll out before the trained frame."""
        keys = WorldKeys.of(self.mcfg)
        start = int(keys.closed_loop_start * total)
        if self.H <= 1 or step < start or keys.closed_loop_start >= 1:
            return 1
        frac = (step - start + 1) / max(total - start, 1)
        return max(1, min(self.H, 1 + int(round(frac * (self.H - 1)))))

    def choose_horizon(self, step: int, total: int) -> int:
        """This step's horizon, uniform in 1..max, from a per-step Python RNG (a host int, reproducible on resume)."""
        h_max = self.closed_loop_horizon(step, total)
        return random.Random(self.cfg.train.seed * 100003 + step).randint(1, h_max) if h_max > 1 else 1

    def loss(self, model, batch, ctx: StepContext):
        keys = WorldKeys.of(self.mcfg)
        frames, actions = batch["frames"], batch["actions"]
        gen, L = ctx.generator, self.L
        h = self.choose_horizon(ctx.step, ctx.total_steps)
        context = frames[:, :L]
        if h > 1:  # closed loop: roll out h-1 frames from the real context, then train on frame L+h-1
            # no train/eval switch: the backbone has no dropout or batch norm, and a switch recompiles compiled models
            gen_frames = self.rollout(model, context, actions[:, :L + h - 2], self.mcfg.sample_steps, gen)
            context = torch.cat([context, gen_frames], 1)[:, -L:]
        target, acts = frames[:, L + h - 1], actions[:, h - 1:h - 1 + L]
        weight = motion_weights(target, frames[:, L + h - 2], keys.motion_weight)
        last = context[:, -1]  # clean (possibly generated) previous frame: the discriminator's condition
        context, level = augment_context(context, gen, keys.ctx_noise_max)
        # residual base = the clean last frame (the noised one measured 4 dB worse one-step PSNR on 32x32 Pong)
        base = last if keys.residual else None
        keep = None
        if keys.action_dropout > 0:  # the null action's samples: what action guidance extrapolates away from
            keep = (torch.rand(target.shape[0], generator=gen, device=target.device) >= keys.action_dropout).float()
        loss, est = self.denoise_loss(model, target, context, acts, level, gen, base, keep, weight)
        metrics = {"horizon": h}
        if "disc" not in ctx.extras or keys.adv_weight <= 0:
            return loss, metrics
        adv, d_loss, adv_metrics = adversarial_losses(ctx.extras["disc"], est, target, last)
        metrics.update(adv_metrics)
        return {"model": loss + keys.adv_weight * adv, "disc": d_loss}, metrics

    def trivial_baselines(self, data, generator):
        L, out = self.L, []
        # copying the last context frame gains 0 dB (eval/rollouts.py: world_gain_db); an absolute 10 dB scale
        if spaced_windows(data.val, L + 1, 1, "cpu")[0] is not None:
            out.append(Baseline("world_gain_db", 0.0, "0 dB gained over copying the last context frame (teacher-forced "
                                "PSNR or action margin)", higher_is_better=True, scale=10.0))
        if self.mcfg.objective == "flow":  # a regression: the loss of the best constant output, teacher-forced
            out += self.flow_mean_baseline(data, generator)
        # edm and l1 (+adv) have no closed-form constant-output level; the PSNR baseline covers them
        return out

    def flow_mean_baseline(self, data, generator) -> list[Baseline]:
        """The flow objective's loss for a network that outputs the mean of its target: with prediction v,
        Var(target) + 1 (the noise); with x, E[1 / max(1 - t, 0.05)^2] Var(target) (objectives.py: v_from_x), or
        Var(target) with method.loss_space=x. Under method.motion_weight the variance and the mean are weighted."""
        frames, _ = spaced_windows(data.train, self.L + 1, MAX_IMAGES, "cpu")
        if frames is None:
            return []
        target = frames[:, self.L].double()
        weight = motion_weights(frames[:, self.L], frames[:, self.L - 1], self.mcfg.motion_weight)
        if self.mcfg.residual:
            target = (target - frames[:, self.L - 1].double()) * self.mcfg.residual_scale
        var = mean_element_variance(target.numpy(), None if weight is None else weight.unsqueeze(1).expand_as(target).numpy())
        if self.mcfg.prediction == "v":
            return [Baseline("loss", var + 1.0, "velocity loss of predicting the mean frame")]
        if self.mcfg.loss_space == "x":
            return [Baseline("loss", var, "loss of predicting the mean frame")]
        t = self.sample_t(WEIGHT_DRAWS, generator, "cpu", self.mcfg).double()
        return [Baseline("loss", float((1 / (1 - t).clamp_min(0.05) ** 2).mean()) * var, "loss of predicting the mean frame")]

    def evaluate(self, model, data, ctx) -> dict:
        return evaluate_world(lambda context, actions, gen: self.rollout(model, context, actions, generator=gen), self.L,
                              data, ctx)


class WorldKeys(cf.Keys, section="method"):
    objective: str = cf.F("flow", "world: how the next-frame denoiser is trained and sampled", registry="world_objective")
    world_sampler: str = cf.F("euler", "world: the sampler of every generated frame (a flow sampler: the objectives give a "
                                       "velocity; heun needs flow with prediction v)", registry="sampler")
    residual: bool = cf.F(True, "world: diffuse target - last context frame (zero output = copy the last frame)")
    residual_scale: float = cf.F(1.0, "world, residual: the diffused quantity is (target - last frame) * this", gt=0)
    sample_temperature: float = cf.F(0.0, "world: scale of the starting noise when generating frames (rollouts, play, closed-loop "
                                                 "contexts); 1 draws samples, 0 the deterministic frame from the noise mean, whose "
                                                 "rollouts track the real frames best (PSNR)", ge=0)
    quantize_frames: bool = cf.F(True, "world: round generated frames to the 256 uint8 levels of real frames (rollouts, "
                                             "closed-loop contexts)")
    ctx_noise_max: float = cf.F(0.7, "world: context frames get Gaussian noise of level U(0, this), told to the model", ge=0)
    sample_ctx_noise: float = cf.F(0.0, "world: noise level given to the context when generating frames (rollouts, play): "
                                        "noised as in training and the model told so, so it discounts the details its own "
                                        "earlier frames got wrong (Diffusion Forcing, Chen et al. 2024); at most "
                                        "method.ctx_noise_max", ge=0)
    closed_loop_start: float = cf.F(0.5, "world: fraction of training after which own rollouts fill the context (1 = never)", ge=0, le=1)
    action_dropout: float = cf.F(0.0, "world: share of training samples whose actions are dropped (the null action), so "
                                      "method.action_guidance has an action-free prediction to push away from", ge=0, lt=1)
    action_guidance: float = cf.F(1.0, "world: classifier-free guidance on the actions when generating frames: "
                                       "null + w (actions - null); 1 = off; needs method.action_dropout > 0", ge=0)
    motion_weight: float = cf.F(0.0, "world: pixels that move (the real target differs from the real frame before it by "
                                     "more than 1.5 uint8 levels, as in the moving-pixel PSNR) weigh 1 + this in the loss: "
                                     "a Pong ball is ~0.1% of the frame (0 = a plain mean)", ge=0)
    adv_weight: float = cf.F(0.0, "world: weight of the adversarial term of a patch discriminator (0 = off)", ge=0)
    disc_lr: float = cf.F(2e-4, "world: discriminator learning rate (method.adv_weight > 0)", gt=0)


class WorldEvalKeys(cf.Keys, section="eval"):
    world_rollouts: int = cf.F(32, "world: held-out windows per rollout evaluation", ge=1)
    world_horizons: str = cf.F("16,32", "world: rollout lengths evaluated (per-step PSNR vs copy-last)", free="comma-separated integers >= 1")
    world_episodes: str = cf.F("", "world: an episode folder evaluated instead of the run's held-out episodes (seeds or a map "
                               "never trained on; same frame size and actions)", free="a folder made by genlab data collect|import")


method_registry.register("world", "action-conditioned next-frame diffusion (flow|edm|l1[+adv]), noise-augmented context, "
                                  "closed-loop fine-tuning, few-step Euler rollouts",
                         keys=(WorldKeys, WorldEvalKeys),
                         reads=("method.timestep_sampler", "method.sample_steps", "eval.sample_steps"))(WorldModel)
