"""Optimizers: the parameter-group policy, Caution (against float64 hand computations), the WSD schedule (closed
form), exact resume of every optimizer with and without Caution, optimizer-state bytes, FSDP2 support, and the
optimizer sweep file."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from conftest import REPO, TESTS, TINY, cli_in_process, straight_and_resumed

from genlab.config.tree import OptimConfig, load_config
from genlab.core.errors import GenlabError
from genlab.optim.build import build_optimizer, optimizer_registry
from genlab.optim.caution import Cautious
from genlab.optim.groups import param_groups
from genlab.optim.schedules import lr_at, warmup_limit
from genlab.optim.state import state_bytes
from genlab.training.step import build_model_and_method

OPTIMIZERS = ["adam", "adamw", "sgd", "shampoo", "mars", "adopt", "soap", "psgd_kron", "muon", "heavyball_adamw",
              "adamw8bit", "adamw4bit", "adamw_fp8", "adamw_coat"]
# AdamW with compressed moments: the same update rule as adamw, so the `precision` sweep compares them (memory, loss
# at equal steps; tests/unit/training/test_precision_training.py), not the optimizers sweep's LR grid
COMPRESSED_STATES = ["adamw8bit", "adamw4bit", "adamw_fp8", "adamw_coat"]


def test_every_registered_optimizer_is_covered_here():
    assert sorted(optimizer_registry.names()) == sorted(OPTIMIZERS)


@pytest.mark.parametrize("key, value, capability", [("optim.muon_scope", "all_2d", "muon_groups"),
                                                      ("optim.heavyball_compile", "off", "heavyball"),
                                                      ("optim.precondition_every", "3", "preconditioned")])
def test_a_capability_key_is_accepted_exactly_by_the_entries_that_have_the_capability(key, value, capability):
    """The entry's typed capability decides whether its key is read: set with any other optimizer it is an error."""
    for name, spec in optimizer_registry.specs():
        if getattr(spec, capability):
            load_config(None, [f"optim.name={name}", f"{key}={value}"])
        else:
            with pytest.raises(GenlabError, match=f"{key} is not read by optimizer '{name}'"):
                load_config(None, [f"optim.name={name}", f"{key}={value}"])


# -- parameter groups --------------------------------------------------------------------------------
def _model(preset, *over):
    from genlab.data import build_dataset
    cfg = load_config(preset, list(over))
    model, _ = build_model_and_method(cfg, build_dataset(cfg.data).spec)
    return model


def _groups(model, scope=None):
    """{"muon": names, "decay": names, "no_decay": names} of the policy's groups."""
    out = {"muon": set(), "decay": set(), "no_decay": set()}
    names = {id(p): n for n, p in model.named_parameters()}
    for g in param_groups(model, 0.1, muon_scope=scope):
        key = "muon" if g.get("muon") else "decay" if g["weight_decay"] > 0 else "no_decay"
        out[key] |= {names[id(p)] for p in g["params"]}
    return out


