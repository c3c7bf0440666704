"""Training-time samplers: each draw's law against its paper's closed form (KS distance on the CDF),
the resolution shift, Min-SNR weighting, and the adaptive sampler's update and checkpointed state."""
import math

import numpy as np
import pytest
import torch
from conftest import tiny_config
from scipy import integrate, optimize, stats

from genlab.config.tree import load_config
from conftest import plain_context
from genlab.families.image_flow.timesteps import AdaptiveTimesteps
from genlab.families.image_flow.flow import FlowMatching
from genlab.families.image_flow.loss_weighting import min_snr
from genlab.families.image_flow.timesteps import DENSITIES, resolve_shift, shift_time, timestep_sampler_registry

SPEC = {"kind": "image", "image_size": 8, "channels": 1, "num_classes": 10}
N = 200_000
KS_TOL = 0.006  # the 1% KS critical value at n = 2e5 is 0.0036


def ks(draws: torch.Tensor, cdf) -> float:
    """Largest gap between the empirical CDF of the draws and a reference CDF (vectorised over a grid)."""
    x = np.sort(draws.double().numpy())
    grid = np.linspace(0.0005, 0.9995, 400)
    emp = np.searchsorted(x, grid, side="right") / len(x)
    return float(np.max(np.abs(emp - np.array([cdf(g) for g in grid]))))


def cdf_of_pdf(pdf):
    total = integrate.quad(pdf, 0, 1, limit=200)[0]
    return lambda x: integrate.quad(pdf, 0, x, limit=200)[0] / total


# -- references written from the papers, in float64 (independent of the implementation) -----------
def sd3_cosmap_pdf(t):  # SD3 eq. 17, symmetric about 1/2, so its convention does not matter
    return 2 / (math.pi - 2 * math.pi * t + 2 * math.pi * t * t)


def sd3_mode_cdf(s):
    # SD3: t_sd3 = f_mode(u) = 1 - u - s (cos^2(pi u/2) - 1 + u), decreasing in u; genlab t = 1 - t_sd3
    f = lambda u: 1 - u - s * (math.cos(math.pi * u / 2) ** 2 - 1 + u)  # noqa: E731
    return lambda x: optimize.brentq(lambda u: (1 - f(u)) - x, 0, 1, xtol=1e-12)  # P(1 - f(U) <= x) = u*(x)


def mochi_cdf(threshold=0.025, linear_frac=0.5, steps=2000):
    """Mochi's discrete linear_quadratic_schedule (sigma, 1 = noise), turned into genlab t = 1 - sigma; the law of
    t under uniform step fractions is the step fraction at which the schedule reaches t."""
    L = int(steps * linear_frac)
    lin = [i * threshold / L for i in range(L)]
    diff = L - threshold * steps
    Q = steps - L
    qc = diff / (L * Q ** 2)
    lc = threshold / L - 2 * diff / Q ** 2
    const = qc * L ** 2
    quad = [qc * i * i + lc * i + const for i in range(L, steps)]
    t = np.array(lin + quad + [1.0])  # = 1 - Mochi's sigma
    frac = np.linspace(0, 1, steps + 1)
    return lambda x: float(np.interp(x, t, frac))


@pytest.mark.parametrize("name,overrides,cdf", [
    ("uniform", [], lambda x: x),
    ("linear", [], lambda x: x),
    ("logit_normal", ["method.logit_mean=0.5", "method.logit_std=0.8"],
     lambda x: stats.norm.cdf((math.log(x / (1 - x)) - 0.5) / 0.8)),
    ("cosine", [], cdf_of_pdf(sd3_cosmap_pdf)),
    ("mode", [], sd3_mode_cdf(1.29)),
    ("mode", ["method.mode_scale=-0.5"], sd3_mode_cdf(-0.5)),
    ("linear_quadratic", [], mochi_cdf()),
    ("linear_quadratic", ["method.lq_threshold=0.1", "method.lq_linear_frac=0.3"], mochi_cdf(0.1, 0.3)),
    ("speed", [], cdf_of_pdf(lambda t: 1.0 if t < 0.11 else 5.0)),
    ("speed", ["method.speed_tau=0.3", "method.speed_k=2"], cdf_of_pdf(lambda t: 1.0 if t < 0.3 else 2.0)),
])
def test_sampler_law_matches_its_closed_form(name, overrides, cdf):
    cfg = load_config("digits_flow", [f"method.timestep_sampler={name}", *overrides])
    t = timestep_sampler_registry.get(name)(N, torch.Generator().manual_seed(0), "cpu", cfg.method)
    assert t.shape == (N,) and t.min() >= 0 and t.max() <= 1
    assert ks(t, cdf) < KS_TOL


