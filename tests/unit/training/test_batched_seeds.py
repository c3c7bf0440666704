"""Batched seeds (train.seeds): N seeds in one process train as N separate runs would, each in its own run folder with
checkpoints that resume exactly, batched or alone.

Tolerance. The batched step computes the same float32 expressions as a single run, but torch.vmap turns each matmul
into a batched one and the per-seed gradient norm is one reduction over a [params, seeds] stack instead of a flat
list, so sums are reordered: a dot product of n terms may differ by up to ~n*u (u = 2^-24 = 6e-8; n <= 10^3 here,
i.e. <= 1e-4 relative, ~sqrt(n)*u = 2e-6 typically). Adam maps a relative gradient error rho to an update error of
at most ~lr*rho per step where the gradient dominates sqrt(v) (the normalised update is scale-free), so after
S steps at peak lr 1e-3: |dw| <= S * 1e-3 * 1e-4 = 6e-7 for S = 6. WEIGHT_ATOL = 2e-6 keeps a 3x margin over that
bound (measured: <= 3e-8); losses are one float32 mean of the same draws, compared at rtol 1e-5.
The non-float state (step, data order, every generator and RNG) must be identical, and a batched run resumed from
its own checkpoints must equal the uninterrupted batched run exactly.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import TINY, cli_in_process, stop_after

STEPS = 6
SEEDS = (0, 1, 2)
WEIGHT_ATOL = 2e-6
LOSS_RTOL = 1e-5
# grad_accum 2 and weight decay exercise the micro-step loop and both parameter groups; grad_clip 0.5 clips every
# step (tiny-DiT gradient norms start above 1), per seed
COMMON = [*TINY, f"train.steps={STEPS}", "log.every=1", "log.ckpt_every=3", "log.keep_last=0", "eval.num_samples=0",
          "train.device=cpu", "train.grad_accum=2", "optim.weight_decay=0.01", "optim.grad_clip=0.5"]


def _cfg(tmp, *overrides):
    from genlab.config.tree import load_config
    return load_config("digits_flow", [*COMMON, f"train.out_dir={tmp}", *overrides])


def _losses(run):
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def _grad_norms(run):
    return [json.loads(line)["grad_norm"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"grad_norm"' in line]


def _ckpt(path):
    from genlab.runtime import checkpoint as ckpt
    return ckpt.load_checkpoint(path)


def _assert_close_states(a: dict, b: dict, atol=WEIGHT_ATOL, exact=False):
    """Weights, EMA and optimizer state within atol (or equal); step, data order, generators and RNG identical."""
    close = (lambda x, y: torch.equal(x, y)) if exact else (lambda x, y: torch.allclose(x, y, rtol=0, atol=atol))
    for part in ("model", "ema"):
        assert a[part].keys() == b[part].keys()
        for k in a[part]:
            assert close(a[part][k], b[part][k]), (part, k, (a[part][k] - b[part][k]).abs().max().item())
    oa, ob = a["optimizer"], b["optimizer"]
    assert oa["param_groups"] == ob["param_groups"] and oa["state"].keys() == ob["state"].keys()
    for idx in oa["state"]:
        for k, v in oa["state"][idx].items():
            assert close(v, ob["state"][idx][k]) if k != "step" else torch.equal(v, ob["state"][idx][k]), (idx, k)
    assert a["step"] == b["step"] and a["loader"] == b["loader"] and a["nonfinite_skipped"] == b["nonfinite_skipped"]
    assert torch.equal(a["gen"], b["gen"]) and torch.equal(a["torch_rng"], b["torch_rng"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three single runs, the same three seeds batched, and the batched run stopped after step 3 then resumed."""
    from genlab.training.seeds import SeedsTrainer
    from genlab.training.trainer import Trainer
    tmp = tmp_path_factory.mktemp("seeds")
    for s in SEEDS:
        Trainer(_cfg(tmp, f"train.seed={s}", f"train.name=single-s{s}")).fit()
    batched = SeedsTrainer(_cfg(tmp, "train.seeds=" + ",".join(map(str, SEEDS)), "train.name=batched")).fit()
    part = SeedsTrainer(_cfg(tmp, "train.seeds=" + ",".join(map(str, SEEDS)), "train.name=part"))
    stopped = stop_after(part, 3).fit()
    # a copy of seed 1's folder at step 3, for resuming it alone
    shutil.copytree(tmp / "part-s1", tmp / "alone-s1")
    resumed = SeedsTrainer(resume=[str(tmp / f"part-s{s}") for s in SEEDS]).fit()
    return {"tmp": tmp, "batched": batched, "stopped": stopped, "resumed": resumed}


