"""Samplers on a law whose velocity field is exact (Gaussian data), step schedules, guidance interval."""
import math

import pytest
import torch
from conftest import forbid_host_reads

from genlab.config.tree import load_config
from genlab.core.errors import GenlabError
from genlab.families.image_flow.flow import FlowMatching, cfg_velocity, guidance_plan, parse_interval
from genlab.families.image_flow.timesteps import shift_time
from genlab.sampling.samplers import (call_sampler, nfe_per_step, sample_euler, sample_euler_maruyama, sample_heun,
                                     sample_midpoint, sampler_registry, time_grid)

MU, SIGMA = 1.5, 0.3


def gaussian_velocity(mu, sigma):
    """Exact velocity E[x1 - z | x_t] of x_t = (1-t) z + t x1, z ~ N(0, 1), x1 ~ N(mu, sigma^2), written
    from the joint Gaussian: Cov(x_t, x1) = t sigma^2, Cov(x_t, z) = 1-t, Var x_t = (1-t)^2 + t^2 sigma^2."""
    def v(x, t):
        t = t.view(-1, *([1] * (x.ndim - 1))).to(x.dtype)
        var = (1 - t) ** 2 + t ** 2 * sigma ** 2
        return mu + (t * sigma ** 2 - (1 - t)) / var * (x - t * mu)
    return v


def pushed_gaussian(sampler, steps, schedule="uniform"):
    """The ODE here is affine in x, so a sampler maps N(0, 1) to N(b, a^2) exactly with x -> a x + b:
    two starting points give the output law's mean b and std |a| with no Monte Carlo error."""
    z = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    x = sampler(gaussian_velocity(MU, SIGMA), z, time_grid(steps, schedule=schedule).double())
    return x[0, 0].item(), abs((x[1, 0] - x[0, 0]).item())


def error(sampler, steps, schedule="uniform"):
    mean, std = pushed_gaussian(sampler, steps, schedule)
    return max(abs(mean - MU), abs(std - SIGMA))


@pytest.mark.parametrize("schedule", ["uniform", "shifted", "linear_quadratic"])
@pytest.mark.parametrize("sampler", [sample_euler, sample_heun, sample_midpoint])
def test_ode_samplers_converge_to_the_data_law(sampler, schedule):
    assert error(sampler, 400, schedule) < 5e-3


@pytest.mark.parametrize("sampler,order", [(sample_euler, 1), (sample_heun, 2), (sample_midpoint, 2)])
def test_observed_order_of_convergence(sampler, order):
    """Doubling the steps divides the error by 2^order (Euler first order, Heun and midpoint at least second)."""
    rates = [math.log2(error(sampler, n) / error(sampler, 2 * n)) for n in (16, 32)]
    if order == 1:
        assert all(0.8 < r < 1.2 for r in rates), rates
    else:
        assert all(r > 1.8 for r in rates), rates
    assert error(sampler, 16) <= error(sample_euler, 16) * (1 if order == 1 else 0.1)


def test_nfe_per_step():
    assert [nfe_per_step(n) for n in ("euler", "heun", "midpoint", "euler_maruyama")] == [1, 2, 2, 1]