DIT = ["model.dim=32", "model.depth=2", "model.heads=2"]
DIT_HIDDEN = {f"blocks.{i}.{n}.weight" for i in range(2) for n in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")}
DIT_ADALN = {"blocks.0.ada.1.weight", "blocks.1.ada.1.weight"}
DIT_OTHER_MATRICES = {"patch_embed.weight", "t_embed.mlp.0.weight", "t_embed.mlp.2.weight", "final.ada.1.weight",
                      "final.linear.weight"}


def test_dit_groups_decay_only_linear_weights_and_muon_takes_the_hidden_matrices():
    model = _model("digits_flow", *DIT)
    biases = {n for n, _ in model.named_parameters() if n.endswith(".bias")}
    plain = _groups(model)
    assert plain["muon"] == set()
    assert plain["decay"] == DIT_HIDDEN | DIT_ADALN | DIT_OTHER_MATRICES
    assert plain["no_decay"] == biases | {"y_embed.weight"}  # the class-embedding table is 2-D but does not decay
    hidden = _groups(model, "hidden")
    assert hidden["muon"] == DIT_HIDDEN
    assert hidden["decay"] == DIT_ADALN | DIT_OTHER_MATRICES and hidden["no_decay"] == plain["no_decay"]
    assert _groups(model, "hidden_adaln")["muon"] == DIT_HIDDEN | DIT_ADALN
    every_2d = _groups(model, "all_2d")  # heavyball MuonAdamW's own rule: the embedding table too
    assert every_2d["muon"] == DIT_HIDDEN | DIT_ADALN | DIT_OTHER_MATRICES | {"y_embed.weight"}


def test_gpt_groups_exclude_norms_token_and_position_tables_and_the_head():
    gpt_hidden = {f"blocks.{i}.{n}.weight" for i in range(4) for n in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")}
    norms = {f"blocks.{i}.norm{j}.weight" for i in range(4) for j in (1, 2)} | {"norm.weight"}
    tied = _model("text_ar", "model.size=tiny")
    assert tied.head.weight is tied.tok_emb.weight
    g = _groups(tied)
    assert g["decay"] == gpt_hidden  # the head is tied to the token table: it counts as the embedding
    assert g["no_decay"] == norms | {"tok_emb.weight", "pos_emb.weight"}
    untied = _model("text_ar", "model.size=tiny", "model.tie_weights=false")
    g = _groups(untied, "hidden")
    assert g["muon"] == gpt_hidden
    assert g["decay"] == {"head.weight"}  # the output head decays, under AdamW
    assert g["no_decay"] == norms | {"tok_emb.weight", "pos_emb.weight"}


def test_muon_groups_carry_the_rms_matching_lr_scale():
    model = _model("digits_flow", *DIT)
    for g in param_groups(model, 0.0, muon_scope="hidden"):
        if g.get("muon"):
            for p in g["params"]:
                a, b = p.shape
                assert g["lr_scale"] == pytest.approx(0.2 * math.sqrt(max(a, b)) / math.sqrt(max(1, a / b)))


@pytest.mark.slow
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_weight_decay_reaches_exactly_the_decay_group(name):
    """Same gradients, weight_decay 0 vs 0.1: the no-decay parameters follow the same trajectory bit for bit, the
    decayed ones do not (heavyball used to decay every parameter)."""
    model0 = _model("digits_flow", *DIT)
    expected = _groups(model0, "hidden" if name == "muon" else None)
    runs = []
    for wd in (0.0, 0.1):
        model = _model("digits_flow", *DIT)
        model.load_state_dict(model0.state_dict())
        opt = build_optimizer(model, OptimConfig(name=name, lr=1e-2, weight_decay=wd, precondition_every=1))
        gen, params = torch.Generator().manual_seed(0), list(model.parameters())
        torch.manual_seed(0)  # heavyball's stochastic rounding draws from the global RNG
        for _ in range(3):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
        runs.append(dict(model.named_parameters()))
    for n in expected["no_decay"]:
        assert torch.equal(runs[0][n], runs[1][n]), f"{name}: {n} was decayed"
    for n in expected["decay"] | expected["muon"]:
        assert not torch.equal(runs[0][n], runs[1][n]), f"{name}: {n} was not decayed"


# -- caution ------------------------------------------------------------------------------------------
def _fixed_grads(steps, shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(steps)]


def _caution_mask(u, g):
    mask = (u * g > 0).double()
    return mask, u.numel() / max(mask.sum().item(), 1.0)


def _run_entry(name, p0, grads, **ocfg):
    layer = nn.Linear(p0.shape[1], p0.shape[0], bias=False).double()
    layer.weight.data.copy_(p0)
    opt = build_optimizer(layer, OptimConfig(name=name, **ocfg))
    for g in grads:
        layer.weight.grad = g.clone()
        opt.step()
    return opt, layer.weight.detach()


def test_shampoo_steps_do_not_depend_on_the_gradient_scale():
    """Grafted Shampoo is scale-free: the Kronecker factors' inverse roots and the RMSProp graft both normalise the
    gradient, and the ridge of the roots is relative. So gradients 1e-4 times smaller must give the same steps. The
    library's own start, statistics = 1e-6 * I, outweighs gradients this small and turns the step into SGD's."""
    # 64 x 96: smaller matrices are merged into one dimension by the library and left unpreconditioned
    p0 = torch.randn(64, 96, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    grads = _fixed_grads(6, (64, 96), seed=2)
    kw = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-14, weight_decay=0.0, precondition_every=2)
    _, big = _run_entry("shampoo", p0, grads, **kw)
    _, small = _run_entry("shampoo", p0, [g * 1e-4 for g in grads], **kw)
    assert not torch.allclose(big, p0)
    torch.testing.assert_close(small - p0, big - p0, rtol=1e-4, atol=1e-6)  # without the fix: 0.05 apart


def test_cautious_adamw_matches_a_float64_hand_computation():
    lr, wd, (b1, b2), eps = 0.05, 0.1, (0.9, 0.99), 1e-8
    p0, grads = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)), _fixed_grads(6, (4, 3))
    opt, got = _run_entry("adamw", p0, grads, lr=lr, weight_decay=wd, betas=(b1, b2), eps=eps, caution=True)
    assert isinstance(opt, Cautious) and isinstance(opt.base, torch.optim.AdamW)
    p, m, v, masked = p0.clone(), torch.zeros_like(p0), torch.zeros_like(p0), 0
    for t, g in enumerate(grads, 1):
        p = p * (1 - lr * wd)  # decoupled decay: not masked
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        u = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)
        mask, scale = _caution_mask(u, g)
        masked += int((mask == 0).sum())
        p = p - lr * u * mask * scale
    assert masked > 0  # the sequence disagrees somewhere, so the mask is exercised
    torch.testing.assert_close(got, p, rtol=1e-12, atol=1e-12)