@pytest.mark.parametrize("name", sorted(DENSITIES))
def test_docs_densities_integrate_the_draws(name):
    """The densities drawn in docs/timesteps.png are those of the samplers: their integral is the draws' CDF."""
    cfg = load_config("digits_flow", [f"method.timestep_sampler={name}"]).method
    t = timestep_sampler_registry.get(name)(N, torch.Generator().manual_seed(1), "cpu", cfg)
    grid = torch.linspace(1e-6, 1 - 1e-6, 20001, dtype=torch.float64)
    pdf = DENSITIES[name](grid, cfg)
    cdf = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumulative_trapezoid(pdf, grid)])
    assert cdf[-1].item() == pytest.approx(1.0, abs=2e-3)
    assert ks(t, lambda x: float(np.interp(x, grid.numpy(), cdf.numpy()))) < KS_TOL


def test_a_wrong_formula_fails_the_ks_check():
    """The tolerance has teeth: SpeeD with the areas swapped, or uniform, is rejected."""
    cfg = load_config("digits_flow", ["method.timestep_sampler=speed"]).method
    swapped = cdf_of_pdf(lambda t: 5.0 if t < 0.11 else 1.0)
    t = timestep_sampler_registry.get("speed")(N, torch.Generator().manual_seed(0), "cpu", cfg)
    assert ks(t, swapped) > 10 * KS_TOL and ks(t, lambda x: x) > 5 * KS_TOL