def test_each_seed_has_its_own_run_folder_with_a_single_run_config(runs):
    from genlab.config.tree import load_config
    tmp = runs["tmp"]
    assert [s["run_dir"] for s in runs["batched"]] == [str(tmp / f"batched-s{s}") for s in SEEDS]
    for s, summary in zip(SEEDS, runs["batched"]):
        run = tmp / f"batched-s{s}"
        assert summary["status"] == "finished" and summary["step"] == STEPS and summary["batched_seeds"] == len(SEEDS)
        assert (run / "checkpoints" / f"step_{STEPS:08d}.pt").is_file() and (run / "samples.png").is_file()
        cfg = load_config(str(run / "config.toml"))
        assert cfg.train.seed == s and cfg.train.seeds == "" and cfg.train.name == f"batched-s{s}"


def test_batched_losses_and_grad_norms_match_separate_runs(runs):
    tmp = runs["tmp"]
    for s in SEEDS:
        single, batched = _losses(tmp / f"single-s{s}"), _losses(tmp / f"batched-s{s}")
        assert len(single) == len(batched) == STEPS
        assert batched == pytest.approx(single, rel=LOSS_RTOL)
        assert _grad_norms(tmp / f"batched-s{s}") == pytest.approx(_grad_norms(tmp / f"single-s{s}"), rel=LOSS_RTOL)
        assert min(_grad_norms(tmp / f"single-s{s}")) > 0.5  # the clip acted on every step
    assert len({_losses(tmp / f"batched-s{s}")[0] for s in SEEDS}) == len(SEEDS)  # the seeds really differ


def test_batched_weights_ema_and_optimizer_state_match_separate_runs(runs):
    tmp = runs["tmp"]
    for s in SEEDS:
        for step in (3, STEPS):
            name = f"checkpoints/step_{step:08d}.pt"
            _assert_close_states(_ckpt(tmp / f"batched-s{s}" / name), _ckpt(tmp / f"single-s{s}" / name))


def test_batched_run_resumed_from_its_checkpoints_equals_the_uninterrupted_one(runs):
    tmp = runs["tmp"]
    assert [s["status"] for s in runs["stopped"]] == ["interrupted"] * len(SEEDS)
    assert [s["status"] for s in runs["resumed"]] == ["finished"] * len(SEEDS)
    for s in SEEDS:
        name = f"checkpoints/step_{STEPS:08d}.pt"
        _assert_close_states(_ckpt(tmp / f"part-s{s}" / name), _ckpt(tmp / f"batched-s{s}" / name), exact=True)
        assert _losses(tmp / f"part-s{s}") == _losses(tmp / f"batched-s{s}")


def test_a_seed_checkpoint_resumes_as_a_single_run(runs):
    """Seed 1's folder at step 3 continues alone with plain `--resume` and ends where its single run ends."""
    from genlab.training.trainer import Trainer, config_for_resume
    tmp = runs["tmp"]
    run = tmp / "alone-s1"
    assert Trainer(config_for_resume(str(run), []), resume=str(run)).fit()["status"] == "finished"
    name = f"checkpoints/step_{STEPS:08d}.pt"
    _assert_close_states(_ckpt(run / name), _ckpt(tmp / "single-s1" / name))
    assert _losses(run) == pytest.approx(_losses(tmp / "single-s1"), rel=LOSS_RTOL)


