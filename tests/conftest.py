"""Shared test fixtures: a hermetic cache, the shared data folder, tiny configs."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"  # conftest, the fixtures, the plugin and the multi-process workers live here
SHARED_DATA = REPO.parent / "shared" / "data"

# tiny DiT on digits: seconds per run on 2 CPU cores
TINY = ["model.dim=32", "model.depth=2", "model.heads=2", "train.batch_size=16", "log.progress=false",
        "log.tensorboard=false", "eval.num_samples=50", "eval.sample_steps=4", "eval.grid_per_class=2",
        "eval.classifier_epochs=5", "optim.warmup_steps=5"]


@pytest.fixture(scope="session", autouse=True)
def _hermetic_cache(tmp_path_factory):
    """Classifiers and downloads are cached per test session, never in the user's home."""
    os.environ["GENLAB_CACHE"] = str(tmp_path_factory.mktemp("genlab-cache"))
    os.environ["TORCH_HOME"] = str(tmp_path_factory.mktemp("torch-home"))  # no metric weights unless a test puts them there
    for k in ("GENLAB_FID_WEIGHTS", "GENLAB_LPIPS_WEIGHTS"):
        os.environ.pop(k, None)
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    yield


@pytest.fixture
def shared_data():
    if not SHARED_DATA.exists():
        pytest.skip("../shared/data not present")
    return SHARED_DATA


def src_pythonpath() -> str:
    """This checkout's src first, then the caller's PYTHONPATH (a kernel library installed with pip --target)."""
    return os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH", "")]))


def run_under_triton_interpreter(test_file, mode: str):
    """Run `python test_file mode` with TRITON_INTERPRET=1 (the kernels on the CPU) and require its final "OK"."""
    import subprocess
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([src_pythonpath(), str(TESTS)]), OMP_NUM_THREADS="2")
    r = subprocess.run([sys.executable, str(test_file), mode], env=env, capture_output=True, text=True, timeout=600,
                       cwd=REPO)
    print(r.stdout)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("OK"), r.stdout[-3000:] + r.stderr[-3000:]


def run_cli(*args, cwd=None, env=None, timeout=600):
    """Run `python -m genlab ...` in a subprocess; returns CompletedProcess."""
    import subprocess
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO / "src") + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "genlab", *args], cwd=cwd, env=e, capture_output=True,
                          text=True, timeout=timeout)


def cli_in_process(capfd, *args, cwd=None):
    """`genlab.cli.main(args)` in this process (no ~3-8 s interpreter + torch start-up); returns a
    CompletedProcess like run_cli: the exit code main returns (or SystemExit's, for argparse errors) and
    what it wrote to stdout/stderr (file-descriptor level, so C-level writes count too)."""
    import subprocess

    from genlab.cli import main
    capfd.readouterr()
    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        try:
            rc = main([str(a) for a in args])
            rc = 0 if rc is None else rc  # as `raise SystemExit(main())` in __main__ would exit
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.chdir(old)
    got = capfd.readouterr()
    return subprocess.CompletedProcess(["genlab", *map(str, args)], rc, got.out, got.err)


def tiny_config(tmp_path, *overrides, preset="digits_flow"):
    from genlab.config.tree import load_config
    return load_config(preset, TINY + [f"train.out_dir={tmp_path}", *overrides])


def stop_after(runner, step: int):
    """A Trainer, or every member of a SeedsTrainer, stops at the end of `step` as a Ctrl-C during it would."""
    for run in getattr(runner, "runs", [runner]):
        def after_step(out, run=run, hook=run.after_step):
            hook(out)
            run.stop_requested |= run.step >= step
        run.after_step = after_step
    return runner


def straight_and_resumed(tmp_path, stop_at: int, *overrides, preset="digits_flow"):
    """The exact-resume experiment: run `full` uninterrupted; run `part`, stop it after `stop_at` steps (as
    Ctrl-C would), resume it to the end. Returns the full trainer and both runs' final checkpoints."""
    from genlab.runtime import checkpoint as ckpt
    from genlab.training.trainer import Trainer
    full = Trainer(tiny_config(tmp_path, *overrides, "train.name=full", preset=preset))
    full.fit()
    part = Trainer(tiny_config(tmp_path, *overrides, "train.name=part", preset=preset))
    s = stop_after(part, stop_at).fit()
    assert s["status"] == "interrupted" and s["step"] == stop_at
    Trainer(tiny_config(tmp_path, *overrides, "train.name=part", preset=preset), resume=str(tmp_path / "part")).fit()
    return full, ckpt.load_checkpoint(tmp_path / "full"), ckpt.load_checkpoint(tmp_path / "part")


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from intra-op threads; on a loaded 2-core machine two threads thrash."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def flow_teacher(tmp_path_factory):
    """A tiny flow run on digits (30 steps, seconds): the teacher of the few-step distillation tests."""
    from genlab.training.trainer import Trainer
    out = tmp_path_factory.mktemp("teacher")
    Trainer(tiny_config(out, "train.name=teacher", "train.steps=30", "log.every=10", "log.ckpt_every=0",
                        "eval.num_samples=0", "log.sample_every=0")).fit()
    return str(out / "teacher")


@pytest.fixture(scope="session")
def pairs_dir(flow_teacher, tmp_path_factory):
    """128 pairs of the tiny teacher (3 Heun steps, guided at its eval scale)."""
    from genlab.core import progress
    from genlab.families.few_step.generate_pairs import generate_pairs
    out = tmp_path_factory.mktemp("pairs") / "digits_pairs"
    with progress.enabled(False):
        generate_pairs(flow_teacher, out, 128, steps=3, sampler="heun", batch=64, device="cpu")
    return str(out)


