"""Reflow (2-rectified flow and its one-step distillation), PeRFlow, and the teacher pairs they train on
(`genlab data generate pairs`)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from conftest import patch_everywhere

from tests.conftest import cli_in_process, straight_and_resumed, tiny_config

FAST = ["log.every=10", "log.ckpt_every=0", "log.sample_every=0", "eval.num_samples=0"]


def loss_curve(run_dir) -> list[float]:
    from genlab.runtime.metrics import read_metrics
    return [r["loss"] for r in read_metrics(run_dir) if "loss" in r]


# -- PeRFlow: windows and their targets -------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 3, 4, 7])
def test_perflow_windows_partition_the_unit_interval_and_k_euler_steps_land_on_their_edges(k):
    from genlab.families.few_step.perflow import window_edges
    from genlab.sampling.samplers import time_grid
    w = window_edges(k)
    assert w[0] == 0 and w[-1] == 1 and len(w) == k + 1 and bool((w[1:] > w[:-1]).all())
    # consecutive windows [w_j, w_{j+1}] share their edges: lengths sum to exactly 1, no gap, no overlap
    assert float((w[1:] - w[:-1]).sum()) == pytest.approx(1.0, abs=1e-15)
    torch.testing.assert_close(time_grid(k).double(), w, rtol=0, atol=1e-7)


class LinearField(nn.Module):
    """An analytic teacher: v(x, t, y) = x A along the last axis, whatever the class (so any guidance scale gives the
    same field); its flow from t0 to t1 is x -> x expm(A (t1 - t0))."""

    def __init__(self, A):
        super().__init__()
        self.A, self.null_class = A, 10

    def forward(self, x, t, y):
        return x @ self.A


def test_perflow_target_is_the_chord_of_the_teachers_exact_solution_across_the_window(tmp_path):
    # the student sees x_t = x_s + s (x_e - x_s) with x_e = x_s M, M = expm(A dw), and must output (x_e - x_s) / dw;
    # both follow from x_t and t alone: x_s = x_t (I + s (M - I))^-1, target = x_s (M - I) / dw. We record what the
    # student was given and compare the loss of a zero student with the closed form.
    from genlab.families.base import StepContext, method_registry
    K = 4
    cfg = tiny_config(tmp_path, "method.name=perflow", f"method.perflow_windows={K}", "method.perflow_solver=heun",
                      "method.perflow_solver_steps=256", "method.timestep_sampler=uniform", "method.teacher_cfg_scale=1.5",
                      "model.class_dropout=0", "method.sampler=euler")
    method = method_registry.get("perflow")(cfg, {"kind": "image", "image_size": 8, "channels": 1, "num_classes": 10})
    g = torch.Generator().manual_seed(0)
    A = torch.randn(8, 8, generator=g, dtype=torch.float64) * 0.5
    seen = []

    def student(x, t, y):
        seen.append((x.clone(), t.clone()))
        return torch.zeros_like(x)
    batch = {"image": torch.randn(64, 1, 8, 8, generator=g, dtype=torch.float64), "label": torch.arange(64) % 10}
    ctx = StepContext(step=0, total_steps=1, generator=g, device=torch.device("cpu"), precision="fp32", ema=None,
                      extras={"teacher": LinearField(A)})
    loss, _ = method.loss(student, batch, ctx)
    (x_t, t), = seen
    j = torch.clamp((t * K).floor(), max=K - 1)
    s, dw = t * K - j, 1.0 / K
    assert bool(((s >= 0) & (s <= 1)).all()) and len(set(j.tolist())) == K  # every window drawn in 64 samples
    M, eye = torch.linalg.matrix_exp(A * dw), torch.eye(8, dtype=torch.float64)
    targets = []
    for i in range(len(t)):
        x_s = x_t[i] @ torch.linalg.inv(eye + s[i] * (M - eye))
        targets.append(x_s @ (M - eye) / dw)
    want = torch.stack(targets).square().flatten(1).mean(1).mean()
    torch.testing.assert_close(loss.double(), want, rtol=1e-6, atol=0)


def test_perflow_solver_steps_to_the_closed_form_endpoint_and_chord_is_its_straight_line():
    from genlab.families.few_step.perflow import chord, solve_window
    g = torch.Generator().manual_seed(1)
    A = torch.randn(4, 4, generator=g, dtype=torch.float64) * 0.5
    x = torch.randn(3, 1, 4, 4, generator=g, dtype=torch.float64)
    w0, w1 = torch.tensor([0.0, 0.25, 0.75], dtype=torch.float64), torch.tensor([0.25, 0.5, 1.0], dtype=torch.float64)
    exact = torch.stack([x[i] @ torch.linalg.matrix_exp(A * 0.25) for i in range(3)])
    end = solve_window(lambda x, t: x @ A, x, w0, w1, 200, heun=True)
    torch.testing.assert_close(end, exact, rtol=1e-6, atol=1e-7)
    for heun, order in ((False, 1), (True, 2)):  # halving the step divides the error by 2^order
        err = [(solve_window(lambda x, t: x @ A, x, w0, w1, n, heun) - exact).abs().max() for n in (50, 100)]
        assert float(err[0] / err[1]) == pytest.approx(2 ** order, rel=0.1)
    for s in (0.0, 0.3, 1.0):
        x_t, v = chord(x, end, w0, w1, torch.full((3,), s, dtype=torch.float64))
        torch.testing.assert_close(x_t, x + s * (end - x))
        torch.testing.assert_close(v, (end - x) / 0.25)


# -- genlab data generate pairs -----------------------------------------------------------------------------
def test_generate_pairs_stores_the_teachers_samples_of_the_stored_noise_and_their_cost(flow_teacher, tmp_path, capfd):
    from genlab.data.formats import read_image_dataset
    from genlab.data.pairs import read_pairs
    from genlab.data.pixels import to_pixels
    from genlab.families.few_step.base import build_teacher
    from genlab.families.image_flow.flow import cfg_velocity
    from genlab.runtime import checkpoint as ckpt
    from genlab.sampling.samplers import call_sampler, sampler_registry, time_grid
    out = tmp_path / "pairs"
    r = cli_in_process(capfd, "data", "generate", "pairs", flow_teacher, "--out", out, "--n", 30, "--steps", 3,
                       "--batch", 16, "--sampler", "midpoint", "--cfg-scale", 1.5, "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs"]  # no temporary folder left behind
    d = read_pairs(out)
    meta = json.loads((out / "meta.json").read_text())["pairs"]
    assert {k: meta[k] for k in ("sampler", "steps", "nfe", "cfg_scale", "teacher")} == \
        {"sampler": "midpoint", "steps": 3, "nfe": 6, "cfg_scale": 1.5, "teacher": flow_teacher}
    assert meta["seconds"] >= 0 and meta["device"].startswith("cpu") and meta["teacher_data"]["name"] == "digits"
    assert np.bincount(d.labels, minlength=10).tolist() == [3] * 10  # balanced classes
    # re-run the teacher's sampler on the stored noise: the stored images are its output
    teacher = build_teacher(ckpt.load_checkpoint(flow_teacher))
    labels = torch.from_numpy(np.array(d.labels))
    x = call_sampler(sampler_registry.get("midpoint"), cfg_velocity(teacher, labels, teacher.null_class, 1.5),
                     torch.from_numpy(np.array(d.noise)), time_grid(3))
    torch.testing.assert_close(torch.from_numpy(np.array(d.samples)), x, rtol=1e-5, atol=1e-5)
    assert np.array_equal(np.asarray(d.images), to_pixels(x).numpy())
    # the same folder is an `images` dataset (image + label), and `pairs` batches carry the noise
    assert read_image_dataset(out).images.shape == (30, 8, 8, 1)
    assert d.spec["batch_keys"] == ("image", "label", "noise")


def test_the_cost_of_a_run_on_generated_pairs_counts_their_generation(pairs_dir):
    """genlab data generate pairs records its seconds under meta["pairs"]: a reflow run's cost must include them
    (the sweep's first GPU report left them out when only a top-level "seconds" was read)."""
    from genlab.eval.cost import generated_data
    seconds = json.loads((Path(pairs_dir) / "meta.json").read_text())["pairs"]["seconds"]
    data = generated_data({"data": {"name": "pairs", "path": pairs_dir}, "train": {"out_dir": "runs"}})
    assert [(d["path"], d["seconds"]) for d in data] == [(pairs_dir, seconds)] and seconds > 0


@pytest.fixture(scope="module")
def shortcut_run(tmp_path_factory):
    from genlab.training.trainer import Trainer
    out = tmp_path_factory.mktemp("sc")
    Trainer(tiny_config(out, "method.name=shortcut", "method.sampler=flow_map", "method.shortcut_min_steps=8",
                        "train.steps=2", "train.name=sc", *FAST)).fit()
    return str(out / "sc")


@pytest.mark.parametrize("case", ["out_exists", "not_a_flow_run", "n_zero", "stochastic_sampler"])
def test_generate_pairs_bad_input_is_one_line_exit_2_and_writes_nothing(case, flow_teacher, tmp_path, capfd, request):
    out = tmp_path / "pairs"
    run, extra, want = flow_teacher, [], ""
    if case == "out_exists":
        out.mkdir()
        want = "exists"
    elif case == "not_a_flow_run":
        run, want = request.getfixturevalue("shortcut_run"), "does not predict a velocity"
    elif case == "n_zero":
        extra, want = ["--n", 0], "--n must be >= 1"
    else:
        extra, want = ["--sampler", "euler_maruyama"], "not a deterministic ODE sampler"
    r = cli_in_process(capfd, "data", "generate", "pairs", run, "--out", out, "--steps", 2, *extra)
    assert r.returncode == 2 and want in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert [p.name for p in tmp_path.iterdir()] == (["pairs"] if case == "out_exists" else [])
    assert case != "out_exists" or not any(out.iterdir())


def test_generate_pairs_interrupted_leaves_nothing_at_out(flow_teacher, tmp_path, capfd, monkeypatch):
    import genlab.sampling.samplers as samplers
    real, calls = samplers.call_sampler, []

    def interrupted(*a, **kw):  # Ctrl-C during the second batch
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)
    patch_everywhere(monkeypatch, samplers, "call_sampler", interrupted)
    r = cli_in_process(capfd, "data", "generate", "pairs", flow_teacher, "--out", tmp_path / "pairs", "--n", 8,
                       "--batch", 4, "--steps", 1, "--device", "cpu")
    assert r.returncode == 130 and len(calls) == 2 and list(tmp_path.iterdir()) == []