def test_cli_trains_seeds_batched_and_resumes_them(tmp_path, capfd):
    base = [*TINY, "optim.warmup_steps=1", "train.steps=2", "log.every=1", "eval.num_samples=0", "train.device=cpu", f"train.out_dir={tmp_path}"]
    r = cli_in_process(capfd, "train", "digits_flow", *base, "train.seeds=3,5", "train.name=c")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("status: finished") == 2
    runs = [str(tmp_path / "c-s3"), str(tmp_path / "c-s5")]
    r = cli_in_process(capfd, "train", "--resume", runs[0], "--resume", runs[1], "train.steps=3")
    assert r.returncode == 0, r.stderr
    assert [_ckpt(p)["step"] for p in runs] == [3, 3]
    r = cli_in_process(capfd, "train", "digits_flow", *base, "train.seeds=3,5", "train.name=c")
    assert r.returncode == 2 and "already exists" in r.stderr


@pytest.mark.parametrize("override,needle", [
    ("method.name=shortcut", "method shortcut"),
    ("method.timestep_sampler=adaptive", "adaptive"),
    ("optim.caution=true", "optim.caution"),
    ("train.compile=blocks", "train.compile"),
    ("train.precision=fp16", "train.precision=fp16"),
    ("train.parallel=ddp", "train.parallel=ddp"),
    ("train.seeds=1,1", "distinct"),
    ("train.seeds=a", "comma-separated"),
])
def test_unsupported_combinations_are_one_line_errors(tmp_path, capfd, override, needle):
    seeds = [] if override.startswith("train.seeds") else ["train.seeds=0,1"]
    r = cli_in_process(capfd, "train", "digits_flow", *TINY, f"train.out_dir={tmp_path}", *seeds, override)
    assert r.returncode == 2 and needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())  # nothing written


SWEEP = """name = "{name}"
steps = 4
seeds = [0, 1]
launcher = "cpu"
timeout = 300
{batched}
[base]
preset = "digits_flow"
overrides = ["model.dim=32", "model.depth=2", "model.heads=2", "train.batch_size=16", "log.every=1",
             "log.tensorboard=false", "eval.num_samples=0", "optim.warmup_steps=2"]

[[axis]]
key = "optim.lr"
values = [{lrs}]
"""


@pytest.mark.slow  # three `genlab train` processes (~1.5 min on 2 shared cores)
def test_sweep_runs_a_seed_axis_batched_with_the_same_folders_and_rows(tmp_path):
    """batched_seeds = true: one process per variant; the same run folders, statuses and report rows as one process
    per seed (losses within the batched tolerance)."""
    import csv

    from genlab.lab.sweep.runner import run_sweep
    from genlab.lab.sweep.spec import load_sweep
    rows = {}
    for name, batched in (("one_by_one", ""), ("batched", "batched_seeds = true")):
        p = tmp_path / f"{name}.toml"
        p.write_text(SWEEP.format(name=name, batched=batched, lrs="1e-3"))
        d = run_sweep(load_sweep(p), root=tmp_path / "sweeps", progress=False)
        status = json.loads((d / "status.json").read_text())
        assert [status[f"lr=0.001-s{s}"]["status"] for s in (0, 1)] == ["finished", "finished"]
        assert all(("batched_seeds" in status[f"lr=0.001-s{s}"]) == bool(batched) for s in (0, 1))
        for s in (0, 1):
            assert _ckpt(d / "runs" / f"lr=0.001-s{s}")["config"]["train"]["seed"] == s
        rows[name] = {r["variant"]: r for r in csv.DictReader(open(d / "results.csv"))}
        logs = sorted(x.name for x in (d / "logs").iterdir())
        assert logs == (["lr=0.001-seeds.log"] if batched else ["lr=0.001-s0.log", "lr=0.001-s1.log"])
    a, b = rows["one_by_one"]["lr=0.001"], rows["batched"]["lr=0.001"]
    assert a["seeds"] == b["seeds"] == "2" and a["status"] == b["status"] == "finished"
    assert float(b["final_loss"]) == pytest.approx(float(a["final_loss"]), rel=LOSS_RTOL)


