"""Rectified flow: the model sees the noisy input, samplers integrate the exact ODE correctly."""
import math

import pytest
import torch

from genlab.config.tree import load_config
from conftest import plain_context
from genlab.families.image_flow.flow import FlowMatching, cfg_velocity, interpolate
from genlab.families.image_flow.timesteps import logit_normal, uniform
from genlab.sampling.samplers import sample_euler, sample_heun, time_grid

SPEC = {"kind": "image", "image_size": 8, "channels": 1, "num_classes": 10}


class SpyModel(torch.nn.Module):
    """Records what the method feeds it and predicts zero velocity."""
    null_class = 10

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.calls = []

    def forward(self, x_t, t, y):
        self.calls.append((x_t.detach().clone(), t.detach().clone(), y.detach().clone()))
        return torch.zeros_like(x_t) + self.w


def test_flow_loss_feeds_the_noisy_input_and_targets_data_minus_noise():
    cfg = load_config("digits_flow", ["method.timestep_sampler=uniform"])
    method = FlowMatching(cfg, SPEC)
    data = torch.rand(4096, 1, 8, 8) * 2 - 1
    model = SpyModel()
    loss, _ = method.loss(model, {"image": data, "label": torch.randint(0, 10, (4096,))}, plain_context(torch.Generator().manual_seed(0)))
    x_t, t, _ = model.calls[0]
    assert not torch.allclose(x_t, data), "the model was fed the clean image"
    tt = t.view(-1, 1, 1, 1)
    keep = (t < 0.9)
    noise = ((x_t - tt * data) / (1 - tt))[keep]  # what must have been the Gaussian noise
    assert abs(noise.mean().item()) < 0.02 and abs(noise.std().item() - 1) < 0.02
    corr = torch.corrcoef(torch.stack([noise.flatten(), data[keep].flatten()]))[0, 1]
    assert abs(corr.item()) < 0.02, "x_t must mix in noise independent of the data"
    # with zero predicted velocity, the loss is E|data - noise|^2 of exactly that noise
    full_noise = (x_t - tt * data) / (1 - tt)
    assert loss.item() == pytest.approx(((data - full_noise) ** 2).mean().item(), rel=1e-3)


def test_interpolate_endpoints():
    noise, data = torch.randn(3, 2), torch.randn(3, 2)
    assert torch.allclose(interpolate(noise, data, torch.zeros(3)), noise)
    assert torch.allclose(interpolate(noise, data, torch.ones(3)), data)


def test_class_dropout_uses_the_null_class():
    cfg = load_config("digits_flow", ["model.class_dropout=0.5"])
    method = FlowMatching(cfg, SPEC)
    model = SpyModel()
    method.loss(model, {"image": torch.zeros(2000, 1, 8, 8), "label": torch.zeros(2000, dtype=torch.long)},
                plain_context(torch.Generator().manual_seed(0)))
    y = model.calls[0][2]
    assert set(y.unique().tolist()) == {0, 10}
    assert abs((y == 10).float().mean().item() - 0.5) < 0.05


def gaussian_velocity(mu, sigma):
    """Exact velocity of the rectified-flow path from N(0, I) noise to N(mu, sigma^2 I) data."""
    def v(x, t):
        t = t.view(-1, *([1] * (x.ndim - 1))).to(x.dtype)
        s2 = (1 - t) ** 2 + t ** 2 * sigma ** 2
        return mu + (t * sigma ** 2 - (1 - t)) / s2 * (x - t * mu)
    return v


@pytest.mark.parametrize("sampler,steps,tol", [(sample_euler, 400, 1e-2), (sample_heun, 40, 2e-3)])
def test_samplers_reach_the_exact_gaussian_transport(sampler, steps, tol):
    mu, sigma = 1.5, 0.3
    z = torch.randn(20000, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    x1 = sampler(gaussian_velocity(mu, sigma), z, time_grid(steps).double())
    # the flow map of this linear ODE is x1 = mu + sigma * z, sample by sample
    assert (x1 - (mu + sigma * z)).abs().max().item() < tol
    assert x1.mean().item() == pytest.approx(mu, abs=0.01)
    assert x1.std().item() == pytest.approx(sigma, rel=0.02)


def test_heun_is_second_order_euler_first_order():
    mu, sigma = 1.0, 0.5
    z = torch.randn(100, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    exact = mu + sigma * z
    err = {}
    for name, s in (("euler", sample_euler), ("heun", sample_heun)):
        e1 = (s(gaussian_velocity(mu, sigma), z, time_grid(20).double()) - exact).abs().max().item()
        e2 = (s(gaussian_velocity(mu, sigma), z, time_grid(40).double()) - exact).abs().max().item()
        err[name] = math.log2(e1 / e2)
    assert 0.8 < err["euler"] < 1.2
    assert 1.8 < err["heun"] < 2.2


def test_cfg_velocity_combines_conditional_and_unconditional():
    def model(x, t, y):
        return torch.where((y == 10).view(-1, 1), torch.ones_like(x), 3 * torch.ones_like(x))
    v = cfg_velocity(model, torch.tensor([1, 2]), null_class=10, scale=2.0)(torch.zeros(2, 1), torch.zeros(2))
    assert torch.allclose(v, torch.full((2, 1), 1 + 2.0 * (3 - 1)))


def test_timestep_samplers_distribution():
    g = torch.Generator().manual_seed(0)
    u = uniform(100000, g, "cpu")
    assert 0 <= u.min() and u.max() <= 1 and abs(u.mean().item() - 0.5) < 0.01
    ln = logit_normal(100000, g, "cpu")
    logits = torch.log(ln / (1 - ln))
    assert abs(logits.mean().item()) < 0.02 and abs(logits.std().item() - 1) < 0.02


@pytest.mark.parametrize("n,k", [(64, 10), (20, 10), (5, 10), (64, 3), (64, 16)])
def test_sample_grid_is_laid_out_by_class(tmp_path, n, k):
    """`genlab sample --n N`: every grid column holds one class, whatever N (64 of 10 classes used to wrap at 8)."""
    import numpy as np
    from PIL import Image
    fm = FlowMatching(load_config(None, []), {"num_classes": k, "image_size": 4, "channels": 1})
    # each sample a flat image whose level encodes its class
    fm.draw = lambda model, n, class_id=None, device=None, **_: (
        fm.labels_for(n, class_id, None, device).float().view(-1, 1, 1, 1).expand(n, 1, 4, 4) * 2 / k - 1)
    out = fm.render.sample_to_file(fm, None, tmp_path / "g.png", n=n, device="cpu")
    grid = np.asarray(Image.open(out))[::16, ::16]  # save_grid draws 4-px images 16x larger, 1-px gaps
    cols, rows = (grid.shape[1] - 1) // 5, (grid.shape[0] - 1) // 5
    assert (cols % k == 0 or cols == n < k) and rows == -(-n // cols)
    for i in range(n):
        r, c = divmod(i, cols)
        assert round(grid[1 + r * 5, 1 + c * 5] / 255 * k) == c % k, (i, r, c)
