"""Batched variants (train.lrs, train.weight_decays, train.ema_decays): members that differ in lr, weight decay or EMA
decay train in one process as their single runs would, each in its own run folder, with checkpoints that resume alone
or batched.

Tolerance. Besides the batched seeds' reordered sums (test_batched_seeds.py: WEIGHT_ATOL = 2e-6 after 6 Adam steps),
the stacked optimizer steps at lr 1 and each member scales the update: p_old * (1 - lr*wd) + lr * ((p_old - u) - p_old).
Recovering u by the subtraction costs at most ulp(max(|p|, |u|)) before the scale by lr <= 0.03, and the scale and
the decay factor (float32 on the device instead of float64 on the host) a relative 2u = 1.2e-7 each: a few float32
ulps of the weights per step, <= 1e-7 for weights of order 1 over 4 steps. Adam with L2 decay adds wd * p to
gradients that nearly cancel it in places, where Adam's normalised update turns the batched gradient's relative
error into a larger update error (measured 4e-7 after 4 steps). WEIGHT_ATOL keeps the batched seeds' 2e-6; losses
at rtol 1e-5 as there.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import TINY, cli_in_process
from test_batched_seeds import LOSS_RTOL, WEIGHT_ATOL, _assert_close_states, _ckpt, _losses

STEPS = 4
COMMON = [*TINY, f"train.steps={STEPS}", "log.every=1", "log.ckpt_every=2", "log.keep_last=0", "eval.num_samples=0",
          "train.device=cpu", "optim.grad_clip=0.5", "optim.warmup_steps=2", "train.ema_decay=0.9",
          "eval.grid_per_class=1", "eval.sample_steps=1"]  # the end-of-run preview: small
# per optimizer: the batched lists, and each member's run folder suffix with its single-run overrides; each case
# crosses two lists (4 members). AdamW's weight decay is decoupled; SGD's is L2 in the gradient (as Adam's: the same
# code path). EMA decays 0.2 and 0.9 part from step 2 under the EMA warmup min(decay, (1+n)/(10+n)).
CASES = {
    "adamw": (["train.seed=1", "train.lrs=1e-3,3e-3", "train.weight_decays=0,0.1"],
              [(f"lr={lr}-weight_decay={wd}-s1", [f"optim.lr={lr}", f"optim.weight_decay={wd}", "train.seed=1"])
               for lr in ("1e-3", "3e-3") for wd in ("0", "0.1")]),
    "sgd": (["train.seeds=0", "optim.weight_decay=0.1", "train.lrs=0.01,0.03", "train.ema_decays=0.2,0.9"],
            [(f"lr={lr}-ema_decay={e}-s0", ["optim.weight_decay=0.1", f"optim.lr={lr}", f"train.ema_decay={e}"])
             for lr in ("0.01", "0.03") for e in ("0.2", "0.9")]),
}


def _cfg(tmp, *overrides):
    from genlab.config.tree import load_config
    return load_config("digits_flow", [*COMMON, f"train.out_dir={tmp}", *overrides])


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """One optimizer's members batched and as single runs."""
    from genlab.training.seeds import SeedsTrainer
    from genlab.training.trainer import Trainer
    opt = request.param
    lists, members = CASES[opt]
    tmp = tmp_path_factory.mktemp(f"variants_{opt}")
    summaries = SeedsTrainer(_cfg(tmp, f"optim.name={opt}", *lists, "train.name=b")).fit()
    for suffix, ovs in members:
        Trainer(_cfg(tmp, f"optim.name={opt}", *ovs, f"train.name=single-{suffix}")).fit()
    return {"tmp": tmp, "opt": opt, "members": members, "summaries": summaries}


def test_each_member_has_its_own_run_folder_with_a_single_run_config(case):
    from genlab.config.tree import load_config
    tmp = case["tmp"]
    assert [s["run_dir"] for s in case["summaries"]] == [str(tmp / f"b-{suffix}") for suffix, _ in case["members"]]
    for (suffix, ovs), summary in zip(case["members"], case["summaries"]):
        assert summary["status"] == "finished" and summary["batched_seeds"] == len(case["members"])
        saved = load_config(str(tmp / f"b-{suffix}" / "config.toml"))
        single = _cfg(tmp, f"optim.name={case['opt']}", *ovs)
        for key in ("optim.lr", "optim.weight_decay", "train.ema_decay", "train.seed"):
            sec, k = key.split(".")
            assert getattr(getattr(saved, sec), k) == getattr(getattr(single, sec), k), key
        assert (saved.train.seeds, saved.train.lrs, saved.train.weight_decays, saved.train.ema_decays) == ("",) * 4


