"""MeanFlow (families/few_step/meanflow.py): the JVP's du/dt against finite differences, the target against a flow
whose average velocity is known in closed form, the loss on a tiny model, DDP gradients, sampling calls, resume."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from conftest import TESTS

from tests.conftest import REPO, straight_and_resumed, tiny_config

MF = ["method.name=meanflow", "method.sampler=flow_map", "method.sample_steps=1", "eval.sample_steps=1",
      "method.cfg_scale=1", "eval.cfg_scale=1"]
FAST = ["log.ckpt_every=0", "log.sample_every=0", "eval.num_samples=0"]
WORKER = TESTS / "meanflow_dist_worker.py"


def tiny_dit64(attention="sdpa"):
    """A tiny DiT with the step-size input, in float64, its weights moved off the zero init (all terms count)."""
    from genlab.families.image_flow.dit import DiT, DiTSpec
    torch.manual_seed(0)
    model = DiT(DiTSpec(image_size=8, channels=1, num_classes=3, dim=32, depth=2, heads=2, attention=attention,
                        conditions=(("d", "scalar"),))).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    return model


def test_du_dt_from_the_jvp_equals_finite_differences_in_float64(one_thread):
    from genlab.families.few_step.meanflow import mean_velocity_jvp
    from genlab.nn.attention import forward_ad_attention
    model = tiny_dit64()
    g = torch.Generator().manual_seed(1)
    x, v = (torch.randn(3, 1, 8, 8, generator=g, dtype=torch.float64) for _ in range(2))
    t = torch.tensor([0.1, 0.4, 0.7], dtype=torch.float64)
    d = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    y = torch.tensor([0, 1, 2])
    u = lambda x, t, d: model(x, t, y, d=d)  # noqa: E731
    with torch.no_grad():
        with forward_ad_attention(model) as fell_back:  # sdpa's CPU flash kernel has no forward-mode AD
            out, du = mean_velocity_jvp(u, x, t, d, v)
        assert fell_back == ["sdpa"]
        # along the trajectory with the end time t + d fixed: x moves by v, t by +1, d by -1 (central differences)
        eps = 1e-7  # truncation ~ eps^2 times 1000^3 (the time embedding of 1000 t), roundoff ~ 1e-16 / eps
        fd = (u(x + eps * v, t + eps, d - eps) - u(x - eps * v, t - eps, d + eps)) / (2 * eps)
        torch.testing.assert_close(out, u(x, t, d), rtol=0, atol=1e-12)
    assert du.abs().max() > 1e-2  # not trivially zero
    torch.testing.assert_close(du, fd, rtol=1e-5, atol=1e-6)


class ExactAverageVelocity(nn.Module):
    """The flow dx/dt = (1 + t) x (a velocity linear in x, varying in t): its flow map over [t, t + d] is
    x e^{d + ((t + d)^2 - t^2) / 2}, so its exact average velocity is u = x (e^{d + ((t+d)^2 - t^2)/2} - 1) / d.
    It takes t and d as a model does, scaled by k for its embedders (method.meanflow_embed_scale / 1000)."""

    def __init__(self, k=1.0):
        super().__init__()
        self.k = k

    def forward(self, x, t, y, d):
        t, d = t.view(-1, 1, 1, 1) / self.k, d.view(-1, 1, 1, 1) / self.k
        return x * torch.expm1(d + ((t + d) ** 2 - t ** 2) / 2) / d


def test_the_target_of_the_exact_average_velocity_is_itself(tmp_path):
    # u = v + d du/dt is the MeanFlow identity: fed the exact u and the exact velocity, the target equals u
    from genlab.families.few_step.meanflow import MeanFlow
    cfg = tiny_config(tmp_path, *MF)
    method = MeanFlow(cfg, {"kind": "image", "channels": 1, "image_size": 8, "num_classes": 3})
    net = ExactAverageVelocity(method.k)
    x = torch.randn(4, 1, 2, 2, dtype=torch.float64)
    t = torch.tensor([0.0, 0.3, 0.5, 0.6], dtype=torch.float64)
    d = torch.tensor([1.0, 0.6, 0.25, 0.0], dtype=torch.float64)
    v = (1 + t).view(-1, 1, 1, 1) * x
    with torch.no_grad():
        target = method.target(net, x, t, d, torch.zeros(4, dtype=torch.long), v, 3)  # the last sample: d = 0
    exact = ExactAverageVelocity()(x[:3], t[:3], None, d[:3])
    torch.testing.assert_close(target[:3], exact, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(target[3:], v[3:], rtol=0, atol=0)  # d = 0: flow matching's velocity
    # the sign of the tangent's d-component matters: with (v, 1, +1) the identity fails
    from torch.func import jvp
    _, wrong = jvp(lambda x, t, d: ExactAverageVelocity()(x, t, None, d), (x[:3], t[:3], d[:3]),
                   (v[:3], torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)))
    assert not torch.allclose(v[:3] + d[:3].view(-1, 1, 1, 1) * wrong, target[:3], atol=1e-3)


def test_the_times_are_sorted_pairs_and_only_the_share_has_a_step(tmp_path):
    from genlab.families.few_step.meanflow import MeanFlow
    cfg = tiny_config(tmp_path, *MF, "method.meanflow_share=0.25")
    method = MeanFlow(cfg, {"kind": "image", "channels": 1, "image_size": 8, "num_classes": 10})
    t, d, n = method.draw_times(64, torch.Generator().manual_seed(0), "cpu")
    assert n == 16 and (d[:16] > 0).all() and (d[16:] == 0).all()
    assert ((t >= 0) & (t + d <= 1)).all()


def test_meanflow_trains_its_loss_falls_and_samples_in_one_and_two_calls(tmp_path, one_thread, capfd, monkeypatch):
    from genlab.families.few_step import meanflow
    from genlab.runtime import checkpoint as ckpt
    monkeypatch.setattr(meanflow, "_NOTED", set())  # the note is once per process: an earlier test may have printed it
    from genlab.runtime.metrics import read_metrics
    from genlab.training.step import build_model_and_method
    from genlab.training.trainer import Trainer
    s = Trainer(tiny_config(tmp_path, *MF, *FAST, "train.steps=120", "log.every=1", "train.name=mf",
                            "method.meanflow_share=0.5")).fit()
    assert s["status"] == "finished"
    assert capfd.readouterr().err.count("meanflow's JVP runs attention sdpa") == 1  # the note, once
    recs = [r for r in read_metrics(tmp_path / "mf") if "loss" in r]
    # the adaptively weighted loss sits near 1 while ||u - target||^2 >> c; the squared errors show the learning
    # (their medians: the JVP share's error has spikes early on, where the network's own du/dt is large)
    for key in ("mse_flow", "mse_jvp"):
        first, last = (torch.tensor([r[key] for r in part]).median() for part in (recs[:20], recs[-20:]))
        assert last < 0.8 * first, (key, first, last)
    assert all(0 < r["loss"] < 1 for r in recs)
    state = ckpt.load_checkpoint(tmp_path / "mf")
    model, method = build_model_and_method(ckpt.config_of(state), state["data_spec"])
    model.load_state_dict(state["ema"])
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    for n in (1, 2):
        calls.clear()
        x = method.sample(model, torch.arange(4), steps=n, generator=torch.Generator().manual_seed(0))
        assert len(calls) == n and x.shape == (4, 1, 8, 8) and torch.isfinite(x).all()


def _launch(out, nproc):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, str(WORKER)] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(WORKER)]
    r = subprocess.run(cmd + [str(out), "--mode", "ddp" if nproc > 1 else "none"], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(out, weights_only=False)


@pytest.mark.slow
def test_ddp_gradients_on_two_ranks_equal_one_process(tmp_path):
    """The prediction runs through DDP (all-reduced), the JVP target on the unwrapped module: 2 gloo ranks with 4
    samples each give the gradient of the 8-sample batch in one process (float32, reductions in another order)."""
    one, two = _launch(tmp_path / "one.pt", 1), _launch(tmp_path / "two.pt", 2)
    assert two["world"] == 2
    assert abs(one["loss"] - two["loss"]) < 1e-5 * abs(one["loss"])
    assert any(g.abs().max() > 1e-3 for g in one["grads"].values())
    for k, g in one["grads"].items():
        torch.testing.assert_close(two["grads"][k], g, rtol=1e-4, atol=1e-6, msg=f"grad {k}")


def test_a_run_stopped_and_resumed_equals_one_trained_straight_through(tmp_path, one_thread):
    from test_few_step import loss_curve
    _, a, b = straight_and_resumed(tmp_path, 3, *MF, *FAST, "train.steps=6", "log.every=1", "train.ema_decay=0.9")
    assert loss_curve(tmp_path / "part") == loss_curve(tmp_path / "full")
    for key in ("model", "ema"):
        for k in a[key]:
            assert torch.equal(a[key][k], b[key][k]), f"{key}.{k} differs after resume"


@pytest.mark.parametrize("backend", ["sdpa_flash", "flex", "sigmoid", "differential", "linear", "math"])
def test_every_attention_entry_has_a_jvp_that_matches_its_function(backend, one_thread):
    """Inside forward_ad_attention the JVP runs through each entry (or its declared fallback): the primal equals the
    entry's own output and the tangent equals finite differences."""
    from genlab.nn.attention import forward_ad_attention
    from genlab.nn.attention_spec import attention_registry
    model = tiny_dit64(backend)
    g = torch.Generator().manual_seed(2)
    x, v = (torch.randn(2, 1, 8, 8, generator=g, dtype=torch.float64) for _ in range(2))
    t, d, y = torch.tensor([0.2, 0.6], dtype=torch.float64), torch.tensor([0.3, 0.1], dtype=torch.float64), torch.tensor([0, 2])
    u = lambda x: model(x, t, y, d=d)  # noqa: E731
    with torch.no_grad():
        with forward_ad_attention(model) as fell_back:
            out, du = torch.func.jvp(u, (x,), (v,))
        assert fell_back == ([] if attention_registry.spec(backend).forward_ad else [backend])
        torch.testing.assert_close(out, u(x), rtol=1e-9, atol=1e-9)
        fd = (u(x + 1e-6 * v) - u(x - 1e-6 * v)) / 2e-6
    torch.testing.assert_close(du, fd, rtol=1e-5, atol=1e-6)
    assert all(m.attend is not None for m in model.modules() if hasattr(m, "attend"))  # restored


