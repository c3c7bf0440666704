"""Bad inputs across train, sample, eval, data prepare, sweep and bench: each is exit code 2 with one
stderr line naming the offending key or file, no traceback, and nothing created or changed on disk."""
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, TINY, patch_everywhere

from genlab.cli import main
from genlab.config.tree import load_config
from genlab.runtime import checkpoint as ckpt
from genlab.training.trainer import Trainer

T = ["train", *TINY, "optim.warmup_steps=1", "train.steps=2", "eval.num_samples=0"]  # a warm-up that fits
SP = ["train", "sparse_tiny_cpu", "model.dim=32", "model.depth=1", "model.heads=2", "train.steps=2", "eval.num_samples=0"]
FS = ["train", "digits_flow", *TINY, "optim.warmup_steps=1", "train.steps=2", "eval.num_samples=0"]  # + method.name=<few-step method>
TEXT = ["train", "text_ar", "model.dim=32", "model.depth=1", "model.heads=2", "train.steps=2"]

# (id, argv with {run}/{tmp} placeholders, text the message must contain)
CASES = [
    ("negative lr", T + ["optim.lr=-1"], "optim.lr"),
    ("lr not a number", T + ["optim.lr=fast"], "optim.lr"),
    ("lr nan", T + ["optim.lr=nan"], "optim.lr"),
    ("zero steps", T + ["train.steps=0"], "train.steps"),
    ("fractional batch", T + ["train.batch_size=1.5"], "train.batch_size"),
    ("patch does not divide image", T + ["model.patch_size=3"], "model.patch_size"),
    ("heads do not divide dim", T + ["model.heads=3"], "model.heads"),
    ("batch not divisible by accum", T + ["train.grad_accum=3"], "train.grad_accum"),
    ("path given to digits", T + ["data.path={tmp}"], "data.path"),
    ("synthetic-only key with digits", T + ["data.image_size=16"], "data.image_size"),
    ("gpt-only key with dit", T + ["model.dropout=0.2"], "model.dropout"),
    ("dit-only key with gpt", TEXT + ["model.patch_size=4"], "model.patch_size"),
    ("flow on text", TEXT + ["method.name=flow"], "method.name"),
    ("mdlm on images", T + ["method.name=mdlm"], "method.name"),
    ("ar on a bidirectional gpt", TEXT + ["model.causal=false"], "model.causal"),
    ("unknown optimizer", T + ["optim.name=adamm"], "adamw"),
    ("misspelt optimizer", T + ["optim.name=shampo"], "shampoo"),
    ("fsdp with an optimizer that cannot shard", T + ["train.parallel=fsdp", "optim.name=shampoo"], "optim.name=shampoo"),
    ("muon scope with adamw", T + ["optim.muon_scope=all_2d"], "optim.muon_scope"),
    ("wsd decay fraction zero", T + ["optim.schedule=wsd", "optim.decay_frac=0"], "optim.decay_frac"),
    ("unknown key", T + ["optim.lrr=1"], "optim.lrr"),
    ("unknown section", T + ["optimm.lr=1"], "optimm"),
    ("bad choice", T + ["data.on_device=maybe"], "data.on_device"),
    ("ema decay of one", T + ["train.ema_decay=1"], "train.ema_decay"),
    ("one beta", T + ["optim.betas=[0.9]"], "optim.betas"),
    ("beta above one", T + ["optim.betas=[0.9,1.5]"], "optim.betas"),
    ("images without a path", T + ["data.name=images"], "data.path"),
    ("images from a missing folder", T + ["data.name=images", "data.path={tmp}/nowhere"], "nowhere"),
    ("unknown device", T + ["train.device=tpu"], "train.device"),
    ("unknown model size", T + ["model.size=huge"], "model.size"),
    ("unknown preset", ["train", "no_such_preset"], "no_such_preset"),
    ("invalid toml file", ["train", "{tmp}/bad.toml"], "bad.toml"),
    ("log every zero", T + ["log.every=0"], "log.every"),
    ("ac_every without every_k", T + ["train.ac_every=3"], "train.ac_every"),
    ("synthetic tokens without vocab", TEXT + ["data.name=synthetic_tokens"], "data.vocab_size"),
    ("bad T_list", ["train", "text_mdlm", "eval.T_list=a,b"], "eval.T_list"),
    ("float8 on cpu", T + ["train.precision=float8_rowwise", "train.device=cpu"], "train.precision"),
    ("negative ce_chunk", TEXT + ["model.ce_chunk=-1"], "model.ce_chunk"),
    ("resume a missing run", ["train", "--resume", "{tmp}/missing"], "missing"),
    ("resume with a different model", ["train", "--resume", "{run}", "train.steps=4", "model.dim=48"], "model differs"),
    ("resume a finished run", ["train", "--resume", "{run}"], "train.steps=N"),
    ("resume with a preset", ["train", "digits_flow", "--resume", "{run}"], "--resume"),
    ("sample zero", ["sample", "{run}", "--n", "0"], "--n"),
    ("sample zero steps", ["sample", "{run}", "--steps", "0"], "--steps"),
    ("sample negative cfg", ["sample", "{run}", "--cfg", "-1"], "--cfg"),
    ("sample unknown sampler", ["sample", "{run}", "--sampler", "rk45"], "rk45"),
    ("sample class out of range", ["sample", "{run}", "--class", "99"], "--class"),
    ("sample a missing run", ["sample", "{tmp}/missing"], "missing"),
    ("sample a run without checkpoints", ["sample", "{tmp}/empty_run"], "empty_run"),
    ("sample a truncated checkpoint", ["sample", "{tmp}/truncated.pt"], "truncated.pt"),
    ("sample a corrupt checkpoint", ["sample", "{tmp}/corrupt.pt"], "corrupt.pt"),
    ("sample a checkpoint of the wrong model", ["sample", "{tmp}/wrong_model.pt"], "model differs"),
    ("eval negative samples", ["eval", "{run}", "eval.num_samples=-5"], "eval.num_samples"),
    ("eval overrides the model", ["eval", "{run}", "model.dim=8"], "model.dim"),
    ("eval overrides a training-time method key", ["eval", "{run}", "method.timestep_sampler=uniform"], "method.timestep_sampler"),
    ("eval bad guidance interval", ["eval", "{run}", "method.cfg_interval=0.9,0.1"], "cfg_interval"),
    ("eval a missing run", ["eval", "{tmp}/missing"], "missing"),
    ("unknown eval metric", T + ["eval.metrics=accuracy,fidd"], "fidd"),
    ("empty eval metrics", T + ["eval.metrics=,"], "eval.metrics"),
    ("fid without weights before training", [*T[:-1], "eval.num_samples=10", "eval.metrics=fid"], "pt_inception-2015-12-05"),
    ("lpips without weights before training", [*T[:-1], "eval.num_samples=10", "eval.metrics=accuracy,lpips"], "alexnet-owt"),
    ("fid weights path missing", [*T[:-1], "eval.num_samples=10", "eval.metrics=fid", "eval.fid_weights={tmp}/none.pth"], "none.pth"),
    ("pr with fewer samples than k", [*T[:-1], "eval.num_samples=3", "eval.metrics=pr"], "eval.num_samples"),
    ("eval unknown metric", ["eval", "{run}", "eval.num_samples=10", "--metrics", "acc"], "valid choices"),
    ("eval fid without weights", ["eval", "{run}", "eval.num_samples=10", "--metrics", "fd,fid"], "pt_inception-2015-12-05"),
    ("eval lpips without weights", ["eval", "{run}", "eval.num_samples=10", "eval.lpips_net=vgg", "--metrics", "lpips"], "vgg16-397923af"),
    ("prepare mnist without files", ["data", "prepare", "mnist", "--src", "{tmp}/empty_run", "--out", "{tmp}/o"], "train-images"),
    ("prepare a corrupt cifar batch", ["data", "prepare", "cifar10", "--src", "{tmp}/cifar", "--out", "{tmp}/o", "--no-verify"], "data_batch_1"),
    ("prepare an unknown kind", ["data", "prepare", "imagenet", "--out", "{tmp}/o"], "imagenet"),
    ("prepare cifar val split", ["data", "prepare", "cifar10", "--src", "{tmp}/cifar", "--out", "{tmp}/o", "--split", "val"], "--split"),
    ("prepare text from a missing file", ["data", "prepare", "text", "--src", "{tmp}/none.txt", "--out", "{tmp}/o"], "none.txt"),
    ("sweep a missing file", ["sweep", "{tmp}/none.toml"], "none.toml"),
    ("sweep with an unknown key", ["sweep", "{tmp}/sweep_badkey.toml"], "optim.lrr"),
    ("sweep with an out-of-range value", ["sweep", "{tmp}/sweep_badlr.toml"], "optim.lr"),
    ("bench zero steps", ["bench", *TINY, "--steps", "0"], "--steps"),
    ("bench negative lr", ["bench", *TINY, "optim.lr=-1"], "optim.lr"),
    ("bench heads do not divide dim", ["bench", *TINY, "model.heads=3"], "model.heads"),
    # sparse transformer
    ("sparse stride longer than the sequence", SP + ["model.sparse_stride=100"], "model.sparse_stride"),
    ("sparse unknown pattern", SP + ["model.sparse_pattern=diagonal"], "diagonal"),
    ("sparse block not a tile size", SP + ["model.sparse_block=48"], "model.sparse_block"),
    ("sparse summary groups wider than the block", SP + ["model.sparse_pattern=fixed", "model.sparse_summary=4",
                                                          "model.sparse_summary_groups=4"], "model.sparse_summary_groups"),
    ("sparse qk_ratio above one", SP + ["model.qk_ratio=1.5"], "model.qk_ratio"),
    ("sparse unknown raster", SP + ["model.raster=zigzag"], "model.raster"),
    ("sparse key with dit", T + ["model.sparse_stride=8"], "model.sparse_stride"),
    ("sparse transformer with flow", SP + ["method.name=flow"], "method.name"),
    ("sparse flex backend on a cpu", SP + ["model.sparse_backend=flex"], "model.sparse_backend"),
    # backbones, attention, positions
    ("in-context unknown ln placement", T + ["model.name=dit_incontext", "model.ln_placement=middle"], "model.ln_placement"),
    ("ln placement with dit", T + ["model.ln_placement=post"], "model.ln_placement"),
    ("mmdit more dual blocks than blocks", T + ["model.name=mmdit", "model.dual_blocks=5"], "model.dual_blocks"),
    ("1-d position on an image model", T + ["model.pos_emb=rope"], "model.pos_emb"),
    ("2-d position on gpt", TEXT + ["model.pos_emb=rope2d"], "model.pos_emb"),
    ("unknown position", T + ["model.pos_emb=alibi"], "alibi"),
    ("unknown attention", T + ["model.attention=sigmod"], "sigmoid"),
    ("triton attention on a cpu", T + ["model.attention=triton"], "model.attention"),
    ("flex attention on a cpu by auto", T + ["model.attention=flex"], "model.attention"),
    ("unknown norm", T + ["model.norm=batchnorm"], "batchnorm"),
    ("unknown mlp", T + ["model.mlp=relu"], "unknown mlp 'relu'"),
    ("zero mlp ratio", T + ["model.mlp_ratio=0"], "model.mlp_ratio"),
    ("unknown adaln", T + ["model.adaln=split"], "unknown adaln 'split'"),
    ("unknown residual dtype", T + ["model.residual=fp8"], "unknown residual 'fp8'"),
    # optimizers
    ("muon unknown scope", T + ["optim.name=muon", "optim.muon_scope=everything"], "optim.muon_scope"),
    ("soap negative precondition_every", T + ["optim.name=soap", "optim.precondition_every=-1"], "optim.precondition_every"),
    ("precondition_every with adamw", T + ["optim.precondition_every=5"], "optim.precondition_every"),
    ("psgd misspelt", T + ["optim.name=psgd"], "psgd_kron"),
    ("heavyball compile mode unknown", T + ["optim.name=soap", "optim.heavyball_compile=fast"], "optim.heavyball_compile"),
    ("lr inf", T + ["optim.lr=inf"], "optim.lr"),
    ("eps zero", T + ["optim.eps=0"], "optim.eps"),
    ("wsd unknown decay shape", T + ["optim.schedule=wsd", "optim.decay_shape=cubic"], "optim.decay_shape"),
    ("unknown lr schedule", T + ["optim.schedule=step"], "unknown lr_schedule 'step'"),
    ("min lr ratio above one", T + ["optim.min_lr_ratio=2"], "optim.min_lr_ratio"),
    ("caution not a boolean", T + ["optim.caution=maybe"], "optim.caution"),
    # REPA's encoders and the MAE that makes one
    ("repa unknown encoder kind", T + ["method.name=repa", "method.repa_encoder=dino"], "method.repa_encoder"),
    ("repa run encoder path missing", T + ["method.name=repa", "method.repa_encoder=run:{tmp}/no_run"], "no_run"),
    ("repa timm encoder without weights", T + ["method.name=repa", "method.repa_encoder=timm:vit_small_patch16_224"],
     "method.repa_encoder_path"),
    ("repa timm weights file missing", T + ["method.name=repa", "method.repa_encoder=timm:vit_small_patch16_224",
                                            "method.repa_encoder_path={tmp}/none.safetensors"], "none.safetensors"),
    ("repa block deeper than the model", T + ["method.name=repa", "method.repa_block=9"], "method.repa_block"),
    ("mae encoder on a dit", T + ["method.name=mae_encoder"], "method.name=mae_encoder"),
    # sweeps
    ("sweep --only names no variant", ["sweep", "tiny_cpu", "--only", "lr=5"], "--only"),
    ("sweep unknown top-level key", ["sweep", "{tmp}/sweep_topkey.toml"], "stepz"),
    ("sweep empty axis", ["sweep", "{tmp}/sweep_emptyaxis.toml"], "axis 0"),
    ("sweep without an axis", ["sweep", "{tmp}/sweep_noaxis.toml"], "[[axis]]"),
    ("sweep axis of unknown type", ["sweep", "{tmp}/sweep_axistype.toml"], "fancy"),
    ("sweep zip of unequal lengths", ["sweep", "{tmp}/sweep_zip.toml"], "different lengths"),
    ("sweep unknown launcher", ["sweep", "{tmp}/sweep_launcher.toml"], "slurm"),
    ("sweep sets the seed itself", ["sweep", "{tmp}/sweep_seed.toml"], "train.seed"),
    ("sweep on a gpu launcher without a gpu", ["sweep", "{tmp}/sweep_gpu.toml"], "launcher"),
    ("sweep invalid toml", ["sweep", "{tmp}/bad.toml"], "bad.toml"),
    ("sweep unknown shipped name", ["sweep", "tiny_cpuu"], "tiny_cpu"),
    ("sweep zero timeout", ["sweep", "tiny_cpu", "--timeout", "0"], "--timeout"),
    ("sweep negative max time", ["sweep", "tiny_cpu", "--max-time", "-1"], "--max-time"),
    ("sweep zero jobs per gpu", ["sweep", "tiny_cpu", "--jobs-per-gpu", "0"], "--jobs-per-gpu"),
    ("sweep --gpus on a cpu sweep", ["sweep", "tiny_cpu", "--gpus", "1"], "--gpus needs launcher"),
    ("sweep report of a non-sweep folder", ["sweep", "report", "{tmp}/empty_run"], "empty_run"),
    ("sweep --compare without report", ["sweep", "tiny_cpu", "--compare", "{tmp}/empty_run"], "--compare"),
    # parallel, DCP
    ("unknown parallel", T + ["train.parallel=zero3"], "zero3"),
    ("hsdp replicate does not divide the world", T + ["train.parallel=hsdp", "train.replicate=3"], "replicate=3"),
    ("negative shard", T + ["train.shard=-1"], "train.shard"),
    ("unknown compile target", T + ["train.compile=everything"], "everything"),
    ("unknown activation checkpointing", T + ["train.activation_checkpointing=half"], "'half'"),
    ("sample a dcp folder without metadata", ["sample", "{tmp}/step_2.dcp"], "step_2.dcp"),
    # export, sample, eval arguments
    ("export to a non-safetensors file", ["export", "{run}", "--out", "{tmp}/m.pt"], "--out"),
    ("export over an existing file", ["export", "{run}", "--out", "{tmp}/exists.safetensors"], "--force"),
    ("export a missing run", ["export", "{tmp}/missing", "--out", "{tmp}/m.safetensors"], "missing"),
    ("sample a prompt to an image run", ["sample", "{run}", "--prompt", "hello"], "--prompt"),
    ("sample top-k of an image flow run", ["sample", "{run}", "--top-k", "5"], "--top-k"),
    ("sample attention maps of a flow run", ["sample", "{run}", "--attention", "1,2"], "--attention"),
    ("sample completion of a flow run", ["sample", "{run}", "--complete"], "--complete"),
    ("sample on an unknown device", ["sample", "{run}", "--device", "tpu"], "unknown --device 'tpu'"),
    ("sample flow_map on a flow run", ["sample", "{run}", "--sampler", "flow_map"], "flow_map"),
    ("eval zero in nfe_list", ["eval", "{run}", "eval.nfe_list=0,2"], "eval.nfe_list"),
    ("eval unknown sampler in the table", ["eval", "{run}", "eval.nfe_list=2", "eval.samplers=rk45"], "rk45"),
    ("eval on an unknown device", ["eval", "{run}", "--device", "tpu"], "unknown --device 'tpu'"),
    ("eval a missing val_path", ["eval", "{run}", "eval.num_samples=10", "eval.val_path={tmp}/nowhere"], "nowhere"),
    ("train with a missing val_path", [*T[:-1], "eval.num_samples=10", "eval.val_path={tmp}/nowhere"], "nowhere"),
    # few-step methods
    ("lcm without a teacher", FS + ["method.name=lcm"], "method.teacher"),
    ("lcm with a missing teacher", FS + ["method.name=lcm", "method.teacher={tmp}/missing"], "missing"),
    ("lcm with a teacher that is no velocity predictor", FS + ["method.name=lcm", "method.teacher={tmp}/shortcut_teacher.pt"], "method.teacher"),
    ("pcm with a teacher on other data", FS + ["method.name=pcm", "method.teacher={tmp}/other_data.pt"], "other data"),
    ("ect with a teacher of another model", FS + ["method.name=ect", "method.teacher={run}", "model.dim=64"], "method.teacher"),
    ("lcm guidance outside the trained range", FS + ["method.name=lcm", "method.teacher={run}", "method.lcm_guidance=5"], "method.lcm_guidance"),
    ("lcm w_min above w_max", FS + ["method.name=lcm", "method.teacher={run}", "method.lcm_w_min=4"], "method.lcm_w_min"),
    ("lcm skip as long as the grid", FS + ["method.name=lcm", "method.teacher={run}", "method.lcm_skip=50"], "method.lcm_skip"),
    ("pcm zero phases", FS + ["method.name=pcm", "method.teacher={run}", "method.pcm_phases=0"], "method.pcm_phases"),
    ("pcm more phases than solver steps", FS + ["method.name=pcm", "method.teacher={run}", "method.pcm_phases=8",
                                                 "method.pcm_solver_steps=4"], "method.pcm_phases"),
    ("shortcut steps not a power of two", FS + ["method.name=shortcut", "method.shortcut_min_steps=100"], "method.shortcut_min_steps"),
    ("shortcut share of one", FS + ["method.name=shortcut", "method.shortcut_share=1"], "method.shortcut_share"),
    ("meanflow share above one", FS + ["method.name=meanflow", "method.meanflow_share=2"], "method.meanflow_share"),
    ("ect q of one", FS + ["method.name=ect", "method.teacher={run}", "method.ect_q=1"], "method.ect_q"),
    ("ladd block beyond the depth", FS + ["method.name=ladd", "method.teacher={run}", "method.tdisc_blocks=9"], "method.tdisc_blocks"),
    ("ladd regression without pairs", FS + ["method.name=ladd", "method.teacher={run}", "method.ladd_regression_weight=1"], "batch keys noise"),
    ("ladd regression without pure noise", FS + ["method.name=ladd", "method.teacher={run}", "method.ladd_regression_weight=1", "method.ladd_noise_share=0"], "method.ladd_noise_share"),
    ("perflow zero windows", FS + ["method.name=perflow", "method.teacher={run}", "method.perflow_windows=0"], "method.perflow_windows"),
    ("reflow on digits instead of pairs", FS + ["method.name=reflow", "method.teacher={run}"], "batch keys noise"),
    ("unknown reflow stage", FS + ["method.name=reflow", "method.reflow_stage=third"], "method.reflow_stage"),
    ("teacher key with flow", T + ["method.teacher={run}"], "method.teacher"),
    ("lcm key with flow", T + ["method.lcm_skip=2"], "method.lcm_skip"),
    ("flow_map sampler on a flow run", T + ["method.sampler=flow_map"], "flow_map"),
    # data generate pairs
    ("pairs from a missing run", ["data", "generate", "pairs", "{tmp}/missing", "--out", "{tmp}/p"], "missing' does not exist"),
    ("pairs zero count", ["data", "generate", "pairs", "{run}", "--out", "{tmp}/p", "--n", "0"], "--n"),
    ("pairs zero steps", ["data", "generate", "pairs", "{run}", "--out", "{tmp}/p", "--steps", "0"], "--steps"),
    ("pairs zero batch", ["data", "generate", "pairs", "{run}", "--out", "{tmp}/p", "--batch", "0"], "--batch"),
    ("pairs negative guidance", ["data", "generate", "pairs", "{run}", "--out", "{tmp}/p", "--cfg-scale", "-1"], "--cfg-scale"),
    ("pairs from a stochastic sampler", ["data", "generate", "pairs", "{run}", "--out", "{tmp}/p", "--sampler", "euler_maruyama"], "euler_maruyama"),
    ("pairs unknown sampler", ["data", "generate", "pairs", "{run}", "--out", "{tmp}/p", "--sampler", "rk45"], "rk45"),
    ("pairs into an existing folder", ["data", "generate", "pairs", "{run}", "--out", "{tmp}/empty_run"], "empty_run"),
    ("pairs of a run that is no velocity predictor", ["data", "generate", "pairs", "{tmp}/shortcut_teacher.pt", "--out", "{tmp}/p"], "shortcut"),
    ("pairs unknown kind", ["data", "generate", "triples", "{run}", "--out", "{tmp}/p"], "triples"),
    ("pairs on an unknown device", ["data", "generate", "pairs", "{run}", "--out", "{tmp}/p", "--device", "tpu"], "unknown --device 'tpu'"),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A trained tiny run plus the broken files the cases point at."""
    tmp = tmp_path_factory.mktemp("bad")
    Trainer(load_config("digits_flow", TINY + [f"train.out_dir={tmp}", "train.name=run", "train.steps=2",
                                                "eval.num_samples=0"])).fit()
    good = ckpt.list_checkpoints(tmp / "run")[-1].read_bytes()
    (tmp / "truncated.pt").write_bytes(good[: len(good) // 2])
    (tmp / "corrupt.pt").write_bytes(os.urandom(4096))
    import torch
    state = torch.load(ckpt.list_checkpoints(tmp / "run")[-1], weights_only=True)
    wrong = {**state, "config": {**state["config"], "model": {**state["config"]["model"], "dim": 64}}}
    torch.save(wrong, tmp / "wrong_model.pt")  # the saved config no longer matches the weights
    (tmp / "empty_run").mkdir()
    (tmp / "bad.toml").write_text("[optim\nlr = 1")
    (tmp / "cifar" / "cifar-10-batches-py").mkdir(parents=True)
    import pickle
    (tmp / "cifar" / "cifar-10-batches-py" / "batches.meta").write_bytes(pickle.dumps({b"label_names": [b"a"]}))
    for i in range(1, 6):
        (tmp / "cifar" / "cifar-10-batches-py" / f"data_batch_{i}").write_bytes(b"\x80\x04garbage")
    base = 'name = "s"\nsteps = 2\nlauncher = "cpu"\n[base]\npreset = "digits_flow"\n[[axis]]\n'
    (tmp / "sweep_badkey.toml").write_text(base + 'key = "optim.lrr"\nvalues = [1e-3]\n')
    (tmp / "sweep_badlr.toml").write_text(base + 'key = "optim.lr"\nvalues = [1e-3, -1.0]\n')
    axis = 'key = "optim.lr"\nvalues = [1e-3]\n'
    sweeps = {"topkey": "stepz = 3\n" + base + axis, "emptyaxis": base + 'key = "optim.lr"\nvalues = []\n',
              "noaxis": base.replace("[[axis]]\n", ""), "axistype": base + 'type = "fancy"\n',
              "zip": base + 'zip = { "optim.lr" = [1e-3, 2e-3], "train.batch_size" = [16] }\n',
              "launcher": base.replace('"cpu"', '"slurm"') + axis, "gpu": base.replace('"cpu"', '"gpu"') + axis,
              "seed": base + 'key = "train.seed"\nvalues = [1, 2]\n'}
    for name, text in sweeps.items():
        (tmp / f"sweep_{name}.toml").write_text(text)
    (tmp / "step_2.dcp").mkdir()  # a sharded checkpoint folder without its files
    (tmp / "exists.safetensors").write_bytes(b"")
    shortcut = {**state, "config": {**state["config"], "method": {**state["config"]["method"], "name": "shortcut"}}}
    torch.save(shortcut, tmp / "shortcut_teacher.pt")  # a run of a method that is no plain velocity predictor
    other = {**state, "data_spec": {**state["data_spec"], "num_classes": 5}}
    torch.save(other, tmp / "other_data.pt")
    return tmp


def snapshot(root):
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.mark.parametrize("argv,needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(world, argv, needle, capsys, monkeypatch):
    monkeypatch.chdir(world)  # default out dirs (runs/, sweeps/) land here, inside the snapshot
    argv = [a.replace("{tmp}", str(world)).replace("{run}", str(world / "run")) for a in argv]
    if argv[0] == "train" and "--resume" not in argv:
        argv.append(f"train.out_dir={world}/runs")
    before = snapshot(world)
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert needle in err, err
    assert snapshot(world) == before, "a bad input created or changed files"


def test_there_are_at_least_40_cases():
    assert len(CASES) >= 76 + 40  # 76 before issue 30, at least 40 more for the commands and families added since


@pytest.mark.slow  # a CLI subprocess; the in-process cases and test_cli's real-process exit 2 stay fast
def test_subprocess_gives_one_line_and_exit_2(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    r = subprocess.run([sys.executable, "-m", "genlab", "train", "text_ar", "method.name=flow", f"train.out_dir={tmp_path}"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "method.name=flow" in r.stderr, r.stderr
    assert not any(tmp_path.iterdir())


def test_unexpected_setup_exception_is_one_line_and_leaves_no_run(tmp_path, capsys, monkeypatch):
    import genlab.training.step as st  # the trainer (and bench) build the model in training/step.py

    def broken(*a, **k):
        raise RuntimeError("boom in the builder\nsecond line")
    patch_everywhere(monkeypatch, st, "build_model_and_method", broken)
    rc = main(T + [f"train.out_dir={tmp_path}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "RuntimeError: boom in the builder" in err, err
    assert not any(tmp_path.iterdir())
    monkeypatch.setenv("GENLAB_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(T + [f"train.out_dir={tmp_path}"])


def test_run_that_fails_midway_says_failed_and_keeps_its_checkpoint(tmp_path, capsys, monkeypatch):
    from genlab.families.image_flow.flow import FlowMatching
    real, calls = FlowMatching.loss, {"n": 0}

    def fails_later(self, model, batch, gen):
        calls["n"] += 1
        if calls["n"] > 4:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")
        return real(self, model, batch, gen)
    monkeypatch.setattr(FlowMatching, "loss", fails_later)
    rc = main(T[:-2] + ["train.steps=10", "log.ckpt_every=2", "log.every=1", f"train.out_dir={tmp_path}", "train.name=f"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and "out of memory" in err and len(err.splitlines()) == 1, err
    summary = json.loads((tmp_path / "f" / "summary.json").read_text())
    assert summary["status"] == "failed" and "out of memory" in summary["error"] and summary["step"] == 4
    state = ckpt.load_checkpoint(tmp_path / "f")
    assert state["step"] == 4
