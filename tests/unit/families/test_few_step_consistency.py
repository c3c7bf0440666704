"""Consistency distillation (LCM) and consistency tuning (ECT) from a flow teacher: families/few_step/lcm.py, ect.py."""
from __future__ import annotations

import copy

import pytest
import torch

from genlab.core.errors import GenlabError
from tests.conftest import straight_and_resumed, tiny_config

FAST = ["log.every=5", "log.ckpt_every=0", "log.sample_every=0", "eval.num_samples=0"]
LCM = ["method.name=lcm", "method.sampler=consistency", "method.lcm_timesteps=8", "method.lcm_skip=2",
       "method.cfg_scale=1", "train.ema_decay=0.9"]
ECT = ["method.name=ect", "method.sampler=consistency", "method.cfg_scale=1", "method.ect_stages=1"]


def loss_curve(run_dir) -> list[float]:
    from genlab.runtime.metrics import read_metrics
    return [r["loss"] for r in read_metrics(run_dir) if "loss" in r]


# -- LCM -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("solver", ["euler", "heun"])
def test_lcm_target_is_one_guided_teacher_step_then_the_ema_consistency_function(tmp_path, flow_teacher, solver):
    from genlab.families.few_step.base import build_teacher
    from genlab.families.few_step.lcm import lcm_target
    from genlab.runtime import checkpoint as ckpt
    from genlab.training.step import build_model_and_method
    state = ckpt.load_checkpoint(flow_teacher)
    teacher = build_teacher(state).double()
    model, _ = build_model_and_method(tiny_config(tmp_path, *LCM, f"method.teacher={flow_teacher}"), state["data_spec"])
    ema = copy.deepcopy(model).double().eval()
    torch.manual_seed(0)
    with torch.no_grad():  # an EMA that differs from the teacher, its w embedder included
        for p in ema.parameters():
            p.add_(0.05 * torch.randn_like(p))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 1, 8, 8, generator=g, dtype=torch.float64)
    t = torch.tensor([0.0, 0.25, 0.5, 0.75], dtype=torch.float64)
    s = t + 0.25
    y = torch.tensor([0, 3, 7, 10])  # 10: the null class (a dropped label)
    w, w_max = torch.tensor([1.0, 1.7, 2.4, 3.0], dtype=torch.float64), 3.0
    null = teacher.null_class
    with torch.no_grad():
        got = lcm_target(teacher, ema, x, t, s, y, w, w_max, null, solver)
        # written out one sample at a time: v = v_u + w (v_c - v_u), a step from t to s, then f(x, s) = x + (1 - s) v
        want = []
        for i in range(4):
            xi, ti, si, yi, wi = x[i:i + 1], t[i:i + 1], s[i:i + 1], y[i:i + 1], w[i].item()

            def v(z, tt):
                v_c = teacher(z, tt, yi)
                v_u = teacher(z, tt, torch.full_like(yi, null))
                return v_u + wi * (v_c - v_u)
            v1 = v(xi, ti)
            x_s = xi + (si - ti).item() * v1
            if solver == "heun":
                x_s = xi + (si - ti).item() * (v1 + v(x_s, si)) / 2
            want.append(x_s + (1 - si).item() * ema(x_s, si, yi, w=torch.tensor([wi / w_max], dtype=torch.float64)))
    torch.testing.assert_close(got, torch.cat(want), rtol=1e-9, atol=1e-9)