def test_batched_members_match_their_single_runs(case):
    """Losses, grad norms, weights, EMA and optimizer state (its param groups' lr and weight decay exactly)."""
    tmp = case["tmp"]
    for suffix, _ in case["members"]:
        b, s = tmp / f"b-{suffix}", tmp / f"single-{suffix}"
        assert len(_losses(b)) == STEPS and _losses(b) == pytest.approx(_losses(s), rel=LOSS_RTOL)
        for step in (2, STEPS):
            name = f"checkpoints/step_{step:08d}.pt"
            _assert_close_states(_ckpt(b / name), _ckpt(s / name), atol=WEIGHT_ATOL)
    finals = [_ckpt(tmp / f"b-{suffix}") for suffix, _ in case["members"]]
    key = next(k for k in finals[0]["model"] if k.endswith("weight") and finals[0]["model"][k].ndim == 2)
    prints = {(f["model"][key].sum().item(), f["ema"][key].sum().item()) for f in finals}
    assert len(prints) == len(finals)  # the members really differ (in weights or EMA)


def _rewind(src, dst, step):
    """A copy of run folder `src` as it was after `step` (later checkpoints removed)."""
    shutil.copytree(src, dst)
    for p in (dst / "checkpoints").glob("step_*.pt"):
        if int(p.stem.split("_")[1]) > step:
            p.unlink()


def test_a_member_resumes_alone_and_the_members_resume_batched(case):
    """A member's step-2 folder continues alone with plain resume to its single run's end; (AdamW) all members' step-2
    folders continue batched (their configs differ in lr and weight decay) to the uninterrupted batched end, exactly."""
    from genlab.training.seeds import SeedsTrainer
    from genlab.training.trainer import Trainer, config_for_resume
    tmp, members = case["tmp"], case["members"]
    final = f"checkpoints/step_{STEPS:08d}.pt"
    suffix = members[-1][0]
    _rewind(tmp / f"b-{suffix}", tmp / f"alone-{suffix}", 2)
    run = tmp / f"alone-{suffix}"
    assert Trainer(config_for_resume(str(run), []), resume=str(run)).fit()["status"] == "finished"
    _assert_close_states(_ckpt(run / final), _ckpt(tmp / f"single-{suffix}" / final), atol=WEIGHT_ATOL)
    if case["opt"] != "adamw":  # the same path for every optimizer; once is enough
        return
    for s, _ in members:
        _rewind(tmp / f"b-{s}", tmp / f"again-{s}", 2)
    out = SeedsTrainer(resume=[str(tmp / f"again-{s}") for s, _ in members]).fit()
    assert [x["status"] for x in out] == ["finished"] * len(members)
    for s, _ in members:
        _assert_close_states(_ckpt(tmp / f"again-{s}" / final), _ckpt(tmp / f"b-{s}" / final), exact=True)


def test_cli_names_member_folders_by_their_values_and_saves_their_lr(tmp_path, capfd):
    from genlab.config.tree import load_config
    base = [*TINY, "optim.warmup_steps=0", "train.steps=1", "eval.num_samples=0", "train.device=cpu", f"train.out_dir={tmp_path}",
            "eval.grid_per_class=1", "eval.sample_steps=1"]
    r = cli_in_process(capfd, "train", "digits_flow", *base, "train.lrs=1e-4,2e-3", "train.seeds=3", "train.name=c")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c-lr=1e-4-s3", "c-lr=2e-3-s3"]
    assert load_config(str(tmp_path / "c-lr=2e-3-s3" / "config.toml")).optim.lr == 2e-3


@pytest.mark.parametrize("override,needle", [
    ("train.lrs=a", "train.lrs must be comma-separated distinct numbers > 0"),
    ("train.lrs=1e-3,0.001", "distinct"),
    ("train.lrs=0", "numbers > 0"),
    ("train.weight_decays=-0.1", "numbers >= 0"),
    ("train.ema_decays=0,0.9", "numbers in (0, 1)"),
    ("train.ema_decays=1", "numbers in (0, 1)"),
    ("train.name=x-{weight_decay}", "name template"),
    ("optim.name=adopt", "optim.name=adopt"),
    ("method.name=shortcut", "method shortcut"),
    ("train.precision=fp16", "train.precision=fp16"),
])
def test_bad_batched_variants_are_one_line_errors(tmp_path, capfd, override, needle):
    lists = [] if override.startswith(("train.lrs", "train.weight_decays", "train.ema_decays")) else ["train.lrs=1e-3,3e-3"]
    r = cli_in_process(capfd, "train", "digits_flow", *TINY, f"train.out_dir={tmp_path}", *lists, override)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())  # nothing written