def test_sweep_file_with_batched_seeds_is_checked_before_anything_runs(tmp_path):
    from genlab.core.errors import GenlabError
    from genlab.lab.sweep.spec import load_sweep
    p = tmp_path / "s.toml"
    p.write_text(SWEEP.format(name="s", batched='batched_seeds = "yes"', lrs="1e-3"))
    with pytest.raises(GenlabError, match="batched_seeds must be true or false"):
        load_sweep(p)
    p.write_text(SWEEP.format(name="s", batched="batched_seeds = true", lrs="1e-3").replace(
        '"optim.warmup_steps=2"', '"optim.warmup_steps=2", "train.compile=blocks"'))
    with pytest.raises(GenlabError, match="train.compile"):
        load_sweep(p)


def test_runs_resumed_together_must_be_seeds_of_one_config():
    """(Or batched variants of one: differing in optim.lr etc., tests/unit/training/test_batched_variants.py.)"""
    from genlab.config.tree import load_config
    from genlab.core.errors import GenlabError
    from genlab.training.seeds import _check_same_config
    a, b = load_config("digits_flow", ["train.seed=0"]), load_config("digits_flow", ["train.seed=1", "optim.eps=1e-6"])
    with pytest.raises(GenlabError, match="differ in optim.eps"):
        _check_same_config([a, b], ["A", "B"])
    with pytest.raises(GenlabError, match="same train.seed"):
        _check_same_config([a, load_config("digits_flow", ["train.seed=0", "train.name=x"])], ["A", "C"])
    _check_same_config([a, load_config("digits_flow", ["train.seed=1", "train.name=x"])], ["A", "D"])


def test_bench_refuses_batched_seeds_instead_of_timing_one_seed(capfd):
    r = cli_in_process(capfd, "bench", "digits_flow", *TINY, "train.device=cpu", "train.seeds=0,1")
    assert r.returncode == 2 and "benchmarks/batched_seeds.py" in r.stderr


class _Refuses:
    """An attention-kernel context that fails as the memory-efficient kernel does under vmap on CUDA."""
    def __init__(self, model=None):
        pass

    def __enter__(self):
        raise RuntimeError("LSE is not correctly aligned (strideH)")

    def __exit__(self, *exc):
        return False


def test_probe_keeps_the_first_attention_kernel_that_runs_under_vmap(tmp_path, monkeypatch, capsys):
    from genlab.nn.attention import plain_softmax_attention
    from genlab.training import seeds as S
    monkeypatch.setattr(S, "attention_choices", lambda device: [("efficient", _Refuses), ("plain-ops", plain_softmax_attention)])
    st = S.SeedsTrainer(_cfg(tmp_path, "train.seeds=0,1", "train.steps=1"))
    st.setup()
    assert st.engine.attention_kernels is plain_softmax_attention
    assert "uses the plain-ops kernel (efficient: RuntimeError: LSE is not correctly aligned" in capsys.readouterr().err


def test_probe_names_every_kernel_it_tried_when_none_runs(tmp_path, monkeypatch):
    from genlab.core.errors import GenlabError
    from genlab.training import seeds as S
    monkeypatch.setattr(S, "attention_choices", lambda device: [("efficient", _Refuses), ("flash", _Refuses)])
    st = S.SeedsTrainer(_cfg(tmp_path, "train.seeds=0,1", "train.steps=1"))
    with pytest.raises(GenlabError, match=r"does not run under torch.vmap \(efficient: .*; flash: .*\)"):
        st.setup()