def test_cautious_sgd_matches_a_float64_hand_computation():
    lr, wd, mu = 0.1, 0.01, 0.9
    p0, grads = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2)), _fixed_grads(6, (3, 5), 3)
    _, got = _run_entry("sgd", p0, grads, lr=lr, weight_decay=wd, betas=(mu, 0.99), caution=True)
    p, buf, masked = p0.clone(), None, 0
    for g in grads:
        d = g + wd * p  # torch SGD: L2 decay inside the update
        buf = d.clone() if buf is None else mu * buf + d
        u = d + mu * buf  # Nesterov
        mask, scale = _caution_mask(u, g)
        masked += int((mask == 0).sum())
        p = p - lr * u * mask * scale
    assert masked > 0
    torch.testing.assert_close(got, p, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,cls", [("adamw", torch.optim.AdamW), ("adam", torch.optim.Adam), ("sgd", torch.optim.SGD)])
def test_without_caution_the_torch_entries_follow_torch_exactly(name, cls):
    model = _model("digits_flow", *DIT)
    ref = _model("digits_flow", *DIT)
    ref.load_state_dict(model.state_dict())
    opt = build_optimizer(model, OptimConfig(name=name, lr=1e-2, weight_decay=0.1, caution=False))
    assert type(opt) is cls
    kw = {"momentum": 0.9, "nesterov": True} if cls is torch.optim.SGD else {"betas": (0.9, 0.99), "eps": 1e-8}
    torch_opt = cls(param_groups(ref, 0.1), lr=1e-2, **kw)
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        for p, q in zip(model.parameters(), ref.parameters()):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        opt.step()
        torch_opt.step()
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p, q), n


def test_caution_wrapper_state_is_the_base_optimizers():
    layer = nn.Linear(3, 2)
    opt = build_optimizer(layer, OptimConfig(name="adamw", caution=True))
    layer.weight.grad, layer.bias.grad = torch.ones(2, 3), torch.ones(2)
    opt.step()
    assert opt.state is opt.base.state and opt.param_groups is opt.base.param_groups
    sd = opt.state_dict()
    assert sd.keys() == opt.base.state_dict().keys() and len(sd["state"]) == 2
    fresh = build_optimizer(nn.Linear(3, 2), OptimConfig(name="adamw", caution=True))
    fresh.load_state_dict(sd)
    assert torch.equal(fresh.base.state_dict()["state"][0]["exp_avg"], sd["state"][0]["exp_avg"])


# -- LR schedule ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", ["linear", "1-sqrt"])
def test_wsd_schedule_matches_its_closed_form(shape):
    o = OptimConfig(lr=2.0, schedule="wsd", warmup_steps=10, decay_frac=0.25, decay_shape=shape, min_lr_ratio=0.1)
    total = 100
    start = 75  # the last 25% decay
    f = (lambda x: 1 - x) if shape == "linear" else (lambda x: 1 - math.sqrt(x))
    for s in range(total):
        if s < 10:
            want = (s + 1) / 10
        elif s < start:
            want = 1.0
        else:
            want = 0.1 + 0.9 * f((s - start) / (total - start))
        assert lr_at(s, total, o) == pytest.approx(2.0 * want, rel=1e-12), s
    assert lr_at(total, total, o) == pytest.approx(0.2)  # ends at min_lr_ratio * lr


