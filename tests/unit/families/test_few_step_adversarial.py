"""The teacher-feature discriminator (families/few_step/discriminator.py) and the two teacher-based methods that use
it: phased consistency models (pcm) and latent adversarial diffusion distillation (ladd)."""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from genlab.core.errors import GenlabError
from tests.conftest import straight_and_resumed, tiny_config

QUIET = ["log.ckpt_every=0", "log.sample_every=0", "eval.num_samples=0"]
PCM = ["method.name=pcm", "method.sampler=euler", "method.sample_steps=4", "method.pcm_solver_steps=6",
       "method.cfg_scale=1.0"]
PCM_ADV = ["method.name=pcm", "method.sampler=euler", "method.pcm_phases=2", "method.sample_steps=2",
           "method.pcm_adv_weight=0.1", "method.tdisc_hidden=16", "method.cfg_scale=1.0"]
LADD = ["method.name=ladd", "method.sampler=consistency", "method.sample_steps=4", "method.tdisc_hidden=16",
        "method.cfg_scale=1.0"]


def built(tmp_path, teacher, *overrides):
    """A student initialised from the teacher, its method and extras as plain modules (no trainer)."""
    from genlab.data import build_dataset
    from genlab.training.step import build_model_and_method
    cfg = tiny_config(tmp_path, f"method.teacher={teacher}", *overrides)
    spec = build_dataset(cfg.data).spec
    torch.manual_seed(0)
    model, method = build_model_and_method(cfg, spec)
    method.init_weights(model)
    extras = {k: e.module for k, e in method.extra_modules().items()}
    return model, method, extras, spec


def batch_of(spec, B=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"image": torch.rand(B, spec["channels"], spec["image_size"], spec["image_size"], generator=g) * 2 - 1,
            "label": torch.randint(0, spec["num_classes"], (B,), generator=g)}


def loss_curve(run_dir) -> list[float]:
    from genlab.runtime.metrics import read_metrics
    return [r["loss"] for r in read_metrics(run_dir) if "loss" in r]


