"""Speed switches on CPU: activation checkpointing is exact, fp16 loss scaling skips overflowing steps,
float8 conversion picks the right layers, invalid combinations fail before training, bench sanity."""
from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import stop_after, tiny_config

from genlab.config.tree import TrainConfig
from genlab.core.errors import GenlabError
from genlab.families.image_flow.dit import DiT, DiTSpec
from genlab.runtime.parallel import _mesh_dims, clip_grads
from genlab.runtime.switches import apply_switches, build_precision


def tiny_dit(depth=4):
    torch.manual_seed(0)
    return DiT(DiTSpec(image_size=8, channels=1, num_classes=3, dim=32, depth=depth, heads=2))


def grads_of(model):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 1, 8, 8, generator=g)
    t, y = torch.rand(4, generator=g), torch.randint(0, 3, (4,), generator=g)
    # non-zero adaLN weights so every path of the block carries gradient
    with torch.no_grad():
        for b in model.blocks:
            b.ada[1].weight.normal_(0, 0.1, generator=g)
    model.zero_grad()
    F.mse_loss(model(x, t, y), torch.randn(4, 1, 8, 8, generator=g)).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["full", "every_k", "selective"])
def test_activation_checkpointing_gives_the_same_gradients_as_none(mode):
    ref = grads_of(tiny_dit())
    model = apply_switches(tiny_dit(), TrainConfig(activation_checkpointing=mode, ac_every=2))
    got = grads_of(model)
    assert got.keys() == ref.keys()
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-6, atol=1e-7, msg=k)


def test_activation_checkpointing_keeps_state_dict_keys():
    plain = tiny_dit()
    ckpt = apply_switches(tiny_dit(), TrainConfig(activation_checkpointing="full", ac_every=2))
    assert list(ckpt.state_dict()) == list(plain.state_dict())
    assert all(getattr(b, "_genlab_checkpointed", False) for b in ckpt.blocks)


def test_every_k_checkpoints_every_kth_block():
    m = apply_switches(tiny_dit(depth=5), TrainConfig(activation_checkpointing="every_k", ac_every=2))
    assert [getattr(b, "_genlab_checkpointed", False) for b in m.blocks] == [True, False, True, False, True]


def test_fp16_loss_scaling_skips_an_overflowing_step_and_lowers_the_scale():
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, enabled=True)
    before = copy.deepcopy(model.state_dict())
    scaler.scale(model(torch.randn(2, 4)).sum()).backward()
    model.weight.grad[0, 0] = float("inf")  # what an fp16 overflow produces
    scaler.step(opt)
    scaler.update()
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), "an overflowing step must not touch the weights"
    assert scaler.get_scale() == 512.0
    opt.zero_grad()
    scaler.scale(model(torch.randn(2, 4)).sum()).backward()
    scaler.step(opt)  # a finite step goes through
    assert not torch.equal(model.weight, before["weight"])


def test_fp16_training_skips_overflowing_steps_instead_of_calling_the_run_diverged(tmp_path, monkeypatch):
    """A GradScaler overflow (inf gradients after scaling) is routine under fp16: the trainer must let the scaler skip
    the update and lower the scale, not stop the run as diverged (what the H100 precision sweep showed)."""
    import json

    from genlab.training import step as step_mod
    from genlab.training.trainer import Trainer
    real = torch.amp.GradScaler

    def huge_scale(device, enabled=True, **kw):  # 2^24 x the fp16 activation gradients overflows fp16 (max 65504):
        return real(device, init_scale=2.0**24, enabled=enabled, **kw)  # the first steps overflow, then the halved scale fits
    monkeypatch.setattr(step_mod.torch.amp, "GradScaler", huge_scale)
    s = Trainer(tiny_config(tmp_path, "train.precision=fp16", "train.device=cpu", "train.steps=16", "log.every=1",
                            "eval.num_samples=0")).fit()
    assert s["status"] == "finished" and s["step"] == 16
    rows = [json.loads(x) for x in (tmp_path / s["run_dir"].split("/")[-1] / "metrics.jsonl").read_text().splitlines()]
    finite = [r["grad_norm"] is not None and math.isfinite(r["grad_norm"]) for r in rows if "grad_norm" in r]
    assert not all(finite), "no step overflowed: the test tests nothing"  # the log writes a non-finite norm as null
    assert any(finite) and all(math.isfinite(r["loss"]) for r in rows if "loss" in r)