def test_euler_maruyama_reaches_the_data_law():
    z = torch.randn(20000, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for eta in (0.5, 2.0):
        x = sample_euler_maruyama(gaussian_velocity(MU, SIGMA), z, time_grid(200).double(),
                                  generator=torch.Generator().manual_seed(1), noise=eta)
        assert x.mean().item() == pytest.approx(MU, abs=0.01)  # standard error 0.002
        assert x.std().item() == pytest.approx(SIGMA, rel=0.03)
    # a wrong score (sign flipped) leaves the law: the check has teeth
    def wrong(v):
        return lambda x, t: v(x, t) + 2 * 2.0 * (x - t.view(-1, 1) * v(x, t))  # drift v + eta (x - t v), eta=2
    x = sample_euler_maruyama(wrong(gaussian_velocity(MU, SIGMA)), z, time_grid(200).double(),
                              generator=torch.Generator().manual_seed(1), noise=2.0)
    assert abs(x.std().item() - SIGMA) > 0.1 or abs(x.mean().item() - MU) > 0.1


def test_euler_maruyama_is_euler_without_noise_and_stochastic_with_it():
    z = torch.zeros(4000, 1, dtype=torch.float64)  # one starting point
    v = gaussian_velocity(MU, SIGMA)
    assert torch.equal(sample_euler_maruyama(v, z, time_grid(20).double(), noise=0.0), sample_euler(v, z, time_grid(20).double()))
    x = sample_euler_maruyama(v, z, time_grid(100).double(), generator=torch.Generator().manual_seed(0), noise=3.0)
    assert x.std().item() > 0.5 * SIGMA, "the SDE spreads samples that start at one point"


# -- step schedules ---------------------------------------------------------------------------------------
def test_uniform_and_shifted_grids():
    assert torch.allclose(time_grid(10), torch.linspace(0, 1, 11))
    cfg = load_config("digits_flow", ["method.step_schedule=shifted", "method.sample_shift=3"]).method
    g = time_grid(10, schedule="shifted", cfg=cfg)
    assert torch.allclose(g, shift_time(torch.linspace(0, 1, 11), 3.0)) and g[0] == 0 and g[-1] == 1
    assert (g[1:-1] < torch.linspace(0, 1, 11)[1:-1]).all(), "shift > 1 puts the steps nearer the noise"


def test_linear_quadratic_grid_is_mochis_schedule():
    """Genmo's Mochi linear_quadratic_schedule(N, 0.025), sigma from 1 (noise) to 0; genlab t = 1 - sigma."""
    N, tau = 20, 0.025
    L = N // 2
    diff = L - tau * N
    Q = N - L
    qc, lc = diff / (L * Q ** 2), tau / L - 2 * diff / Q ** 2
    sched = [i * tau / L for i in range(L)] + [qc * i * i + lc * i + qc * L * L for i in range(L, N)] + [1.0]
    assert torch.allclose(time_grid(N, schedule="linear_quadratic").double(), torch.tensor(sched, dtype=torch.float64),
                          atol=1e-6)


# -- classifier-free guidance interval -----------------------------------------------------------------
class CountingModel(torch.nn.Module):
    """v = 1 for the null class, 3 otherwise; records each call's batch size."""
    null_class = 10

    def __init__(self):
        super().__init__()
        self.sizes = []

    def forward(self, x, t, y, **cond):  # cond: a flow map's step size d
        self.sizes.append(x.shape[0])
        return torch.where((y == 10).view(-1, 1), torch.ones_like(x), 3 * torch.ones_like(x)) * (1 + t.view(-1, 1))


def test_guidance_applies_only_inside_its_interval():
    m = CountingModel()
    v = cfg_velocity(m, torch.tensor([1, 2]), null_class=10, scale=2.0, interval=(0.2, 0.8))
    guided, cond = 1 + 2.0 * (3 - 1), 3.0  # at t = 0; the model scales both by 1 + t
    assert torch.allclose(v(torch.zeros(2, 1), torch.full((2,), 0.5)), torch.full((2, 1), 1.5 * guided))
    assert torch.allclose(v(torch.zeros(2, 1), torch.full((2,), 0.1)), torch.full((2, 1), 1.1 * cond))
    assert torch.allclose(v(torch.zeros(2, 1), torch.full((2,), 0.9)), torch.full((2, 1), 1.9 * cond))
    assert torch.allclose(v(torch.zeros(2, 1), torch.tensor([0.5, 0.9])), torch.tensor([[1.5 * guided], [1.9 * cond]]))
    assert m.sizes == [4, 2, 2, 4], "outside the interval one conditional forward, no doubled batch"


@pytest.mark.parametrize("name", sorted(n for n, _ in sampler_registry.specs()))  # every registered sampler
def test_a_guidance_plan_makes_the_read_back_choices_without_reading_the_device(name, monkeypatch):
    """guidance_plan replays a sampler's time points on the host: with it cfg_velocity makes the same one-or-two-
    forward choice per call as reading t back (same samples, same batch per call, both kinds of call present), and no
    tensor is read back during the draw (conftest.forbid_host_reads)."""
    fn, ts, interval = sampler_registry.get(name), time_grid(9, schedule="shifted"), (0.3, 0.7)
    plan = guidance_plan(fn, ts, interval)
    assert plan is not None and set(plan) == {True, False} and len(plan) == 9 * nfe_per_step(name)
    runs = []
    for p in (None, plan):
        m = CountingModel()
        v = cfg_velocity(m, torch.tensor([1, 2]), null_class=10, scale=2.0, interval=interval, plan=p)
        with monkeypatch.context() as mp:
            if p is not None:
                forbid_host_reads(mp)
            out = call_sampler(fn, v, torch.zeros(2, 1), ts, generator=torch.Generator().manual_seed(0), noise=0.5)
        runs.append((out, m.sizes))
    assert torch.equal(runs[0][0], runs[1][0]) and runs[0][1] == runs[1][1]
    assert runs[1][1] == [4 if inside else 2 for inside in plan]
    assert guidance_plan(fn, ts, (0.0, 1.0)) is None  # the whole path: nothing to choose


def test_parse_interval():
    assert parse_interval("0.15,0.8") == (0.15, 0.8)
    for bad in ("0.8,0.2", "1", "a,b", "-0.1,0.5"):
        with pytest.raises(GenlabError, match="cfg_interval"):
            parse_interval(bad)
    with pytest.raises(GenlabError, match="cfg_interval"):
        load_config("digits_flow", ["method.cfg_interval=0.9,0.1"])


def test_flow_sample_uses_schedule_sde_and_interval():
    """FlowMatching.sample wires the configured sampler, schedule, SDE noise and interval together."""
    class Exact(torch.nn.Module):
        null_class = 10

        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(()))
            self.v = gaussian_velocity(MU, SIGMA)

        def forward(self, x, t, y):
            return self.v(x, t)
    cfg = load_config("digits_flow", ["method.sampler=euler_maruyama", "method.step_schedule=shifted",
                                      "method.sde_noise=0.5", "method.cfg_interval=0.2,0.8"])
    method = FlowMatching(cfg, {"kind": "image", "image_size": 4, "channels": 1, "num_classes": 10})
    x = method.sample(Exact(), torch.zeros(512, dtype=torch.long), steps=100, generator=torch.Generator().manual_seed(0))
    assert x.shape == (512, 1, 4, 4)
    g = torch.Generator().manual_seed(0)  # the same start and noise, through the pure function
    z = torch.randn((512, 1, 4, 4), generator=g)
    ref = sample_euler_maruyama(gaussian_velocity(MU, SIGMA), z, time_grid(100, schedule="shifted", cfg=cfg.method),
                                generator=g, noise=0.5)
    assert torch.allclose(x, ref, atol=1e-5)
    assert x.mean().item() == pytest.approx(MU, abs=0.02) and x.std().item() == pytest.approx(SIGMA, rel=0.06)