# -- the discriminator ---------------------------------------------------------------------------
def test_hinge_losses_follow_the_formula():
    from genlab.families.few_step.discriminator import hinge_losses
    g = torch.Generator().manual_seed(0)
    fake, real = torch.randn(4, 3, 5, generator=g, dtype=torch.float64), torch.randn(4, 3, 5, generator=g, dtype=torch.float64)
    g_term, d_loss = hinge_losses(fake, real)
    # written out: D = mean max(0, 1 - real) + mean max(0, 1 + fake); G = -mean fake
    n = fake.numel()
    d_ref = sum(max(0.0, 1 - r) for r in real.flatten().tolist()) / n + sum(max(0.0, 1 + f) for f in fake.flatten().tolist()) / n
    torch.testing.assert_close(d_loss, torch.tensor(d_ref, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_term, torch.tensor(-sum(fake.flatten().tolist()) / n, dtype=torch.float64),
                               rtol=1e-12, atol=1e-12)


def test_renoising_keeps_the_flow_paths_marginal():
    # x_{t_end} = (1 - t_end) z + t_end x1 re-noised to t' must be t' x1 + (1 - t') (unit Gaussian)
    from genlab.families.few_step.discriminator import renoise
    t_end, t_new = torch.tensor([1.0, 0.75, 0.5, 0.25], dtype=torch.float64), torch.tensor([0.3, 0.5, 0.5, 0.1], dtype=torch.float64)
    one = torch.ones(4, 1, dtype=torch.float64)
    x1, z, e = one * 0, one * 1, one * 0                      # x at t_end carries noise (1 - t_end) z, fresh noise e
    noise_part = renoise((1 - t_end).view(-1, 1) * z, t_end, t_new, e).squeeze(1)
    fresh = renoise(x1, t_end, t_new, one).squeeze(1)          # the fresh noise's coefficient
    torch.testing.assert_close(noise_part ** 2 + fresh ** 2, (1 - t_new) ** 2, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(renoise(one, t_end, t_new, 0 * one).squeeze(1), t_new / t_end, rtol=1e-12, atol=1e-12)


def test_discriminator_heads_are_conditioned_on_the_renoising_time_the_teacher_saw(tmp_path, flow_teacher, one_thread):
    """Each head's projection condition holds the class and the re-noising time t' (LADD's heads are conditioned on the
    noise level): the same tokens judged at another t' get other logits, and the t' the heads get is the one the
    teacher's features were computed at."""
    from conftest import plain_context
    from genlab.families.few_step.discriminator import TeacherHeads
    g = torch.Generator().manual_seed(0)
    heads = TeacherHeads(dim=12, hidden=8, num_classes=3, blocks=(1, 2), tokens=5)
    feats, y = [torch.randn(4, 5, 12, generator=g) for _ in range(2)], torch.tensor([0, 1, 2, 0])
    lo, hi = heads(feats, y, torch.full((4,), 0.1)), heads(feats, y, torch.full((4,), 0.9))
    assert lo.shape == (4, 2, 5) and not torch.allclose(lo, hi)
    torch.autograd.backward(lo.square().mean())
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for h in heads.heads for p in h.t_embed.parameters())

    model, method, extras, spec = built(tmp_path, flow_teacher, *LADD)
    teacher_t, heads_t = [], []
    extras["teacher"].register_forward_hook(lambda m, args, out: teacher_t.append(args[1].detach()))
    extras["disc"].register_forward_hook(lambda m, args, out: heads_t.append(args[2].detach()))
    method.loss(model, batch_of(spec), plain_context(torch.Generator().manual_seed(2), extras=extras))
    (tt,), (ht,) = teacher_t, heads_t
    assert torch.equal(tt, ht) and bool((tt > 0).all() & (tt < 1).all()) and tt.unique().numel() > 1


def test_generator_gradient_reaches_the_student_through_the_frozen_teacher_and_never_the_heads(tmp_path, flow_teacher,
                                                                                                one_thread):
    """LADD without its regression term: the model's loss is the G term alone, which reaches the student only through
    the teacher. The trainer's per-optimizer backward gives the student exactly d(G)/d(student) and the heads exactly
    d(D)/d(heads), although G depends on the heads; the teacher gets nothing."""
    from genlab.training.trainer import Trainer
    t = Trainer(tiny_config(tmp_path, f"method.teacher={flow_teacher}", *LADD, "train.name=grad", *QUIET))
    t.setup()
    st = t.steps
    teacher, heads = st.extra_modules["teacher"], st.extra_modules["disc"]
    assert all(not p.requires_grad for p in teacher.parameters())
    student_ps, head_ps = list(st.model.parameters()), list(heads.parameters())
    losses, _ = st.method.loss(st.wrapped, batch_of(st.spec), st.context(0))
    g_student = torch.autograd.grad(losses["model"], student_ps, retain_graph=True, allow_unused=True)
    g_heads_from_g = torch.autograd.grad(losses["model"], head_ps, retain_graph=True, allow_unused=True)
    d_heads = torch.autograd.grad(losses["disc"], head_ps, retain_graph=True)
    assert sum(float(g.abs().sum()) for g in g_student if g is not None) > 0      # G reaches the student...
    assert sum(float(g.abs().sum()) for g in g_heads_from_g if g is not None) > 0  # ...and would reach the heads
    st._backward(losses)
    for p, g in zip(student_ps, g_student):
        assert (p.grad is None and g is None) or torch.equal(p.grad, g)
    for p, g in zip(head_ps, d_heads):
        assert torch.equal(p.grad, g)
    assert all(p.grad is None for p in teacher.parameters())


def test_discriminator_heads_step_with_their_own_adam_betas(tmp_path, flow_teacher, one_thread):
    """The heads' optimizer uses method.tdisc_betas (default beta1 = 0, GAN practice); the student keeps optim.betas."""
    from genlab.families.base import Extra, check_extras
    from genlab.training.trainer import Trainer
    for extra, want in (([], (0.0, 0.99)), (["method.tdisc_betas=0.5,0.999"], (0.5, 0.999))):
        t = Trainer(tiny_config(tmp_path, f"method.teacher={flow_teacher}", *LADD, "optim.betas=0.9,0.95",
                                f"train.name=b{len(extra)}", *extra, *QUIET))
        t.setup()
        opts = t.steps.optimizers
        assert tuple(opts["disc"].param_groups[0]["betas"]) == want
        assert all(tuple(g["betas"]) == (0.9, 0.95) for g in opts["model"].param_groups)
    with pytest.raises(GenlabError, match="needs its own optimizer"):
        check_extras({"critic": Extra(torch.nn.Linear(2, 2), trainable=True, betas=(0.0, 0.99))}, "m")
    with pytest.raises(GenlabError, match="method.tdisc_betas must hold two numbers"):
        tiny_config(tmp_path, *LADD, "method.tdisc_betas=0.5,0.9,0.99")


def test_discriminator_blocks_out_of_the_depth_are_a_one_line_error(tmp_path):
    with pytest.raises(GenlabError, match=r"method.tdisc_blocks must be in 1..2"):
        tiny_config(tmp_path, *LADD, "method.tdisc_blocks=1,3")
    with pytest.raises(GenlabError, match="comma-separated block numbers"):
        tiny_config(tmp_path, *LADD, "method.tdisc_blocks=last")
    from genlab.families.few_step.discriminator import parse_blocks
    assert parse_blocks("", 12) == (3, 6, 9, 12) and parse_blocks("", 2) == (1, 2) and parse_blocks("2,1,2", 3) == (1, 2)


# -- LADD -----------------------------------------------------------------------------------------
def test_ladd_student_times_follow_the_papers_distribution_and_warm_up_at_the_less_noisy_times():
    """Paper (t=1 noise there): times {1, .75, .5, .25} with probabilities .7/.1/.1/.1, after a warm-up at {.5, .25}
    only; here t = 1 - those = {0, .25, .5, .75}. 200k draws: each share within 5 standard errors."""
    from genlab.families.few_step.ladd import student_times
    n = 200_000
    t = student_times(4, n, 0.7, torch.Generator().manual_seed(0), "cpu")
    for value, p in ((0.0, 0.7), (0.25, 0.1), (0.5, 0.1), (0.75, 0.1)):
        assert abs(float((t == value).float().mean()) - p) < 5 * (p * (1 - p) / n) ** 0.5, value
    w = student_times(4, n, 0.7, torch.Generator().manual_seed(1), "cpu", warmup=True)
    assert set(w.unique().tolist()) == {0.5, 0.75} and abs(float((w == 0.5).float().mean()) - 0.5) < 5 * (0.25 / n) ** 0.5
    assert set(student_times(2, 100, 0.7, torch.Generator().manual_seed(2), "cpu", warmup=True).tolist()) == {0.5}
    assert bool((student_times(1, 100, 0.0, None, "cpu", warmup=True) == 0).all())


def test_a_fresh_ladd_student_is_the_teachers_ema(tmp_path, flow_teacher):
    from genlab.runtime import checkpoint as ckpt
    model, _, extras, _ = built(tmp_path, flow_teacher, *LADD)
    ema = ckpt.load_checkpoint(flow_teacher)["ema"]
    own = model.state_dict()
    assert own.keys() == ema.keys() and all(torch.equal(own[k], v) for k, v in ema.items())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), extras["teacher"].state_dict().values()))