def test_runs_resumed_together_may_differ_only_in_member_keys():
    from genlab.config.tree import load_config
    from genlab.core.errors import GenlabError
    from genlab.training.seeds import _check_same_config
    a = load_config("digits_flow", ["optim.lr=1e-3"])
    _check_same_config([a, load_config("digits_flow", ["optim.lr=3e-3", "optim.weight_decay=0.1", "train.ema_decay=0.99"])],
                       ["A", "B"])
    with pytest.raises(GenlabError, match="differ in optim.betas"):
        _check_same_config([a, load_config("digits_flow", ["optim.lr=3e-3", "optim.betas=[0.8,0.9]"])], ["A", "B"])
    with pytest.raises(GenlabError, match="with and without an EMA"):
        _check_same_config([a, load_config("digits_flow", ["optim.lr=3e-3", "train.ema_decay=0"])], ["A", "B"])
    with pytest.raises(GenlabError, match="same train.seed, optim.lr"):
        _check_same_config([a, load_config("digits_flow", ["optim.lr=0.001", "train.name=x"])], ["A", "B"])


SWEEP = """name = "v"
steps = 2
seeds = [0]
launcher = "cpu"
batched_variants = true
[base]
preset = "digits_flow"
overrides = ["model.dim=32", "model.depth=2", "model.heads=2", "train.batch_size=16", "log.every=1",
             "log.tensorboard=false", "eval.num_samples=0", "eval.sample_steps=1", "eval.grid_per_class=1"]

[[axis]]
key = "model.mlp_ratio"
values = [2]

[[axis]]
key = "optim.lr"
values = [1e-3, 3e-3]

[[axis]]
key = "model.class_dropout"
values = [0.1, 0.2]
"""


def test_sweep_batched_variants_groups_each_grid_of_lrs_into_one_process(tmp_path, monkeypatch):
    """batched_variants = true: the runs that differ only in the optim.lr axis (and seed) train in one `genlab train`
    process with train.lrs and a name template, into the folders the sweep names them; other axes stay apart."""
    from genlab.cli import main
    from genlab.lab.sweep import runner
    from genlab.lab.sweep.spec import load_sweep
    p = tmp_path / "v.toml"
    p.write_text(SWEEP)
    sw = load_sweep(p)
    assert {v.batch["template"] for v in sw.variants} == {"mlp_ratio=2-lr={lr}-class_dropout=0.1",
                                                          "mlp_ratio=2-lr={lr}-class_dropout=0.2"}
    calls = []

    def in_process(cmd, log, env, timeout):  # the `genlab train` process, run here (no interpreter start-up)
        calls.append(cmd)
        return main(cmd[3:]), 0.0
    monkeypatch.setattr(runner, "_genlab", in_process)
    d = runner.run_sweep(sw, root=tmp_path / "sweeps", progress=False)
    assert len(calls) == 2 and all("train.lrs=0.001,0.003" in c and "train.seeds=0" in c for c in calls)
    status = json.loads((d / "status.json").read_text())
    assert len(status) == 4 and all(r["status"] == "finished" and r["batched_seeds"] == 2 for r in status.values())
    for name in status:
        assert _ckpt(d / "runs" / name)["config"]["optim"]["lr"] == (1e-3 if "lr=0.001" in name else 3e-3)


def test_sweep_file_with_batched_variants_is_checked_before_anything_runs(tmp_path):
    from genlab.core.errors import GenlabError
    from genlab.lab.sweep.spec import load_sweep
    p = tmp_path / "v.toml"
    for text, needle in ((SWEEP.replace("batched_variants = true", 'batched_variants = "yes"'), "batched_variants must be true or false"),
                         (SWEEP.replace('"eval.num_samples=0"', '"eval.num_samples=0", "optim.name=adopt"'), "optim.name=adopt"),
                         (SWEEP.replace('"eval.num_samples=0"', '"eval.num_samples=0", "train.lrs=0.1"'), "set by the sweep itself")):
        p.write_text(text)
        with pytest.raises(GenlabError, match=needle):
            load_sweep(p)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_batched_bf16_variants_follow_their_single_runs(tmp_path):
    """On CUDA (fused AdamW at lr 1, the per-member factors broadcast by the foreach ops) under bf16: each member's
    losses follow its own single run to bf16 rounding (the batched step may use another attention kernel)."""
    from genlab.training.seeds import SeedsTrainer
    from genlab.training.trainer import Trainer
    gpu = ["train.device=cuda", "train.precision=bf16", "model.dim=64", "model.heads=2", "train.ema_decay=0.9"]
    SeedsTrainer(_cfg(tmp_path, *gpu, "train.lrs=1e-3,3e-3", "train.weight_decays=0,0.1", "train.name=b")).fit()
    for lr in ("1e-3", "3e-3"):
        for wd in ("0", "0.1"):
            Trainer(_cfg(tmp_path, *gpu, f"optim.lr={lr}", f"optim.weight_decay={wd}", f"train.name=s{lr}{wd}")).fit()
            lb = torch.tensor(_losses(tmp_path / f"b-lr={lr}-weight_decay={wd}-s0"))
            ls = torch.tensor(_losses(tmp_path / f"s{lr}{wd}"))
            assert len(lb) == STEPS and torch.isfinite(lb).all()
            torch.testing.assert_close(lb, ls, rtol=0.03, atol=0)