# -- genlab eval: quality vs NFE ------------------------------------------------------------------------
@pytest.mark.slow  # end to end: tens of seconds on 2 cores; the full suite runs it
def test_eval_reports_quality_vs_nfe(tmp_path):
    from conftest import tiny_config

    from genlab.runs.load import evaluate_run
    from genlab.training.trainer import Trainer
    Trainer(tiny_config(tmp_path, "train.steps=10", "log.ckpt_every=0", "eval.num_samples=0", "train.name=r")).fit()
    run = tmp_path / "r"
    ev = ["eval.num_samples=20", "eval.batch_size=20", "eval.classifier_epochs=1"]
    res = evaluate_run(run, [*ev, "eval.nfe_list=2,5", "eval.samplers=euler,heun"])
    rows = res["nfe_table"]
    assert [(r["sampler"], r["nfe"], r["steps"]) for r in rows] == [("euler", 2, 2), ("euler", 5, 5), ("heun", 2, 1),
                                                                    ("heun", 4, 2)]
    # each row is the plain evaluation at that sampler and step count (the run samples with heun)
    plain = evaluate_run(run, [*ev, "eval.sample_steps=2"])
    assert "nfe_table" not in plain
    assert rows[3]["sample_accuracy"] == plain["sample_accuracy"] and rows[3]["feature_fd"] == plain["feature_fd"]
    md = (run / "eval_nfe.md").read_text()
    assert "| heun | 4 | 2 |" in md and "feature_fd" in md
    with pytest.raises(GenlabError, match="eval.nfe_list"):
        evaluate_run(run, [*ev, "eval.nfe_list=0,4"])
    with pytest.raises(GenlabError, match="unknown eval.samplers entry .rk45."):
        evaluate_run(run, [*ev, "eval.nfe_list=4", "eval.samplers=rk45"])


def test_eval_may_vary_sampling_keys_but_not_training_ones():
    from genlab.config.tree import load_config
    from genlab.core.errors import GenlabError
    from genlab.config.check import sampling_keys_of
    from genlab.runs.load import check_eval_overrides
    cfg = load_config("digits_flow")
    check_eval_overrides(cfg, ["eval.num_samples=10", "method.cfg_interval=0.3,1", "method.sampler=midpoint",
                               "method.sde_noise=0.5", "method.sample_shift=2"])
    keys = sampling_keys_of(cfg.method.name)
    assert "method.cfg_interval" in keys and "method.sde_noise" in keys and "method.timestep_sampler" not in keys
    for bad in ("method.timestep_sampler=uniform", "model.dim=8", "method.name=mdlm"):
        with pytest.raises(GenlabError, match="not allowed here"):
            check_eval_overrides(cfg, [bad])
    text = load_config("text_mdlm")  # each method lists its own sampling keys
    check_eval_overrides(text, ["method.block_len=4", "method.temperature=0.5"])
    with pytest.raises(GenlabError, match="not allowed here"):
        check_eval_overrides(text, ["method.noise_schedule=cosine"])