def test_lcm_trains_from_its_teacher_its_loss_falls_it_is_the_identity_at_t1_and_samples_in_n_calls(
        tmp_path, flow_teacher, one_thread):
    from genlab.runtime import checkpoint as ckpt
    from genlab.training.step import build_model_and_method
    from genlab.training.trainer import Trainer
    s = Trainer(tiny_config(tmp_path, *LCM, *FAST, f"method.teacher={flow_teacher}", "train.steps=60",
                            "optim.lr=3e-3", "train.name=lcm")).fit()
    assert s["status"] == "finished"
    losses = loss_curve(tmp_path / "lcm")
    assert sum(losses[-3:]) < 0.8 * sum(losses[:3]), losses
    state = ckpt.load_checkpoint(tmp_path / "lcm")
    assert "teacher" in state["extras"]  # sampling the student never needs the teacher run
    model, method = build_model_and_method(ckpt.config_of(state), state["data_spec"])
    model.load_state_dict(state["ema"])
    _boundary_and_calls(model, method, {"w": torch.full((4,), 0.4)})
    # the guidance fed to the student is a sampling key: eval/sample may change it within the trained range
    from genlab.runs.load import load_run
    _, _, m2, _, _ = load_run(tmp_path / "lcm", device="cpu", overrides=["method.lcm_guidance=2.4"])
    torch.testing.assert_close(m2.sample_conditions(2, "cpu")["w"], torch.full((2,), 0.8))
    with pytest.raises(GenlabError, match="must lie in the trained range"):
        load_run(tmp_path / "lcm", device="cpu", overrides=["method.lcm_guidance=3.5"])


def _boundary_and_calls(model, method, cond):
    from genlab.families.few_step.base import consistency_fn
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():  # the boundary condition of a trained student: f(x, 1) = x
        assert torch.equal(consistency_fn(model, x, torch.ones(4), torch.arange(4), **cond), x)
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    for n in (1, 2, 4, 8):
        calls.clear()
        out = method.sample(model, torch.arange(4), steps=n, cfg_scale=1.0, generator=torch.Generator().manual_seed(0))
        assert len(calls) == n and out.shape == (4, 1, 8, 8) and torch.isfinite(out).all()


def test_lcm_guidance_outside_the_trained_range_is_a_one_line_error(tmp_path):
    with pytest.raises(GenlabError, match=r"lcm_guidance \(4.0\) must lie in the trained range"):
        tiny_config(tmp_path, *LCM, "method.lcm_guidance=4")
    with pytest.raises(GenlabError, match="lcm_skip"):
        tiny_config(tmp_path, *LCM, "method.lcm_skip=8")


# -- ECT -----------------------------------------------------------------------------------------
def test_ect_gap_shrinks_stage_by_stage_and_every_r_lies_between_t_and_the_data():
    from genlab.families.few_step.ect import ect_r, ect_stage
    q, k, b, stages = 2.0, 8.0, 1.0, 8
    t = torch.sigmoid(torch.linspace(-8, 8, 401, dtype=torch.float64))  # sigma from e^-8 to e^8
    sigma = (1 - t) / t
    prev = prev_gap = None
    for stage in range(stages):
        r, gap = ect_r(t, stage, q, k, b)
        assert ((r > t) & (r <= 1)).all()
        # ECT in sigma units, written out: sigma_r = max(0, sigma (1 - n(sigma) / q^(stage+1)))
        sigma_r = (sigma * (1 - (1 + k * torch.sigmoid(-b * sigma)) / q ** (stage + 1))).clamp_min(0)
        torch.testing.assert_close(r, 1 / (1 + sigma_r), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(gap, sigma - sigma_r, rtol=1e-12, atol=1e-12)
        if prev is not None:
            assert (r - t <= prev - t).all() and (r - t < prev - t).any()
            assert (gap[sigma_r > 0] < prev_gap[sigma_r > 0]).all()
        prev, prev_gap = r, gap
    # the last stage's gap is a 1/q^S share of sigma n(sigma) <= 5 sigma: dt -> 0
    assert (gap <= 5 * sigma / q ** stages).all()
    # float32, as the loss computes it: still strictly inside (t, 1]
    t32 = torch.sigmoid(1.1 + 2.0 * torch.randn(100_000, generator=torch.Generator().manual_seed(0)))
    for stage in (0, stages - 1):
        r32, _ = ect_r(t32, stage, q, k, b)
        assert ((r32 > t32) & (r32 <= 1)).all()
    # stages over training: S equal spans of train.steps, 0 first, S-1 last
    seen = [ect_stage(i, 800, stages) for i in range(800)]
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] == stages - 1
    assert [seen.count(j) for j in range(stages)] == [100] * stages