def test_ladd_warm_up_steps_train_the_student_only_at_its_less_noisy_times(tmp_path, flow_teacher, one_thread):
    from conftest import plain_context
    model, method, extras, spec = built(tmp_path, flow_teacher, *LADD, "method.ladd_warmup_steps=3")
    seen = []
    model.register_forward_hook(lambda m, args, out: seen.append(args[1].detach()))
    for step in (0, 2, 3):
        method.loss(model, batch_of(spec, B=32), plain_context(torch.Generator().manual_seed(step), step=step,
                                                                extras=extras))
    assert set(torch.cat(seen[:2]).tolist()) == {0.5, 0.75} and 0.0 in seen[2].tolist()


# -- PCM ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 3, 4, 7])
def test_pcm_phase_edges_partition_the_unit_interval_and_the_function_is_the_identity_at_each_end(k):
    from genlab.families.few_step.pcm import phase_end, phase_function
    e = torch.linspace(0.0, 1.0, k + 1)
    assert e[0] == 0 and e[-1] == 1 and len(e) == k + 1 and bool((e[1:] > e[:-1]).all())
    torch.testing.assert_close(e[1:] - e[:-1], torch.full((k,), 1 / k))
    t = torch.cat([torch.rand(200, generator=torch.Generator().manual_seed(k)), e[:-1]])
    end = phase_end(t, k)
    torch.testing.assert_close(end, torch.tensor([e[e > s][0].item() for s in t.tolist()]))  # the next edge above t
    torch.testing.assert_close(phase_end(torch.ones(1), k), torch.ones(1))  # t = 1 ends the last phase
    x = torch.randn(k, 1, 4, 4)
    v = lambda x, t: torch.randn_like(x) + 1e3  # noqa: E731  (any velocity)
    assert torch.equal(phase_function(v, x, e[1:], e[1:]), x)


