"""The few-step family's shared parts (families/few_step/): samplers, the teacher, the student's start; and the
shortcut model. Each distillation method has its own test file."""
from __future__ import annotations

import pytest
import torch

from genlab.core.errors import GenlabError
from tests.conftest import tiny_config

FAST = ["train.steps=40", "log.every=10", "log.ckpt_every=0", "log.sample_every=0", "eval.num_samples=0"]


class CountingVelocity:
    """A velocity field that counts its calls and records the conditions it was given."""

    def __init__(self):
        self.calls, self.seen = 0, []

    def __call__(self, x, t, **cond):
        self.calls += 1
        self.seen.append({k: v.clone() for k, v in cond.items()})
        return -x


@pytest.mark.parametrize("name", ["flow_map", "consistency", "euler"])
@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_an_n_step_few_step_sampler_makes_exactly_n_network_calls(name, n):
    from genlab.sampling.samplers import call_sampler, sampler_registry, time_grid
    v = CountingVelocity()
    out = call_sampler(sampler_registry.get(name), v, torch.randn(3, 1, 4, 4), time_grid(n),
                       generator=torch.Generator().manual_seed(0))
    assert v.calls == n and out.shape == (3, 1, 4, 4)
    if name == "flow_map":  # it feeds the step size of each step
        assert all(torch.allclose(s["d"], torch.full((3,), 1.0 / n)) for s in v.seen)


def test_flow_map_with_the_exact_average_velocity_lands_on_the_exact_solution():
    # dx/dt = -x has the flow map x(t+d) = x(t) e^{-d}; its average velocity over [t, t+d] is x (e^{-d} - 1) / d
    from genlab.sampling.samplers import sample_flow_map, time_grid
    x0 = torch.randn(5, 1, 2, 2, dtype=torch.float64)
    u = lambda x, t, d: x * (torch.exp(-d) - 1).view(-1, 1, 1, 1) / d.view(-1, 1, 1, 1)  # noqa: E731
    for n in (1, 3):
        out = sample_flow_map(u, x0, time_grid(n).double())
        torch.testing.assert_close(out, x0 * torch.exp(torch.tensor(-1.0, dtype=torch.float64)), rtol=1e-12, atol=1e-12)


def test_consistency_sampler_with_an_exact_data_prediction_returns_the_data():
    # velocity whose data estimate x + (1-t) v is always the point `data`: each re-noised step predicts it again
    from genlab.sampling.samplers import sample_consistency
    data = torch.randn(2, 1, 3, 3)
    v = lambda x, t: (data - x) / (1 - t).view(-1, 1, 1, 1)  # noqa: E731
    out = sample_consistency(v, torch.randn(2, 1, 3, 3), torch.linspace(0.0, 0.99, 5),
                             generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(out, data)


def test_a_step_size_sampler_on_a_model_without_that_input_is_a_one_line_error(tmp_path):
    with pytest.raises(GenlabError, match="sampler 'flow_map' feeds the model a 'd' input.*samplers for it: consistency"):
        tiny_config(tmp_path, "method.sampler=flow_map")
    with pytest.raises(GenlabError, match="flow_map"):
        tiny_config(tmp_path, "eval.nfe_list=1,2", "eval.samplers=euler,flow_map")


def test_shortcut_target_is_the_mean_of_two_half_steps_of_the_target_network():
    from genlab.families.few_step.shortcut import two_step_target
    torch.manual_seed(0)
    W = torch.randn(4, 4, dtype=torch.float64) * 0.3

    def net(x, t, y, d):  # any smooth function of all inputs
        return torch.tanh(x @ W) * (1 + t.view(-1, 1, 1, 1)) + d.view(-1, 1, 1, 1) * y.view(-1, 1, 1, 1)
    x, t, d, y = torch.randn(3, 1, 4, 4, dtype=torch.float64), torch.tensor([0.0, 0.25, 0.5], dtype=torch.float64), \
        torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64), torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    # written out: x' = x + d s(x, t, d); target = (s(x, t, d) + s(x', t + d, d)) / 2
    s1 = net(x, t, y, d)
    s2 = net(x + d.view(-1, 1, 1, 1) * s1, t + d, y, d)
    torch.testing.assert_close(two_step_target(net, x, t, d, y), (s1 + s2) / 2, rtol=0, atol=0)


def test_shortcut_trains_its_loss_falls_and_samples_in_one_two_and_four_calls(tmp_path, one_thread):
    from genlab.runtime import checkpoint as ckpt
    from genlab.training.step import build_model_and_method
    from genlab.training.trainer import Trainer
    cfg = tiny_config(tmp_path, "method.name=shortcut", "method.sampler=flow_map", "method.shortcut_min_steps=8",
                      "train.ema_decay=0.9", "train.name=sc", *FAST[1:], "train.steps=60")
    s = Trainer(cfg).fit()
    assert s["status"] == "finished"
    losses = loss_curve(tmp_path / "sc")
    state = ckpt.load_checkpoint(tmp_path / "sc")
    model, method = build_model_and_method(ckpt.config_of(state), state["data_spec"])
    model.load_state_dict(state["ema"])
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    for n in (1, 2, 4):
        calls.clear()
        x = method.sample(model, torch.arange(4), steps=n, cfg_scale=1.0, generator=torch.Generator().manual_seed(0))
        assert len(calls) == n and x.shape == (4, 1, 8, 8) and torch.isfinite(x).all()
    assert losses[-1] < 0.8 * losses[0], losses


def loss_curve(run_dir) -> list[float]:
    from genlab.runtime.metrics import read_metrics
    return [r["loss"] for r in read_metrics(run_dir) if "loss" in r]