def test_ect_starts_from_the_teacher_its_loss_falls_it_is_the_identity_at_t1_and_samples_in_n_calls(
        tmp_path, flow_teacher, one_thread):
    from genlab.runtime import checkpoint as ckpt
    from genlab.training.step import build_model_and_method
    from genlab.training.trainer import Trainer
    # one stage (a fixed gap) so that the loss compares like with like; its noise floor is a diffusion loss's
    cfg = tiny_config(tmp_path, *ECT, *FAST, f"method.teacher={flow_teacher}", "train.steps=100", "optim.lr=2e-3",
                      "train.batch_size=32", "train.ema_decay=0.9", "train.name=ect")
    teacher = ckpt.load_checkpoint(flow_teacher)
    fresh, m = build_model_and_method(cfg, teacher["data_spec"])
    m.init_weights(fresh)
    own = fresh.state_dict()
    assert all(torch.equal(own[k], v) for k, v in teacher["ema"].items())  # a fresh student is the teacher
    tr = Trainer(cfg)
    assert tr.fit()["status"] == "finished"
    assert "teacher" not in tr.steps.extras  # ECT never calls its teacher
    losses = loss_curve(tmp_path / "ect")
    assert sum(losses[-3:]) < 0.9 * sum(losses[:3]), losses  # 0.76-0.82 over seeds 0-2
    state = ckpt.load_checkpoint(tmp_path / "ect")
    model, method = build_model_and_method(ckpt.config_of(state), state["data_spec"])
    model.load_state_dict(state["ema"])
    _boundary_and_calls(model, method, {})


# -- both --------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", [LCM, ECT + ["method.ect_stages=3"]], ids=["lcm", "ect"])
def test_a_student_trained_stopped_and_resumed_equals_one_trained_straight_through(tmp_path, flow_teacher, method,
                                                                                    one_thread):
    _, a, b = straight_and_resumed(tmp_path, 3, *method, f"method.teacher={flow_teacher}", "train.steps=6",
                                   "train.ema_decay=0.9", "log.every=1", "log.ckpt_every=0", "eval.num_samples=0",
                                   "log.sample_every=0")
    assert loss_curve(tmp_path / "part") == loss_curve(tmp_path / "full")
    for key in ("model", "ema"):
        for k, v in a[key].items():
            assert torch.equal(v, b[key][k]), f"{key}.{k} differs after resume"


@pytest.fixture(scope="module")
def wrong_teachers(tmp_path_factory):
    """A tiny flow run on other data (16x16 RGB synthetic images) and a run that predicts no velocity (image_ar)."""
    from genlab.training.trainer import Trainer
    out = tmp_path_factory.mktemp("wrong")
    quick = ["train.steps=2", "log.ckpt_every=0", "eval.num_samples=0", "log.sample_every=0", "log.progress=false",
             "log.tensorboard=false", f"train.out_dir={out}"]
    Trainer(tiny_config(out, "data.name=synthetic", "data.image_size=16", "data.channels=3", "data.num_classes=10",
                        "data.size=64", "train.name=rgb", *quick)).fit()
    from genlab.config.tree import load_config
    Trainer(load_config("sparse_tiny_cpu", ["train.name=ar", *quick])).fit()
    return {"missing": str(out / "nothing_here"), "other data": str(out / "rgb"), "not a velocity": str(out / "ar")}


@pytest.mark.parametrize("name", ["lcm", "ect"])
@pytest.mark.parametrize("case, message", [("missing", "nothing_here"),
                                           ("other data", "trained on other data"),
                                           ("not a velocity", "image_ar, which is not a plain velocity predictor"),
                                           ("unset", "needs method.teacher")])
def test_an_incompatible_teacher_is_a_one_line_error_before_the_run_folder(tmp_path, wrong_teachers, name, case,
                                                                           message):
    from genlab.training.trainer import Trainer
    teacher = wrong_teachers.get(case, "")
    cfg = tiny_config(tmp_path, f"method.name={name}", "method.sampler=consistency", f"method.teacher={teacher}",
                      "train.name=student", *FAST)
    with pytest.raises(GenlabError, match=message) as e:
        Trainer(cfg).fit()
    assert "\n" not in str(e.value)
    assert not (tmp_path / "student").exists()