def test_pcm_target_is_one_guided_teacher_step_then_the_emas_phase_function(tmp_path, flow_teacher, one_thread):
    from conftest import plain_context
    model, method, extras, spec = built(tmp_path, flow_teacher, *PCM, "method.teacher_cfg_scale=3.0")
    ema = copy.deepcopy(model).requires_grad_(False)
    with torch.no_grad():
        for p in ema.parameters():
            p.add_(0.05 * torch.randn_like(p))
    batch, teacher, N, k = batch_of(spec), extras["teacher"], 6, 4
    ctx = dataclasses.replace(plain_context(torch.Generator().manual_seed(3), extras=extras), ema=ema)
    loss, _ = method.loss(model, batch, ctx)
    # the same draws, then everything written out
    g = torch.Generator().manual_seed(3)
    data, y = batch["image"].double(), batch["label"]
    t = torch.randint(0, N, (8,), generator=g).double() / N
    noise = torch.randn(data.shape, generator=g).double()
    end = (torch.floor(t * k) + 1) / k
    t_next = torch.minimum(t + 1 / N, end)
    assert bool((t_next == end).any()) and bool((t_next < end).any())  # both kinds of target occur
    x_t = (1 - t.view(-1, 1, 1, 1)) * noise + t.view(-1, 1, 1, 1) * data
    teacher, ema, model = teacher.double(), ema.double(), model.double()
    null = torch.full_like(y, teacher.null_class)
    v_teacher = teacher(x_t, t, null) + 3.0 * (teacher(x_t, t, y) - teacher(x_t, t, null))
    x_next = x_t + (t_next - t).view(-1, 1, 1, 1) * v_teacher
    target = x_next + (end - t_next).view(-1, 1, 1, 1) * ema(x_next, t_next, y)
    pred = x_t + (end - t).view(-1, 1, 1, 1) * model(x_t, t, y)
    ref = (pred - target).square().mean()
    torch.testing.assert_close(loss.double(), ref, rtol=1e-4, atol=1e-9)