# -- reflow --------------------------------------------------------------------------------------------------
def test_reflow_loss_falls_on_the_teachers_pairs(flow_teacher, pairs_dir, tmp_path, one_thread):
    from genlab.training.trainer import Trainer
    s = Trainer(tiny_config(tmp_path, "method.name=reflow", f"method.teacher={flow_teacher}", "data.name=pairs",
                            f"data.path={pairs_dir}", "method.sampler=euler", "train.steps=60", "train.name=rf",
                            *FAST)).fit()
    assert s["status"] == "finished"
    losses = loss_curve(tmp_path / "rf")
    assert losses[-1] < 0.8 * losses[0], losses


def test_reflow_distill_trains_only_at_t0_and_its_one_step_sample_is_one_network_call(flow_teacher, pairs_dir,
                                                                                       tmp_path, one_thread):
    from genlab.data.pairs import read_pairs
    from genlab.families.base import StepContext
    from genlab.runtime import checkpoint as ckpt
    from genlab.training.step import build_model_and_method
    from genlab.training.trainer import Trainer
    over = ["method.name=reflow", "method.reflow_stage=distill", f"method.teacher={flow_teacher}", "data.name=pairs",
            f"data.path={pairs_dir}", "method.sampler=euler", "method.sample_steps=1", "method.cfg_scale=1",
            "model.class_dropout=0"]
    cfg = tiny_config(tmp_path, *over, "train.steps=40", "train.name=distill", *FAST)
    # what the loss feeds the model: the pair's noise at t = 0, and the target image - noise
    pairs = read_pairs(pairs_dir)
    model, method = build_model_and_method(cfg, pairs.spec)
    seen = []
    batch = {"image": torch.from_numpy(np.array(pairs.samples[:8])), "noise": torch.from_numpy(np.array(pairs.noise[:8])),
             "label": torch.from_numpy(np.array(pairs.labels[:8]))}
    v = torch.randn(8, 1, 8, 8)

    def student(x, t, y):
        seen.append((x, t))
        return v
    ctx = StepContext(step=0, total_steps=1, generator=torch.Generator().manual_seed(0), device=torch.device("cpu"),
                      precision="fp32", ema=None)
    loss, _ = method.loss(student, batch, ctx)
    (x, t), = seen
    assert bool((t == 0).all()) and torch.equal(x, batch["noise"])
    torch.testing.assert_close(loss, (batch["noise"] + v - batch["image"]).square().mean())
    # trained, its loss falls, and its default 1-step sample calls the network once
    assert Trainer(cfg).fit()["status"] == "finished"
    losses = loss_curve(tmp_path / "distill")
    assert losses[-1] < 0.8 * losses[0], losses
    state = ckpt.load_checkpoint(tmp_path / "distill")
    model, method = build_model_and_method(ckpt.config_of(state), state["data_spec"])
    model.load_state_dict(state["ema"] if state.get("ema") is not None else state["model"])
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    x = method.sample(model, torch.arange(4), generator=torch.Generator().manual_seed(0))
    assert len(calls) == 1 and x.shape == (4, 1, 8, 8) and torch.isfinite(x).all()