def test_fp16_precision_enables_loss_scaling():
    p = build_precision("fp16", torch.device("cpu"))
    assert p.loss_scaling and p.autocast_dtype == torch.float16


def test_clip_grads_matches_torch_and_returns_a_plain_tensor():
    a, b = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    x = torch.randn(7, 5)
    for m in (a, b):
        (m(x) ** 2).sum().backward()
    want = torch.nn.utils.clip_grad_norm_(a.parameters(), 0.3)
    got = clip_grads(b.parameters(), 0.3)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(b.weight.grad, a.weight.grad)
    norm = clip_grads(b.parameters(), 0.0)  # 0 = no clipping, still the norm
    torch.testing.assert_close(norm, torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in b.parameters()])))


# -- float8 -------------------------------------------------------------------------------------
def test_float8_precision_refuses_cpu_before_training():
    for name in ("float8_tensorwise", "float8_rowwise"):
        with pytest.raises(GenlabError, match="SM89|H100"):
            build_precision(name, torch.device("cpu"))


def test_float8_run_on_cpu_fails_before_creating_anything(tmp_path):
    from genlab.training.trainer import Trainer
    cfg = tiny_config(tmp_path, "train.precision=float8_tensorwise", "train.name=f8", "train.steps=2")
    with pytest.raises(GenlabError, match="float8"):
        Trainer(cfg).fit()
    assert not (tmp_path / "f8").exists()


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_conversion_converts_only_block_linears(recipe):
    pytest.importorskip("torchao")
    from genlab.nn.float8 import convert_float8, count_float8
    model = tiny_dit(depth=2)
    convert_float8(model, recipe)
    names = {n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"}
    # per block: qkv, attention out, 2 MLP linears; never adaLN, embeddings or the final layer
    assert count_float8(model) == 2 * 4
    assert all(n.startswith("blocks.") and ".ada" not in n for n in names)
    assert not any(n.startswith(("final", "patch_embed", "t_embed")) for n in names)


def test_float8_filter_needs_dims_divisible_by_16():
    from genlab.nn.float8 import skip_reason
    assert not skip_reason(torch.nn.Linear(32, 64), "blocks.0.mlp.fc1")
    assert skip_reason(torch.nn.Linear(24, 64), "blocks.0.mlp.fc1")
    assert skip_reason(torch.nn.Linear(32, 64), "final.linear")


# -- invalid combinations ---------------------------------------------------------------------
@pytest.mark.parametrize("world,r,s,ok", [(4, 2, 2, True), (4, 0, 2, True), (4, 4, 0, True), (4, 3, 0, False),
                                          (4, 2, 3, False), (6, 4, 0, False), (2, -1, 2, False)])
def test_hsdp_degrees_must_multiply_to_the_world_size(world, r, s, ok):
    info = SimpleNamespace(world=world)
    tcfg = SimpleNamespace(replicate=r, shard=s)
    if ok:
        rr, ss = _mesh_dims(info, tcfg, hybrid=True)
        assert rr * ss == world
    else:
        with pytest.raises(GenlabError, match="replicate"):
            _mesh_dims(info, tcfg, hybrid=True)


def test_fsdp_rejects_a_partial_shard_degree():
    with pytest.raises(GenlabError, match="hsdp"):
        _mesh_dims(SimpleNamespace(world=4), SimpleNamespace(replicate=0, shard=2), hybrid=False)


def test_compile_optimizer_refuses_an_optimizer_it_cannot_compile():
    from genlab.runtime.switches import compile_optimizer_step
    opt = torch.optim.RMSprop(torch.nn.Linear(2, 2).parameters())
    with pytest.raises(GenlabError, match="compile_optimizer"):
        compile_optimizer_step(opt, torch.device("cpu"))


@pytest.mark.parametrize("override", ["train.precision=fp64", "train.compile=everything", "train.parallel=tp",
                                      "train.activation_checkpointing=some", "train.compiled_autograd=maybe"])
def test_unknown_switch_values_fail_at_config_time(tmp_path, override):
    with pytest.raises(GenlabError):
        tiny_config(tmp_path, override)


def test_parallel_none_under_several_processes_is_refused():
    from genlab.runtime.parallel import par_none
    with pytest.raises(GenlabError, match="several processes"):
        par_none(None, SimpleNamespace(enabled=True), None, None)


# -- compiled optimizer: LR in a tensor, no recompiles when it changes ----------------------------
def test_compiled_optimizer_step_matches_eager_and_does_not_recompile_on_lr_changes():
    from genlab.runtime.switches import compile_counts, compile_optimizer_step, set_lr
    torch.manual_seed(0)
    a = torch.nn.Linear(4, 4)
    b = copy.deepcopy(a)
    oa = torch.optim.AdamW(a.parameters(), lr=1e-2)
    ob = compile_optimizer_step(torch.optim.AdamW(b.parameters(), lr=1e-2), torch.device("cpu"))
    assert torch.is_tensor(ob.param_groups[0]["lr"])
    x = torch.randn(3, 4)
    graphs = None
    for i in range(4):
        for m, o in ((a, oa), (b, ob)):
            set_lr(o, 1e-2 / (i + 1))
            m(x).pow(2).sum().backward()
            o.step()
            o.zero_grad()
        if i == 0:
            graphs = compile_counts()["graphs"]
    assert compile_counts()["graphs"] == graphs, "changing the LR recompiled the optimizer step"
    torch.testing.assert_close(b.weight, a.weight, rtol=1e-5, atol=1e-6)


# -- bench --------------------------------------------------------------------------------------
def test_bench_on_cpu_returns_sane_numbers(tmp_path):
    from genlab.lab.bench import format_table, run_bench
    cfg = tiny_config(tmp_path, "train.device=cpu", "train.batch_size=8")
    r = run_bench(cfg, steps=3, warmup=1, split_steps=2)
    assert r["samples_per_s"] > 0 and r["step_ms"] > 0 and r["tokens_per_s"] is None
    assert r["mfu"] is None and r["peak_mem_gib"] is None  # no peak FLOP/s or CUDA memory on CPU
    # each phase was timed (a ratio of phase times to step time would be a timing test: it failed on a loaded machine)
    assert all(r[k] > 0 for k in ("fwd_ms", "bwd_ms", "opt_ms"))
    from genlab.lab.bench import data_spec_for
    from genlab.training.trainer import build_model_and_method
    model, _ = build_model_and_method(cfg, data_spec_for(cfg))
    assert r["flops_per_step"] == 3 * model.flops_per_sample() * 8  # forward + backward = 3x the forward's FLOPs
    assert r["switches"]["parallel"] == cfg.train.parallel
    table = format_table([r])
    assert table.count("\n") == 2 and "| samples/s |" in table


def test_gpu_turn_lets_one_holder_of_a_lock_file_in_at_a_time(tmp_path):
    import threading
    import time

    from genlab.lab.bench import gpu_turn
    for lock, may_overlap in ((tmp_path / "gpu.lock", False), (None, True)):
        spans = []

        def hold():
            with gpu_turn(lock):
                t0 = time.time()
                time.sleep(0.3)
                spans.append((t0, time.time()))
        threads = [threading.Thread(target=hold) for _ in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        (a0, a1), (b0, b1) = sorted(spans)
        assert (b0 < a1) == may_overlap, (lock, spans)


def test_benches_sharing_a_turn_lock_measure_one_at_a_time(tmp_path):
    """bench_backbones.py --parallel: benches compile together and take turns for warm-up and timing."""
    import threading

    from genlab.lab.bench import run_bench
    lock, out = tmp_path / "gpu.lock", {}

    def bench(name):
        cfg = tiny_config(tmp_path, "train.device=cpu", "train.batch_size=8", f"train.name={name}")
        out[name] = run_bench(cfg, steps=3, warmup=2, split_steps=1, turn_lock=lock)
    threads = [threading.Thread(target=bench, args=(k,)) for k in "ab"]
    [t.start() for t in threads]
    [t.join() for t in threads]
    (a0, a1), (b0, b1) = sorted(out[k]["turn_s"] for k in "ab")
    assert a0 < a1 <= b0 < b1
    assert all(out[k]["warmup"] == 2 and out[k]["steps"] == 3 and out[k]["step_ms"] > 0 for k in "ab")


def test_export_writes_safetensors_that_sample_loads_and_refuses_bad_out(tmp_path, capfd):
    from conftest import cli_in_process  # in-process: the CLI's main with this argv
    r = cli_in_process(capfd, "train", *[f"{o}" for o in ("model.dim=32", "model.depth=2", "model.heads=2", "train.batch_size=8",
                       "train.steps=2", "log.progress=false", "log.tensorboard=false", "eval.num_samples=0",
                       "eval.grid_per_class=1", "eval.sample_steps=2", f"train.out_dir={tmp_path}", "train.name=r")])
    assert r.returncode == 0, r.stderr[-2000:]
    bad = cli_in_process(capfd, "export", str(tmp_path / "r"), "--out", str(tmp_path / "w.pt"))
    assert bad.returncode == 2 and not (tmp_path / "w.pt").exists()
    ok = cli_in_process(capfd, "export", str(tmp_path / "r"), "--out", str(tmp_path / "w.safetensors"))
    assert ok.returncode == 0, ok.stderr[-2000:]
    from genlab.runtime.checkpoint import load_checkpoint
    src, exp = load_checkpoint(tmp_path / "r"), load_checkpoint(tmp_path / "w.safetensors")
    for k, v in src["ema"].items():
        assert torch.equal(exp["model"][k], v)
    again = cli_in_process(capfd, "export", str(tmp_path / "r"), "--out", str(tmp_path / "w.safetensors"))
    assert again.returncode == 2  # no silent overwrite
    s = cli_in_process(capfd, "sample", str(tmp_path / "w.safetensors"), "--n", "4", "--out", str(tmp_path / "g.png"), "--device", "cpu")
    assert s.returncode == 0 and (tmp_path / "g.png").exists(), s.stderr[-2000:]


@pytest.mark.slow  # three runs and an inductor compile; the update's eager checks stay fast
def test_compiled_update_of_optimizer_and_ema_matches_the_eager_step(tmp_path, one_thread):
    """train.compile_optimizer=true runs the optimizer step and the EMA update as one compiled function (a CUDA graph
    under reduce-overhead on a GPU). Its weights and EMA after a few steps equal the eager path's (the same seed and
    data), with the EMA decay warm-up changing every step and no recompile after the first."""
    from genlab.runtime import checkpoint as ckpt
    from genlab.runtime.switches import compile_counts
    from genlab.training.trainer import Trainer
    common = ("train.steps=5", "train.ema_decay=0.9", "train.ema_warmup=true", "log.ckpt_every=5", "eval.num_samples=0")
    Trainer(tiny_config(tmp_path, *common, "train.name=eager")).fit()
    t = Trainer(tiny_config(tmp_path, *common, "train.compile_optimizer=true", "train.name=fused"))
    stop_after(t, 2).fit()
    assert t.steps.compiled_update is not None
    graphs = compile_counts()["graphs"]
    Trainer(tiny_config(tmp_path, *common, "train.compile_optimizer=true", "train.name=fused"),
            resume=str(tmp_path / "fused")).fit()
    assert compile_counts()["graphs"] <= graphs + 1, "the decay or LR change recompiled the update"
    a, b = ckpt.load_checkpoint(tmp_path / "eager"), ckpt.load_checkpoint(tmp_path / "fused")
    for part in ("model", "ema"):
        for k, v in a[part].items():
            torch.testing.assert_close(b[part][k], v, rtol=1e-5, atol=1e-6, msg=f"{part}.{k}")


def test_compiled_update_is_not_used_with_a_grad_scaler(tmp_path):
    """fp16's GradScaler reads found-inf on the host inside its step: that run keeps the separate compiled step."""
    from genlab.training.trainer import Trainer
    t = Trainer(tiny_config(tmp_path, "train.compile_optimizer=true", "train.precision=fp16", "train.device=cpu"))
    t._setup()
    assert t.steps.scaler.is_enabled() and t.steps.compiled_update is None


def test_compiled_update_ema_reads_nothing_back_to_the_host_even_run_eagerly():
    """The EMA half of the compiled update (CompiledUpdate._update) run eagerly, as where dynamo falls back: no aten op
    in it reads a device value back to the host (`_local_scalar_dense`, a host sync on CUDA; foreach lerp with a 0-d
    weight does one), and the EMA equals ema + (1 - decay)(p - ema) in float64."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from genlab.runtime.switches import CompiledUpdate

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(0)
    params = [torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(7, generator=g, dtype=torch.float64)]
    ema = [p + torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params]
    update = CompiledUpdate([], ema, params, SimpleNamespace(compile_mode="default"), torch.device("cpu"))
    update.weight.fill_(0.1)
    w = float(update.weight)  # the weight is float32: the reference uses its exact value
    want = [e + w * (p - e) for e, p in zip(ema, params)]
    with Ops() as ops:
        update._update()
    assert ops.names and not [n for n in ops.names if "_local_scalar_dense" in n or "item" in n], ops.names
    for e, w in zip(ema, want):
        torch.testing.assert_close(e, w, rtol=1e-12, atol=1e-12)


def test_compiled_update_traces_optimizer_and_ema_without_a_graph_break(one_thread):
    """torch's Optimizer.step wrapper inserts torch._dynamo.graph_break(); called in the update's loop it made dynamo
    skip the whole update (eager, seen on the GPU in session 21). The update calls the undecorated step: no graph break,
    and the weights and EMA equal an eager AdamW step + EMA in float64 arithmetic order (same inputs)."""
    from torch._dynamo.utils import counters

    from genlab.runtime.switches import CompiledUpdate, compile_optimizer_step
    torch._dynamo.reset()
    counters.clear()
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 3, generator=g))
    ref = torch.nn.Parameter(w.detach().clone())
    opt = compile_optimizer_step(torch.optim.AdamW([w], lr=1e-2), torch.device("cpu"))
    ref_opt = torch.optim.AdamW([ref], lr=1e-2)
    ema, ref_ema = [w.detach().clone()], [ref.detach().clone()]
    update = CompiledUpdate([opt], ema, [w], SimpleNamespace(compile_mode="default"), torch.device("cpu"))
    for _ in range(3):
        grad = torch.randn(4, 3, generator=g)
        w.grad, ref.grad = grad.clone(), grad.clone()
        update(0.9)
        ref_opt.step()
        with torch.no_grad():
            ref_ema[0].lerp_(ref, 1 - 0.9)
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    torch.testing.assert_close(w.detach(), ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ema[0], ref_ema[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode,expect", [("default", None), ("reduce-overhead", None),
                                         ("max-autotune", "max-autotune-no-cudagraphs"),
                                         ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs")])
def test_compiled_update_never_compiles_into_cuda_graphs(monkeypatch, mode, expect):
    """A CUDA-graphed update after the model's CUDA graphs failed at step 0 on the GPU (its gradients counted as
    overwritten graph outputs, pytorch#160281): the update takes the run's mode minus CUDA graphs."""
    from genlab.runtime import switches
    seen = []
    monkeypatch.setattr(switches.torch, "compile", lambda fn, **kw: seen.append(kw.get("mode")) or fn)
    switches.CompiledUpdate([], None, [], SimpleNamespace(compile_mode=mode), torch.device("cpu"))
    assert seen == [expect]