def test_pcm_and_ladd_train_with_finite_losses_and_pcms_loss_falls(tmp_path, flow_teacher, pairs_dir, one_thread):
    import math

    from genlab.runtime.metrics import read_metrics
    from genlab.training.trainer import Trainer
    common = [f"method.teacher={flow_teacher}", "train.ema_decay=0.9", "log.every=5", "optim.lr=1e-3", *QUIET]
    assert Trainer(tiny_config(tmp_path, *PCM, "method.teacher_cfg_scale=3.0", "train.name=pcm", "train.steps=50",
                               *common)).fit()["status"] == "finished"
    losses = loss_curve(tmp_path / "pcm")
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.5 * losses[0], losses
    assert Trainer(tiny_config(tmp_path, *LADD, "method.ladd_regression_weight=0.5", "train.name=ladd",
                               "data.name=pairs", f"data.path={pairs_dir}", "train.steps=30",
                               *common)).fit()["status"] == "finished"
    recs = [r for r in read_metrics(tmp_path / "ladd") if "loss" in r]
    keys = ("loss", "adv_g", "adv_d", "loss_regression", "disc_acc_real", "disc_acc_fake", "diversity_ratio")
    assert all(math.isfinite(r[key]) for r in recs for key in keys)
    assert recs[-1]["adv_nonfinite"] == 0 and "adv_collapsed" in recs[-1]


def test_ladd_trains_on_teacher_pairs_and_its_cost_counts_their_generation(tmp_path, flow_teacher, pairs_dir, one_thread):
    """The few_step sweep trains LADD on teacher samples (the paper's data): a pairs folder reads as an image dataset,
    and the run's cost holds the pairs' generation once, on top of the teacher."""
    import json
    import math

    from genlab.eval.cost import cost_summary
    from genlab.training.trainer import Trainer
    cfg = tiny_config(tmp_path, *LADD, f"method.teacher={flow_teacher}", f"data.path={pairs_dir}", "data.name=images",
                      "train.name=ladd_pairs", "train.steps=6", "log.every=3", *QUIET)
    assert Trainer(cfg).fit()["status"] == "finished"
    assert all(math.isfinite(v) for v in loss_curve(tmp_path / "ladd_pairs"))
    gen = json.loads((Path(pairs_dir) / "meta.json").read_text())["pairs"]["seconds"]
    c = cost_summary(tmp_path / "ladd_pairs")
    assert c["data_gpu_seconds"] == pytest.approx(gen) and c["teacher_run"] == str(Path(flow_teacher))


def test_ladd_regression_target_is_the_teachers_image_for_the_pairs_own_noise(tmp_path, flow_teacher, pairs_dir,
                                                                               one_thread):
    """On teacher pairs the pure-noise samples start from the pair's noise, so the regression target (the pair's image)
    is what the teacher made of exactly that noise; samples at t > 0 start from fresh noise (as the sampler's
    re-noising) and are left out of the term. With fresh noise at t = 0 the term would pull toward the class mean."""
    from genlab.data.pairs import read_pairs
    from conftest import plain_context
    model, method, extras, _ = built(tmp_path, flow_teacher, *LADD, "data.name=pairs", f"data.path={pairs_dir}",
                                     "method.ladd_regression_weight=1.0", "method.ladd_noise_share=0.5")
    assert "noise" in method.batch_keys
    d = read_pairs(pairs_dir)
    batch = {"image": torch.from_numpy(d.samples[:16].copy()), "label": torch.from_numpy(d.labels[:16].copy()).long(),
             "noise": torch.from_numpy(d.noise[:16].copy())}
    seen = []
    model.register_forward_hook(lambda m, args, out: seen.append((args[0].detach(), args[1].detach(), out.detach())))
    _, metrics = method.loss(model, batch, plain_context(torch.Generator().manual_seed(1), extras=extras))
    (x, t, v), = seen
    pure, b = t == 0, t.view(-1, 1, 1, 1)
    assert bool(pure.any()) and bool((~pure).any()), t  # both kinds of sample in this draw
    torch.testing.assert_close(x[pure], batch["noise"][pure], rtol=0, atol=0)
    fresh = (x[~pure] - b[~pure] * batch["image"][~pure]) / (1 - b[~pure])  # x_t = (1-t) z + t image, solved for z
    assert not torch.allclose(fresh, batch["noise"][~pure], atol=1e-2)
    # the term, written out over the pure-noise samples: x^1 = z + (1 - 0) v(z, 0)
    ref = (batch["noise"][pure] + v[pure] - batch["image"][pure]).double().square().flatten(1).mean(1).mean()
    torch.testing.assert_close(metrics["loss_regression"].double(), ref, rtol=1e-5, atol=1e-7)