def test_a_pairs_folder_is_scored_against_the_teachers_data(pairs_dir):
    from genlab.data.pairs import read_pairs
    d = read_pairs(pairs_dir)
    ref = d.reference()
    assert ref.meta["source"] == "sklearn.datasets.load_digits" and ref.images.shape == (1797, 8, 8, 1)


@pytest.mark.parametrize("name", ["reflow", "ladd"])
def test_a_student_trained_on_pairs_is_evaluated_against_the_teachers_data(name, flow_teacher, pairs_dir, tmp_path,
                                                                           monkeypatch):
    from genlab.data import build_dataset
    from genlab.families.image_flow import flow
    from genlab.training.step import build_model_and_method
    cfg = tiny_config(tmp_path, f"method.name={name}", f"method.teacher={flow_teacher}", "data.name=pairs",
                      f"data.path={pairs_dir}", "method.tdisc_hidden=8" if name == "ladd" else "method.sampler=euler")
    data = build_dataset(cfg.data)
    model, method = build_model_and_method(cfg, data.spec)
    seen = []
    monkeypatch.setattr(flow, "evaluate_class_conditional", lambda generate, d, ctx: seen.append(d) or {})
    method.evaluate(model, data, {})
    assert seen[0].meta["source"] == "sklearn.datasets.load_digits" and seen[0].images.shape == (1797, 8, 8, 1)