# a warm-up that cannot end within train.steps (the LR never reaches its peak): `genlab train` scales the preset's to
# its share of the preset's steps with a note, and refuses one the user set (docs/optimizers.md)
TINY_OWN_WARMUP = [o for o in TINY if not o.startswith("optim.warmup_steps=")]  # the preset's warm-up
def test_every_shipped_preset_warmup_fits_its_own_steps():
    from genlab.config.tree import CONFIG_DIR
    for p in sorted(CONFIG_DIR.glob("*.toml")):
        cfg = load_config(p.stem)
        assert cfg.optim.warmup_steps <= warmup_limit(cfg.train.steps, cfg.optim), p.stem


def test_a_preset_warmup_that_does_not_fit_the_steps_is_scaled_with_a_note():
    from genlab.cli.commands.train import fit_warmup
    cfg = load_config(None)
    assert fit_warmup(cfg, None, []) == []  # a schedule that fits is left alone, silently: the default run's numbers
    assert cfg.optim.warmup_steps == 100
    cfg = load_config("mnist_flow", ["train.steps=400"])
    notes = fit_warmup(cfg, "mnist_flow", ["train.steps=400"])
    assert cfg.optim.warmup_steps == 20  # mnist_flow warms up over 500 of its 10,000 steps: 5%
    assert len(notes) == 1 and "optim.warmup_steps 500 -> 20 to fit train.steps=400" in notes[0], notes
    assert max(lr_at(s, 400, cfg.optim) for s in range(400)) == pytest.approx(cfg.optim.lr)


def test_genlab_train_runs_with_the_scaled_warmup_and_records_it(tmp_path, capfd):
    import tomllib
    r = cli_in_process(capfd, "train", *TINY_OWN_WARMUP, "train.steps=8", "eval.num_samples=0", f"train.out_dir={tmp_path}",
                       "train.name=s")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "genlab: note: optim.warmup_steps 100 -> 1 to fit train.steps=8" in r.stderr  # digits_flow: 100 of 800
    text = (tmp_path / "s" / "config.toml").read_text()
    assert text.startswith("# note: optim.warmup_steps 100 -> 1") and tomllib.loads(text)["optim"]["warmup_steps"] == 1


@pytest.mark.parametrize("over", [["optim.warmup_steps=8", "train.steps=8"],
                                  ["optim.schedule=wsd", "optim.warmup_steps=7", "train.steps=8"],  # wsd decays from 6
                                  ["optim.warmup_steps=900"],  # digits_flow: 800 steps
                                  ["{toml}"]])  # a config file's own warm-up is the user's too
def test_a_warmup_the_user_set_that_does_not_fit_is_refused_before_any_run_folder(tmp_path, capfd, over):
    toml = tmp_path / "mine.toml"
    toml.write_text("[train]\nsteps = 10\n[optim]\nwarmup_steps = 10\n")
    over = [str(toml) if o == "{toml}" else o for o in over]
    r = cli_in_process(capfd, "train", *over, *TINY_OWN_WARMUP, f"train.out_dir={tmp_path / 'runs'}")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "set optim.warmup_steps <=" in lines[0], r.stderr
    assert not (tmp_path / "runs").exists()


# -- state size -----------------------------------------------------------------------------------------
def test_state_bytes_counts_adamw_moments_and_steps():
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    opt = torch.optim.AdamW(model.parameters())
    assert state_bytes(opt) == 0
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    n = sum(p.numel() for p in model.parameters())
    # exp_avg + exp_avg_sq in fp32 per element, and a 0-d fp32 step per parameter tensor
    assert state_bytes(opt) == 2 * 4 * n + 4 * len(list(model.parameters()))