def test_pcm_with_the_adversarial_loss_resumes_exactly(tmp_path, flow_teacher, one_thread):
    full, a, b = straight_and_resumed(tmp_path, 3, f"method.teacher={flow_teacher}", *PCM_ADV, "train.steps=6",
                                      "log.every=1", "train.ema_decay=0.9", "optim.warmup_steps=2", *QUIET)
    assert set(full.steps.optimizers) == {"model", "disc"}
    assert loss_curve(tmp_path / "part") == loss_curve(tmp_path / "full")
    for key in ("model", "ema"):
        for k, v in a[key].items():
            assert torch.equal(v, b[key][k]), f"{key}.{k} differs after resume"
    for k, v in a["extras"]["disc"].items():
        assert torch.equal(v, b["extras"]["disc"][k]), f"disc.{k} differs after resume"
    sa, sb = a["extra_optimizers"]["disc"]["state"], b["extra_optimizers"]["disc"]["state"]
    assert sa and sa.keys() == sb.keys()
    assert all(torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"]) and torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"])
               for i in sa)


@pytest.mark.parametrize("overrides", [PCM, LADD], ids=["pcm", "ladd"])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_an_n_step_sample_makes_exactly_n_network_calls(tmp_path, flow_teacher, overrides, n):
    model, method, _, _ = built(tmp_path, flow_teacher, *overrides)
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    x = method.sample(model, torch.arange(4), steps=n, generator=torch.Generator().manual_seed(0))
    assert len(calls) == n and x.shape == (4, 1, 8, 8) and torch.isfinite(x).all()


@pytest.mark.slow
def test_pcm_with_the_adversarial_loss_trains_compiled(tmp_path, flow_teacher, one_thread):
    """Compiled, the teacher's hooks still fire (features for the heads) and the per-optimizer backward, which retains
    the graph shared by the model's and the heads' losses, runs (compiled backwards must not donate their buffers)."""
    import math

    from genlab.training.trainer import Trainer
    cfg = tiny_config(tmp_path, f"method.teacher={flow_teacher}", *PCM_ADV, "train.compile=model", "train.name=c",
                      "train.steps=3", "log.every=1", "train.ema_decay=0.9", *QUIET)
    assert Trainer(cfg).fit()["status"] == "finished"
    assert all(math.isfinite(v) for v in loss_curve(tmp_path / "c"))


def test_resuming_a_checkpoint_whose_discriminator_lacks_a_parameter_is_a_one_line_error(tmp_path, flow_teacher,
                                                                                          one_thread):
    """A LADD/PCM checkpoint saved before the heads were conditioned on t' has no time-embedding weights: resuming it
    names the module and the parameter instead of torch's multi-line load_state_dict error."""
    from genlab.runtime import checkpoint as ckpt
    from genlab.training.trainer import Trainer
    args = (f"method.teacher={flow_teacher}", *PCM_ADV, "train.steps=2", "log.ckpt_every=2", "log.sample_every=0",
            "eval.num_samples=0", "train.name=old")
    Trainer(tiny_config(tmp_path, *args)).fit()
    path = sorted((tmp_path / "old" / "checkpoints").glob("step_*.pt"))[-1]
    state = ckpt.load_checkpoint(path)
    dropped = next(k for k in state["extras"]["disc"] if "weight" in k)
    del state["extras"]["disc"][dropped]
    torch.save(state, path)
    with pytest.raises(GenlabError, match=rf"the method's 'disc' module differs from the checkpoint \(parameter {dropped}"):
        Trainer(tiny_config(tmp_path, *args, "train.steps=4"), resume=str(tmp_path / "old")).fit()