def unregister(registry, name: str):
    """Remove an entry a test registered (a toy component), and bump the registry generation so the config
    classes derived from the registrations are rebuilt without its keys."""
    from genlab.core import registry as core
    registry._specs.pop(name, None)
    core.generation += 1


def write_shard_dataset(out, images, labels, classes: list, shard_size: int, source: str) -> Path:
    """uint8 images [N,H,W,C] already in memory written as a shard dataset (data/shards.py's format), atomically."""
    from genlab.data.formats import atomic_folder
    from genlab.data.shards import save_shard, shard_name, write_index
    with atomic_folder(out) as tmp:
        shards = [save_shard(tmp / shard_name(i), images[s:s + shard_size])
                  for i, s in enumerate(range(0, len(images), shard_size))]
        write_index(tmp, shards, labels, classes, images.shape[1:], shard_size, source)
    return Path(out)


def patch_everywhere(mp, module, name: str, value):
    """mp.setattr(module, name, value), and the same for every loaded genlab module that imported that object by name
    (`from module import name` binds it when the importer loads: patching only its home would miss those callers)."""
    original = getattr(module, name)
    mp.setattr(module, name, value)
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("genlab") and mod is not module and getattr(mod, name, None) is original:
            mp.setattr(mod, name, value)


def plain_context(generator: torch.Generator, step: int = 0, total_steps: int = 1, precision: str = "fp32",
                  extras: dict | None = None):
    """A StepContext outside the trainer: no EMA, the generator's device."""
    from genlab.families.base import StepContext
    return StepContext(step=step, total_steps=total_steps, generator=generator, device=torch.device(generator.device),
                       precision=precision, ema=None, extras=extras or {})


# tiny image backbones shared by the analysis and cached-sampling tests (tests/unit/lab, tests/unit/sampling)
ANALYZE_SPEC = {"kind": "image", "image_size": 8, "channels": 1, "num_classes": 4}
ANALYZE_BACKBONES = ["dit", "dit_incontext", "mmdit", "mmdit model.dual_blocks=2"]  # the last: the DiT + MMDiT hybrid


def analyze_model(name="dit", seed=0):
    """A tiny random backbone whose blocks are not the identity (adaLN-Zero starts every block at zero output)."""
    from genlab.config.tree import load_config
    from genlab.training.step import build_model_and_method
    name, *extra = name.split()
    cfg = load_config("digits_flow", TINY + ["model.depth=4", f"model.name={name}", *extra])
    model, method = build_model_and_method(cfg, ANALYZE_SPEC)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model.eval(), method


def analyze_sample(method, model, steps=3):
    return method.sample(model, torch.arange(6) % 4, steps=steps, generator=torch.Generator().manual_seed(7),
                         device="cpu")


# every way of reading a tensor back to the host (on CUDA each waits for the device): tests that a step needs none
HOST_READS = ("__bool__", "item", "__float__", "__int__", "__index__", "tolist", "cpu", "numpy")
_REAL_READS = {attr: getattr(torch.Tensor, attr) for attr in HOST_READS}


def _host_read(*args, **kwargs):
    raise AssertionError("a tensor was read back to the host (a host sync on CUDA)")


def forbid_host_reads(mp, allow: bool = False):
    """On the MonkeyPatch `mp`, make every host read of a tensor raise (allow=True: put the real ones back there)."""
    for attr in HOST_READS:
        mp.setattr(torch.Tensor, attr, _REAL_READS[attr] if allow else _host_read)


def relative_error(a, b) -> float:
    """||a - b|| / ||b|| in float64."""
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def assert_one_inductor_graph_like_eager(module, x):
    """Under bf16 autocast, `module` compiled with fullgraph is one inductor frame whose output and gradients (input
    and parameters) match the eager module's (a kernel behind custom ops must trace whole)."""
    from torch._dynamo.testing import CompileCounterWithBackend
    with torch.autocast(x.device.type, torch.bfloat16):
        eager = module(x).float().tanh()
        g_eager = torch.autograd.grad(eager.sum(), [x, *module.parameters()])
        counter = CompileCounterWithBackend("inductor")
        out = torch.compile(lambda t: module(t).float().tanh(), backend=counter, fullgraph=True)(x)
        g = torch.autograd.grad(out.sum(), [x, *module.parameters()])
    assert counter.frame_count == 1
    torch.testing.assert_close(out, eager, atol=2e-2, rtol=2e-2)
    for a, b in zip(g, g_eager):
        assert relative_error(a, b) < 1e-2


def mlp_pair(plain: str, fused: str, dim=24, hidden=96, dtype=torch.float64, device="cpu"):
    """(the `fused` MLP entry, the `plain` one) with the same weights: their state dicts share keys, so a checkpoint
    moves between the two."""
    from genlab.nn.mlp import mlp_registry
    torch.manual_seed(0)
    ref = mlp_registry.get(plain)(dim, hidden).to(device, dtype)
    m = mlp_registry.get(fused)(dim, hidden).to(device, dtype)
    m.load_state_dict(ref.state_dict())
    return m, ref


def output_and_grads(m, x, cot):
    """m(x) and the gradients of <m(x), cot> with respect to x and every parameter of m."""
    out = m(x)
    return out, torch.autograd.grad((out.float() * cot).sum(), [x, *m.parameters()])