def test_plain_ops_attention_computes_what_sdpa_computes_and_is_restored():
    from genlab.families.image_flow.dit import DiT, DiTSpec
    from genlab.nn.attention import math_attention, plain_softmax_attention
    torch.manual_seed(0)
    model = DiT(DiTSpec(image_size=8, channels=1, num_classes=3, dim=32, depth=2, heads=2)).double()
    x, t, y = torch.randn(4, 1, 8, 8, dtype=torch.float64), torch.rand(4, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    ref = model(x, t, y)
    before = [m.attend for m in model.modules() if hasattr(m, "attend")]
    with plain_softmax_attention(model) as n:
        assert n == 2 and all(m.attend is math_attention for m in model.modules() if hasattr(m, "attend"))
        got = model(x, t, y)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)  # float64: the same function, other op order
    assert [m.attend for m in model.modules() if hasattr(m, "attend")] == before


def test_batched_seeds_with_plain_ops_attention_follow_the_default_kernel(tmp_path, monkeypatch):
    """The CUDA fallback, run on the CPU: the seeds' losses and weights match the default attention's within the
    batched step's float32 tolerance (module docstring)."""
    from genlab.nn.attention import plain_softmax_attention
    from genlab.training import seeds as S
    a = S.SeedsTrainer(_cfg(tmp_path, "train.seeds=0,1", "train.name=default")).fit()
    monkeypatch.setattr(S, "attention_choices", lambda device: [("plain-ops", plain_softmax_attention)])
    b = S.SeedsTrainer(_cfg(tmp_path, "train.seeds=0,1", "train.name=plain")).fit()
    for s in (0, 1):
        la, lb = _losses(tmp_path / f"default-s{s}"), _losses(tmp_path / f"plain-s{s}")
        assert len(la) == STEPS
        torch.testing.assert_close(torch.tensor(lb), torch.tensor(la), rtol=LOSS_RTOL, atol=0)
        _assert_close_states(_ckpt(tmp_path / f"plain-s{s}"), _ckpt(tmp_path / f"default-s{s}"))
    assert a and b


@pytest.mark.slow  # an inductor compile of the vmapped step on the CPU (~30 s on 2 shared cores)
def test_compiled_batched_step_follows_the_eager_one(tmp_path):
    """train.compile=model compiles the vmapped loss (forward and backward): the same losses and weights as the
    eager batched step, within the step's float32 tolerance (kernels fused by inductor reorder sums)."""
    from genlab.training.seeds import SeedsTrainer
    SeedsTrainer(_cfg(tmp_path, "train.seeds=0,1", "train.name=eager")).fit()
    SeedsTrainer(_cfg(tmp_path, "train.seeds=0,1", "train.name=comp", "train.compile=model")).fit()
    for s in (0, 1):
        le, lc = _losses(tmp_path / f"eager-s{s}"), _losses(tmp_path / f"comp-s{s}")
        assert len(lc) == STEPS
        torch.testing.assert_close(torch.tensor(lc), torch.tensor(le), rtol=LOSS_RTOL, atol=0)
        _assert_close_states(_ckpt(tmp_path / f"comp-s{s}"), _ckpt(tmp_path / f"eager-s{s}"), atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compile_", ["off", "model"])
def test_gpu_batched_bf16_seeds_train_and_follow_their_single_runs(tmp_path, capsys, compile_):
    """On CUDA under bf16 the vmapped step needs an attention kernel that runs under vmap (the probe picks one, or
    the plain-ops fallback); each seed's losses follow its own single run to bf16 rounding (the two paths run
    different attention kernels, so not to float32's)."""
    from genlab.training.seeds import SeedsTrainer
    from genlab.training.trainer import Trainer
    gpu = ["train.device=cuda", "train.precision=bf16", "train.grad_accum=1", "model.dim=64", "model.heads=2"]
    SeedsTrainer(_cfg(tmp_path, *gpu, "train.seeds=0,1", "train.name=b", f"train.compile={compile_}")).fit()
    for s in (0, 1):
        Trainer(_cfg(tmp_path, *gpu, f"train.seed={s}", f"train.name=single{s}")).fit()
        lb, ls = torch.tensor(_losses(tmp_path / f"b-s{s}")), torch.tensor(_losses(tmp_path / f"single{s}"))
        assert len(lb) == STEPS and torch.isfinite(lb).all()
        torch.testing.assert_close(lb, ls, rtol=0.03, atol=0)