@pytest.mark.slow
def test_meanflow_trains_under_train_compile_model_without_recompiles(tmp_path, one_thread):
    """The prediction through the compiled model, the JVP eager on the unwrapped module (its attention swapped and
    restored around it): no guard of the compiled graph fails (~10 s with a warm inductor cache, ~50 s cold)."""
    from genlab.runtime.metrics import read_metrics
    from genlab.training.trainer import Trainer
    s = Trainer(tiny_config(tmp_path, *MF, *FAST, "train.steps=6", "log.every=3", "train.name=mfc",
                            "train.compile=model", "model.attention=sdpa_flash")).fit()
    assert s["status"] == "finished"
    last = [r for r in read_metrics(tmp_path / "mfc") if "loss" in r][-1]
    assert last["recompiles"] == 0 and last["loss"] == last["loss"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_meanflow_trains_compiled_with_bf16_and_flash_attention_on_cuda(tmp_path):
    """train.compile=model on the GPU, with SDPA's fused kernels in the prediction and the math kernel in the JVP."""
    from genlab.training.trainer import Trainer
    s = Trainer(tiny_config(tmp_path, *MF, *FAST, "train.steps=20", "log.every=5", "train.name=mfc",
                            "train.device=cuda", "train.compile=model", "model.attention=sdpa_flash")).fit()
    assert s["status"] == "finished" and s["loss"] == s["loss"]


def test_a_jvp_that_cannot_be_compiled_runs_eager_with_one_note(capfd):
    from genlab.families.few_step.meanflow import _eager_if_uncompilable
    calls = []

    def broken(*a):
        calls.append("compiled")
        raise RuntimeError("dynamo cannot trace this")

    def eager(x):
        calls.append("eager")
        return x + 1
    fn = _eager_if_uncompilable(broken, eager)
    assert fn(1) == 2 and fn(2) == 3
    assert calls == ["compiled", "eager", "eager"]  # tried once, then eager for good
    assert capfd.readouterr().err.count("could not be compiled") == 1