# -- resolution shift ---------------------------------------------------------------------------------
def test_shift_is_sd3s_map_in_genlab_convention():
    t = torch.rand(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for a in (0.5, 2.0, 3.0):
        s = 1 - t  # SD3 time (1 = noise)
        s_shift = a * s / (1 + (a - 1) * s)  # SD3 section 5.3.2
        assert torch.allclose(shift_time(t, a), 1 - s_shift, atol=1e-12)
        snr = lambda x: (x / (1 - x)) ** 2  # noqa: E731
        assert torch.allclose(snr(shift_time(t, a)), snr(t) / a ** 2, rtol=1e-9)
    assert (shift_time(t, 3.0) < t).all(), "shift > 1 moves training times toward the noise (t=0)"
    assert resolve_shift(0, 64, 32) == pytest.approx(2.0) and resolve_shift(1.5, 64, 32) == 1.5


def test_flow_draws_shifted_times():
    cfg = load_config("digits_flow", ["method.timestep_sampler=uniform", "method.time_shift=3"])
    t = FlowMatching(cfg, SPEC).draw_t(N, torch.Generator().manual_seed(0), "cpu")
    a = 3.0  # P(t/(a(1-t)+t) <= x) = P(t <= a x / (1 - x + a x))
    assert ks(t, lambda x: a * x / (1 - x + a * x)) < KS_TOL
    auto = FlowMatching(load_config("digits_flow", ["method.time_shift=0", "method.shift_base=4"]), SPEC)
    assert auto.shift == pytest.approx(2.0)  # sqrt(8*8 / (4*4))


# -- Min-SNR ------------------------------------------------------------------------------------------
def test_min_snr_weights_the_data_error_by_min_snr_gamma():
    t = torch.rand(500, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.98 + 0.01
    cfg = load_config("digits_flow", ["method.loss_weighting=min_snr", "method.snr_gamma=4"]).method
    e_v = torch.randn(500, dtype=torch.float64)
    e_x = (1 - t) * e_v  # x_hat = x_t + (1-t) v_hat: the data error is (1-t) times the velocity error
    e_eps = -t * e_v      # eps_hat = x_t - t v_hat
    snr = t ** 2 / (1 - t) ** 2
    w = min_snr(t, cfg)
    assert torch.allclose(w * e_v ** 2, torch.minimum(snr, torch.tensor(4.0, dtype=torch.float64)) * e_x ** 2)
    assert torch.allclose(w * e_v ** 2, torch.clamp(snr, max=4.0) / snr * e_eps ** 2)


class ZeroModel(torch.nn.Module):
    null_class = 10

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.t = None

    def forward(self, x, t, y):
        self.t = t
        return torch.zeros_like(x) + self.w


def test_flow_loss_applies_the_weighting_per_sample():
    cfg = load_config("digits_flow", ["method.loss_weighting=min_snr", "method.timestep_sampler=uniform",
                                      "model.class_dropout=0"])
    method, model = FlowMatching(cfg, SPEC), ZeroModel()
    data = torch.rand(64, 1, 8, 8) * 2 - 1
    loss, _ = method.loss(model, {"image": data, "label": torch.zeros(64, dtype=torch.long)},
                          plain_context(torch.Generator().manual_seed(0)))
    g = torch.Generator().manual_seed(0)  # replay the method's draws: t, then the noise
    t = torch.rand(64, generator=g)
    noise = torch.randn(data.shape, generator=g)
    assert torch.equal(model.t, t)
    per = ((data - noise) ** 2).flatten(1).mean(1)
    assert loss.item() == pytest.approx((torch.minimum(t ** 2, 5 * (1 - t) ** 2) * per).mean().item(), rel=1e-5)


# -- adaptive (Kim et al. 2025) -------------------------------------------------------------------------
def test_adaptive_draws_follow_its_piecewise_constant_law():
    a = AdaptiveTimesteps(bins=8, mix=0.2, every=10**9)
    a.logits.copy_(torch.tensor([2.0, -1.0, 0.0, 1.0, -2.0, 0.5, 0.0, 3.0]))
    p = 0.8 * torch.softmax(a.logits.double(), 0) + 0.2 / 8
    t = a.draw(N, torch.Generator().manual_seed(0), "cpu", step=1)
    cdf = lambda x: float(p[: int(x * 8)].sum() + p[min(int(x * 8), 7)] * (x * 8 - int(x * 8)))  # noqa: E731
    assert ks(t, cdf) < KS_TOL


def test_adaptive_update_step_trains_one_bin_shared_by_every_rank():
    a = AdaptiveTimesteps(bins=8, every=5, seed=3)
    t1 = a.draw(64, torch.Generator().manual_seed(0), "cpu", step=10)
    t2 = a.draw(64, torch.Generator().manual_seed(1), "cpu", step=10)  # another rank: another generator
    b1, b2 = (t1 * 8).floor().unique(), (t2 * 8).floor().unique()
    assert len(b1) == 1 and torch.equal(b1, b2)
    assert len((a.draw(4096, torch.Generator().manual_seed(0), "cpu", step=11) * 8).floor().unique()) == 8


def test_reinforce_moves_mass_to_the_bin_whose_updates_pay():
    a = AdaptiveTimesteps(bins=8, lr=0.2, mix=0.1)
    g = torch.Generator().manual_seed(0)
    for step in range(400):
        b = a.shared_bin(step, a.probs())
        reward = (1.0 if b.item() == 5 else 0.0) + 0.3 * torch.randn((), generator=g)
        a.reinforce(b, reward)
    p = a.probs()
    assert p.argmax().item() == 5 and p[5] > 2 / 8 and p[5] > 2 * p[torch.arange(8) != 5].max()
    assert p.min() >= 0.1 / 8 - 1e-6, "the uniform mixture keeps every bin alive"


def test_entropy_bonus_keeps_the_policy_near_uniform_under_pure_noise():
    spread = {}
    for entropy in (0.0, 1.0):
        a = AdaptiveTimesteps(bins=8, lr=0.2, mix=0.1, entropy=entropy)
        g = torch.Generator().manual_seed(0)
        for step in range(1000):
            a.reinforce(a.shared_bin(step, a.probs()), torch.randn((), generator=g))
        spread[entropy] = a.probs().max().item()
    assert spread[1.0] < 0.25 < spread[0.0], spread


def test_adaptive_state_is_checkpointed_and_resumed(tmp_path):
    from genlab.runtime import checkpoint as ckpt
    from genlab.training.trainer import Trainer
    common = ["method.timestep_sampler=adaptive", "method.adaptive_every=2", "method.adaptive_lr=0.5",
              "train.steps=12", "log.every=6", "log.ckpt_every=0", "eval.num_samples=0"]
    Trainer(tiny_config(tmp_path, *common, "train.name=a")).fit()
    state = ckpt.load_checkpoint(tmp_path / "a")["extras"]["timesteps"]
    assert state["updates"].item() == 6  # probes at steps 0, 2, ..., 10, each measured again one step later
    assert state["logits"].abs().sum() > 0
    Trainer(tiny_config(tmp_path, *common, "train.name=a", "train.steps=14"), resume=str(tmp_path / "a")).fit()
    assert ckpt.load_checkpoint(tmp_path / "a")["extras"]["timesteps"]["updates"].item() == 7, \
        "the resumed run continues the saved state (a fresh one would count 1 update)"


def test_timesteps_sweep_expands_to_every_sampler():
    from genlab.lab.sweep.spec import load_sweep
    sw = load_sweep("timesteps")  # every variant's full config is validated here
    used = {o.split("=", 1)[1] for v in sw.variants for o in v.overrides if o.startswith("method.timestep_sampler=")}
    assert used == set(timestep_sampler_registry.names()) - {"linear"}  # linear is an alias of uniform
    assert any("method.loss_weighting=min_snr" in v.overrides for v in sw.variants)
    assert {v.seed for v in sw.variants} == {0} and all("train.steps=1000" in v.overrides for v in sw.variants)
    assert {"sample_accuracy", "feature_fd"} <= set(sw.metrics)