def test_state_bytes_counts_shampoos_kronecker_factors():
    # pytorch-optimizer keeps Shampoo's factors in PreConditioner / graft objects, not in tensors of the state dict:
    # counting only those tensors reported Shampoo's state as its momentum alone (SGD's size) in the sweep
    pytest.importorskip("pytorch_optimizer")
    model = nn.Linear(96, 64, bias=False)
    opt = build_optimizer(model, OptimConfig(name="shampoo", lr=1e-3))
    model(torch.randn(8, 96)).square().mean().backward()
    opt.step()
    momentum, graft = 64 * 96, 2 * 64 * 96              # Shampoo momentum; RMSProp graft statistics + momentum
    factors = 2 * (64 * 64 + 96 * 96)                   # left/right statistics and their inverse roots (one block)
    assert state_bytes(opt) == 4 * (momentum + graft + factors)


# -- exact resume -----------------------------------------------------------------------------------------
RESUME = ["train.steps=4", "log.every=1", "log.ckpt_every=0", "eval.num_samples=0", "eval.grid_per_class=1",
          "eval.sample_steps=2", "optim.warmup_steps=2", "optim.weight_decay=0.01", "train.ema_decay=0"]


@pytest.mark.slow
@pytest.mark.parametrize("caution", [False, True], ids=["plain", "caution"])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optimizer_resumes_exactly(tmp_path, name, caution):
    """4 steps straight == 2 steps, checkpoint, resume, 2 steps: losses, weights and optimizer state bit for bit."""
    common = RESUME + [f"optim.name={name}", f"optim.caution={str(caution).lower()}"]
    if name in ("shampoo", "soap"):
        common.append("optim.precondition_every=2")  # a preconditioner refresh after the resume
    _, a, b = straight_and_resumed(tmp_path, 2, *common)
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), f"{name}: {k} differs after resume"
    _assert_same_state(a["optimizer"]["state"], b["optimizer"]["state"], name)


def _assert_same_state(x, y, where):
    if torch.is_tensor(x):
        assert torch.equal(x, y), where
    elif isinstance(x, dict):
        assert x.keys() == y.keys(), where
        for k in x:
            _assert_same_state(x[k], y[k], f"{where}.{k}")


# -- FSDP2 ------------------------------------------------------------------------------------------------
WORKER = TESTS / "dist_worker.py"
FSDP_OK = [n for n in OPTIMIZERS if optimizer_registry.spec(n).fsdp]
FSDP_REFUSED = [n for n in OPTIMIZERS if n not in FSDP_OK]


def _start(out, nproc, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    head = [sys.executable] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                 f"--nproc_per_node={nproc}"]
    return out, subprocess.Popen(head + [str(WORKER), str(out), *map(str, args)], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)


def _finish(started):
    out, proc = started
    try:
        _, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 0, err[-3000:]
    return torch.load(out, weights_only=False)


def _launch(out, nproc, *args):
    return _finish(_start(out, nproc, *args))


@pytest.mark.slow
def test_fsdp2_optimizers_follow_the_single_process_run(tmp_path):
    """Each FSDP2-capable optimizer, with Caution, on 2 gloo ranks (DTensor shards) follows the 1-process run and
    writes a DCP checkpoint. Tolerance 1e-3 on weights: a cautious mask flips where u*g is near zero and the
    reductions run in another order. Refused: shampoo (its preconditioner statistics mix DTensor and plain tensors)
    and soap (it runs but leaves the 1-process trajectory: 0.03 weight difference after 4 steps of lr 1e-2)."""
    names = ",".join(FSDP_OK)
    # the 1-process reference runs beside the 2-rank run (independent processes; it fills the ranks' idle time)
    ref = _start(tmp_path / "ref.pt", 1, "--mode", "none", "--steps", 3, "--optims", names, "--caution")
    got = _launch(tmp_path / "fsdp.pt", 2, "--mode", "fsdp", "--steps", 3, "--optims", names, "--caution",
                  "--save-at", 2, "--ckpt", tmp_path / "ck")
    ref = _finish(ref)
    for n in FSDP_OK:
        torch.testing.assert_close(torch.tensor(got[n]["losses"]), torch.tensor(ref[n]["losses"]), rtol=1e-5, atol=1e-6)
        tol = 5e-3 if n == "muon" else 1e-3  # Muon's Newton-Schulz rounds to bf16 stochastically, per rank's RNG
        for k, v in ref[n]["model"].items():
            torch.testing.assert_close(got[n]["model"][k], v, rtol=0, atol=tol, msg=f"{n}: {k}")
        assert (tmp_path / "ck" / n / "step_00000002.dcp" / ".metadata").exists()