# -- PeRFlow training ------------------------------------------------------------------------------------------
def test_perflow_loss_falls(flow_teacher, tmp_path, one_thread):
    from genlab.training.trainer import Trainer
    s = Trainer(tiny_config(tmp_path, "method.name=perflow", f"method.teacher={flow_teacher}", "method.sampler=euler",
                            "method.sample_steps=4", "method.perflow_solver_steps=2", "train.steps=40",
                            "train.name=pf", *FAST)).fit()
    assert s["status"] == "finished"
    losses = loss_curve(tmp_path / "pf")
    assert losses[-1] < 0.8 * losses[0], losses


def test_perflow_student_stopped_and_resumed_equals_one_trained_straight_through(flow_teacher, tmp_path, one_thread):
    full, a, b = straight_and_resumed(tmp_path, 3, "method.name=perflow", f"method.teacher={flow_teacher}",
                                      "method.sampler=euler", "method.perflow_solver_steps=2", "train.steps=6",
                                      "log.every=1", "log.ckpt_every=0", "log.sample_every=0", "eval.num_samples=0",
                                      "train.ema_decay=0.9")
    assert a["step"] == b["step"] == 6
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=0, atol=0)
    for k in a["ema"]:
        torch.testing.assert_close(a["ema"][k], b["ema"][k], rtol=0, atol=0)