@pytest.mark.parametrize("name", FSDP_REFUSED)
def test_fsdp_refuses_optimizers_that_cannot_update_dtensor_shards(name):
    with pytest.raises(GenlabError, match=f"optim.name={name} does not work with train.parallel=fsdp"):
        load_config("digits_flow", ["train.parallel=fsdp", f"optim.name={name}"])


# -- the sweep -----------------------------------------------------------------------------------------------
def test_optimizer_sweep_covers_every_optimizer_with_and_without_caution(tmp_path):
    from genlab.lab.sweep.spec import load_sweep
    shipped = REPO / "src" / "genlab" / "configs" / "sweeps" / "optimizers.toml"
    sw = load_sweep(shipped)
    pairs = {(o.split("=")[1], c.split("=")[1]) for v in sw.variants for o in v.overrides if o.startswith("optim.name=")
             for c in v.overrides if c.startswith("optim.caution=")}
    rules = [n for n in OPTIMIZERS if n not in COMPRESSED_STATES]
    assert pairs == {(n, c) for n in rules for c in ("false", "true")}
    lrs = {}
    for v in sw.variants:
        d = dict(o.split("=", 1) for o in v.overrides)
        lrs.setdefault(d["optim.name"], set()).add(float(d["optim.lr"]))
    assert all(len(x) == 3 for x in lrs.values())
    # the tiny CPU version: the same axes on the embedded digits with a tiny DiT parse and expand too
    text = shipped.read_text()
    base = ('name = "optimizers_cpu"\nsteps = 4\nseeds = [0]\nlauncher = "cpu"\nloss_at = [2]\nloss_at_time = [1]\n'
            '[base]\npreset = "digits_flow"\noverrides = ["model.dim=32", "model.depth=2", "model.heads=2", '
            '"optim.schedule=wsd", "eval.num_samples=0"]\n')
    tiny = tmp_path / "optimizers_cpu.toml"
    tiny.write_text(base + text[text.index("[[axis]]"):])
    cpu = load_sweep(tiny)
    assert len(cpu.variants) == len(sw.variants) == 2 * 3 * len(rules)


def test_report_reads_loss_at_equal_wall_clock_step_time_and_state_memory(tmp_path):
    import json

    from genlab.lab.sweep.report import run_row
    recs = [{"step": s, "loss": 1.0 / s, "wall_time": 0.5 * s, "step_time": 0.5, "optim_state_mib": 3.0} for s in range(1, 7)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    row = run_row(tmp_path, loss_at=[4], loss_at_time=[1.9, 2.5, 10])
    assert row["loss@4"] == 0.25
    assert row["loss@1.9s"] == 1 / 3 and row["loss@2.5s"] == 0.2  # the last loss logged by then (steps 3 and 5)
    assert row["loss@10s"] is None  # the run ended before 10 s
    assert row["step_time"] == 0.5 and row["optim_state_mib"] == 3.0


@pytest.mark.parametrize("mode, expected", [("default", "default"), ("off", None),
                                            ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs")])
def test_heavyball_compile_mode_follows_the_config_on_cuda_and_is_eager_on_cpu(monkeypatch, mode, expected):
    """optim.heavyball_compile sets the mode heavyball reads at its first step; without CUDA it is always eager."""
    heavyball = pytest.importorskip("heavyball")
    monkeypatch.setattr(heavyball.utils, "compile_mode", "sentinel")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    build_optimizer(nn.Linear(4, 4), OptimConfig(name="soap", heavyball_compile=mode))
    assert heavyball.utils.compile_mode is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    build_optimizer(nn.Linear(4, 4), OptimConfig(name="soap", heavyball_compile=mode))
    assert heavyball.utils.compile_mode == expected


def test_heavyball_compile_is_refused_for_optimizers_that_do_not_read_it():
    with pytest.raises(GenlabError, match="optim.heavyball_compile is not read by"):
        load_config("digits_flow", ["optim.name=adamw", "optim.heavyball_compile=off"])
    load_config("digits_flow", ["optim.name=muon", "optim.heavyball_compile=off"])  # muon is heavyball's MuonAdamW
