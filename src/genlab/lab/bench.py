"""`genlab bench CONFIG [overrides]`: training-step speed on synthetic data of the config's shape with the trainer's
own step (training/step.py); what it measures and reports: docs/performance.md ("genlab bench").
"""
from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from genlab.config.check import batched_label, is_batched
from genlab.config.fields import dotted_of
from genlab.core.errors import GenlabError
from genlab.core.tables import markdown_table
from genlab.data import build_dataset
from genlab.data.datasets import dataset_registry
from genlab.families.models import model_registry
from genlab.runtime.metrics import peak_flops
from genlab.runtime.parallel import init_distributed, leave_distributed
from genlab.runtime.switches import build_precision, compile_counts
from genlab.training.step import TrainStep


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def data_spec_for(cfg) -> dict:
    """The data spec without materialising a dataset when it is synthetic (benches can be huge)."""
    d, spec = cfg.data, dataset_registry.spec(cfg.data.name)
    if spec.synthetic and spec.shape is not None:
        return spec.shape(d)
    return build_dataset(d).spec


class BenchStep:
    """The trainer's own step (train.step.TrainStep) on a fixed synthetic batch, with optional per-phase timing."""

    def __init__(self, cfg):
        tcfg = cfg.train
        if is_batched(cfg):  # it would time one member's step and call that the batched rate
            raise GenlabError(f"genlab bench times one run's step; time {batched_label(cfg)} with "
                              "benchmarks/batched_seeds.py")
        self.dist, self.device = init_distributed(tcfg.device)
        self.precision = build_precision(tcfg.precision, self.device)  # float8 checks the GPU here
        torch.manual_seed(tcfg.seed)
        self.spec = data_spec_for(cfg)
        micro = tcfg.batch_size // (tcfg.grad_accum * self.dist.world)
        if micro < 1:
            raise GenlabError(f"train.batch_size {tcfg.batch_size} is smaller than grad_accum x world size")
        self.train_step = TrainStep(cfg, self.spec, self.dist, self.device, self.precision)
        if self.train_step.graph_note and self.dist.is_main:  # the step `genlab train` would take, said the same way
            print(f"genlab: note: {self.train_step.graph_note}", file=sys.stderr)
        gen = torch.Generator(device=self.device).manual_seed(tcfg.seed)
        self.batch = self.train_step.method.synthetic_batch(micro, self.device, gen)
        self.n = 0

    def step(self, timer=None):
        self.train_step(self.n, lambda: self.batch, timer)
        self.n += 1


class PhaseTimer:
    """Synchronising wall-clock marks: accumulates time since the previous mark under each name."""

    def __init__(self, device):
        self.device, self.totals, self.last = device, {}, None

    def __call__(self, name):
        _sync(self.device)
        now = time.perf_counter()
        if name != "start" and self.last is not None:
            self.totals[name] = self.totals.get(name, 0.0) + now - self.last
        self.last = now


# kernel name (lower case) -> category, first match wins
_KERNEL_CATEGORIES = [
    ("communication", ("nccl",)),
    ("attention", ("flash", "fmha", "sdpa", "attention", "attn")),
    # inductor's pointwise/reduction kernels are named after the ops they fuse: a float8 cast fused next to a
    # `_scaled_mm` reads "triton_poi_fused__scaled_mm_..." but moves bytes, it multiplies nothing
    ("fused elementwise/reduction (inductor)", ("triton_poi_", "triton_red_", "triton_per_")),
    ("matmul", ("gemm", "nvjet", "cutlass", "xmma", "sm90_", "sm80_", "triton_tem", "_mm_", "matmul", "cublas")),
    ("optimizer", ("multi_tensor", "fused_adam", "foreach", "lerp")),
    ("fused elementwise/reduction (inductor)", ("triton_",)),
    ("copy/memset", ("memcpy", "memset", "copy")),
    ("eager elementwise/reduction", ("elementwise", "reduce", "norm", "softmax", "vectorized", "unrolled")),
]


def kernel_category(name: str) -> str:
    n = name.lower()
    for cat, keys in _KERNEL_CATEGORIES:
        if any(k in n for k in keys):
            return cat
    return "other"


def _event_device_us(e) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total", "device_time_total", "cuda_time_total"):
        v = getattr(e, attr, None)
        if v:
            return float(v)
    return 0.0


def _covered(spans: list[tuple[float, float]]) -> float:
    """The length of the union of the intervals."""
    total, end = 0.0, float("-inf")
    for a, z in sorted(spans):
        total += max(0.0, z - max(a, end))
        end = max(end, z)
    return total


def communication_overlap(comm: list[tuple[float, float]], compute: list[tuple[float, float]]) -> dict:
    """Time covered by communication kernels, and the part of it during which no compute kernel runs (the
    communication the step waits for). Intervals in any unit; kernels on other streams overlap freely."""
    total = _covered(comm)
    return {"comm_us": total, "exposed_us": _covered(comm + compute) - _covered(compute)}


def profile_steps(b: "BenchStep", steps: int, out_dir) -> dict:
    """torch.profiler over `steps` training steps: GPU time per kernel category and the top kernels,
    written to out_dir/profile.md (+ profile.json, trace.json.gz); returns the summary."""
    from torch.profiler import ProfilerActivity, profile
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if b.device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        wall_ms = 1e3 * _time_steps(b, steps, 1)
    kernels = {}
    spans = {"comm": [], "compute": []}  # kernel [start, end] in us: how much communication compute hides
    if b.device.type == "cuda":
        for e in prof.events():  # device-side events: one per kernel launch
            # not the GPU-side ranges of record_function / optimizer annotations, which are not kernels
            annotation = e.name.startswith(("Optimizer.", "ProfilerStep", "## ")) or "#" in e.name.split("(")[0]
            if str(getattr(e, "device_type", "")).endswith("CUDA") and not annotation:
                tr = getattr(e, "time_range", None)
                us = tr.elapsed_us() if tr is not None else _event_device_us(e)
                k = kernels.setdefault(e.name, [0.0, 0])
                k[0] += us
                k[1] += 1
                if tr is not None:
                    side = "comm" if kernel_category(e.name) == "communication" else "compute"
                    spans[side].append((tr.start, tr.end))
        if not kernels:
            for e in prof.key_averages():
                if str(getattr(e, "device_type", "")).endswith("CUDA") and _event_device_us(e) > 0:
                    kernels[e.key] = [_event_device_us(e), e.count]
    cats = {}
    for name, (us, n) in kernels.items():
        cats[kernel_category(name)] = cats.get(kernel_category(name), 0.0) + us / 1e3 / steps
    busy = sum(cats.values())
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:30]
    summary = {"steps": steps, "wall_ms_per_step": wall_ms, "gpu_busy_ms_per_step": busy,
               "categories_ms_per_step": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
               "top_kernels": [{"name": n[:160], "ms_per_step": us / 1e3 / steps, "calls_per_step": c / steps,
                                "category": kernel_category(n)} for n, (us, c) in top]}
    comm = communication_overlap(spans["comm"], spans["compute"])
    if comm["comm_us"] > 0:
        summary.update({"comm_ms_per_step": comm["comm_us"] / 1e3 / steps,
                        "comm_exposed_ms_per_step": comm["exposed_us"] / 1e3 / steps,
                        "comm_share": comm["comm_us"] / 1e3 / steps / wall_ms,
                        "comm_exposed_share": comm["exposed_us"] / 1e3 / steps / wall_ms})
    lines = [f"profile: {steps} steps, wall {wall_ms:.1f} ms/step (profiler on), GPU kernels {busy:.1f} ms/step "
             f"({100 * busy / wall_ms:.0f}% busy)", "", markdown_table(["category", "ms/step", "share of kernel time"], [
                 [c, f"{v:.2f}", f"{100 * v / max(busy, 1e-9):.1f}%"] for c, v in summary["categories_ms_per_step"].items()])]
    if "comm_ms_per_step" in summary:
        lines += ["", f"communication: {summary['comm_ms_per_step']:.2f} ms/step of kernels "
                      f"({100 * summary['comm_share']:.1f}% of the step), of which {summary['comm_exposed_ms_per_step']:.2f} ms "
                      f"({100 * summary['comm_exposed_share']:.1f}% of the step) overlaps no compute kernel"]
    lines += ["", markdown_table(["kernel", "category", "ms/step", "calls/step"], [
        [f"`{k['name'][:90]}`", k["category"], f"{k['ms_per_step']:.2f}", f"{k['calls_per_step']:.0f}"] for k in summary["top_kernels"]])]
    (out / "profile.md").write_text("\n".join(lines) + "\n")
    (out / "profile.json").write_text(json.dumps(summary, indent=2))
    trace = out / "trace.json"
    try:
        prof.export_chrome_trace(str(trace))
        with open(trace, "rb") as f, gzip.open(str(trace) + ".gz", "wb") as g:
            shutil.copyfileobj(f, g)
        trace.unlink()
    except Exception as e:  # noqa: BLE001 - the summary is what matters
        summary["trace_error"] = str(e)
    return summary


def _frame_name(fs) -> str:
    p = Path(fs.filename)
    return f"{p.parent.name}/{p.name}:{fs.lineno}"


def sync_site(stack) -> str:
    """'dir/file:line' of the Python line that made CUDA wait, and, when that line is inside a library, '<- ' the
    innermost genlab line that called it (docs/performance.md)."""
    here = _frame_name(stack[-1])
    ours = [fs for fs in stack if "/genlab/" in fs.filename.replace("\\", "/") and not fs.filename.endswith("bench.py")]
    if ours and ours[-1] is not stack[-1]:
        return f"{here} <- {_frame_name(ours[-1])}"
    return here


@contextlib.contextmanager
def recording_syncs():
    """Collect a site (`sync_site`) for every 'synchronizing' warning raised inside the block, with the call stack
    taken when the warning fires; other warnings are shown as usual."""
    import traceback
    import warnings
    sites: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def record(message, category, filename, lineno, file=None, line=None):
            # the sync itself, not set_sync_debug_mode's own "Synchronization debug mode is a prototype" warning
            if "called a synchronizing" in str(message).lower():
                # drop this hook and the warnings machinery frames: the last frame left is the caller of the op
                stack = [fs for fs in traceback.extract_stack()[:-1] if not fs.filename.endswith("warnings.py")]
                sites.append(sync_site(stack) if stack else f"{Path(filename).name}:{lineno}")
            else:
                shown(message, category, filename, lineno, file, line)
        warnings.showwarning = record
        yield sites


def count_host_syncs(b: "BenchStep") -> tuple[int | None, list[str]]:
    """Host<->device synchronisations in one step (CUDA's sync debug mode) and where they happened; None off CUDA."""
    if b.device.type != "cuda":
        return None, []
    _sync(b.device)
    with recording_syncs() as sites:
        torch.cuda.set_sync_debug_mode("warn")
        try:
            b.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    _sync(b.device)
    return len(sites), sites


def _model_label(mcfg) -> str:
    """dit-B/2 (size/patch) for image models; gpt-gpt2 for token models, which have no patch."""
    spec = model_registry.spec(mcfg.name)
    patches = "model.patch_size" in set(dotted_of(spec.keys)) | set(spec.reads)
    return f"{mcfg.name}-{mcfg.size}" + (f"/{mcfg.patch_size}" if patches else "")


@contextlib.contextmanager
def gpu_turn(lock_path):
    """Sole use of the GPU among the bench processes that share `lock_path` (an exclusive flock): they compile at
    the same time and take turns to run and time their steps. No path: no lock."""
    if not lock_path:
        yield
        return
    import fcntl
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # while waiting, leave the memory of the compile step to the process timing
    with open(lock_path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _retrying_oom(fn, patient: bool, tries: int = 60, wait_s: float = 5.0):
    """fn(); when sharing the GPU (patient), an out-of-memory error means another process holds the memory for a
    moment: free the cache, wait and run fn again."""
    for attempt in range(tries if patient else 1):
        try:
            return fn()
        except torch.OutOfMemoryError:
            if not patient or attempt == tries - 1:
                raise
            torch.cuda.empty_cache()
            time.sleep(wait_s)


def _time_steps(b, steps: int, windows: int) -> float:
    """Seconds per step: the fastest of `windows` windows of `steps` steps, each without host syncs inside."""
    best = float("inf")
    for _ in range(windows):
        _sync(b.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            b.step()
        _sync(b.device)
        best = min(best, (time.perf_counter() - t0) / steps)
    return best


def run_bench(cfg, steps: int = 20, warmup: int = 5, split_steps: int = 5, profile_dir=None, profile_steps_n: int = 5,
              turn_lock=None) -> dict:
    """turn_lock: a file shared by bench processes that run at once on one GPU. The first warm-up step (where
    torch.compile compiles) runs unlocked, in parallel with the others' compilation; the rest, timing included,
    holds the lock. The step time is then the faster of two windows, since another process's first step may
    still run on the GPU during one of them."""
    b = BenchStep(cfg)
    dev, tcfg = b.device, cfg.train
    shared, warmup_total = bool(turn_lock), warmup
    if shared and warmup > 0:
        _retrying_oom(b.step, patient=True)
        warmup -= 1

    def measure():
        # the peak spans the warm-up: a whole-step CUDA graph allocates its activations once, while capturing, and
        # its replays allocate nothing, so a peak reset after the capture would show only the persistent tensors
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        for _ in range(warmup):
            b.step()
        graphs = compile_counts()["graphs"]
        _sync(dev)
        step_s = _time_steps(b, steps, 2 if shared else 1)
        timer = PhaseTimer(dev)
        for _ in range(split_steps):
            b.step(timer)
        return graphs, step_s, timer
    with gpu_turn(turn_lock):
        turn_start = time.time()
        graphs_after_warmup, step_s, timer = _retrying_oom(measure, patient=shared, tries=5)
        split = {k: 1e3 * v / split_steps for k, v in timer.totals.items()}
        host_syncs, host_sync_sites = count_host_syncs(b)
        prof = None
        if profile_dir and b.dist.is_main:
            prof = profile_steps(b, profile_steps_n, profile_dir)
        elif profile_dir:  # the other ranks take the same steps (collectives) without a profiler
            for _ in range(profile_steps_n):
                b.step()
            _sync(dev)
        peak_mem = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None
        turn = [turn_start, time.time()]  # wall clock (epoch s) of the measured part: turns must not overlap
    leave_distributed(b.dist)
    peak = peak_flops(dev)
    flops_step = b.train_step.flops_per_sample * tcfg.batch_size / b.dist.world  # per device
    seq = b.spec.get("seq_len")
    samples_per_s, graphs = tcfg.batch_size / step_s, compile_counts()["graphs"]
    return {
        "samples_per_s": samples_per_s, "tokens_per_s": samples_per_s * seq if seq else None,
        "step_ms": 1e3 * step_s, "fwd_ms": split.get("fwd"), "bwd_ms": split.get("bwd"), "opt_ms": split.get("opt"),
        "mfu": flops_step / step_s / peak if peak else None, "flops_per_step": flops_step * b.dist.world,
        "peak_mem_gib": peak_mem,
        "recompiles": max(0, graphs - graphs_after_warmup), "graphs": graphs,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "world": b.dist.world,
        "switches": {"model": _model_label(cfg.model), "batch": tcfg.batch_size, "precision": b.precision.name,
                     **{k: getattr(tcfg, k) for k in ("compile", "activation_checkpointing", "parallel", "grad_accum")},
                     "optimizer": cfg.optim.name,
                     **{k: getattr(tcfg, k) for k in ("compiled_autograd", "compile_optimizer", "compile_mode")},
                     "graph_step": b.train_step.graphed is not None,  # auto's decision, not the key's value
                     **{k: getattr(cfg.model, k) for k in ("attention", "adaln", "ce_kernel", "mlp", "qkv_kernel", "final_kernel")}},
        "steps": steps, "warmup": warmup_total, "turn_s": turn, "host_syncs_per_step": host_syncs,
        "host_sync_sites": host_sync_sites, "profile": prof,
    }


def _fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


BENCH_HEAD = ["model", "batch", "precision", "compile", "AC", "parallel", "samples/s", "tokens/s", "step ms",
              "fwd/bwd/opt ms", "MFU", "peak GiB"]


def bench_cells(r: dict) -> list[str]:
    """One run_bench result as the cells of BENCH_HEAD (also the `bench` columns of a sweep's stage tables)."""
    s = r["switches"]
    split = "/".join(_fmt(r.get(k), ".1f") for k in ("fwd_ms", "bwd_ms", "opt_ms"))
    mfu = "n/a" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
    comp = s["compile"] + ("+autograd" if s.get("compiled_autograd") else "") + ("+optim" if s.get("compile_optimizer") else "")
    if s.get("compile_mode", "default") != "default" and s["compile"] != "off":
        comp += f" ({s['compile_mode']})"
    comp += " + step graph" if s.get("graph_step") else ""
    return [s["model"], s["batch"], s["precision"], comp, s["activation_checkpointing"], s["parallel"],
            _fmt(r.get("samples_per_s"), ".0f"), _fmt(r.get("tokens_per_s"), ".0f"), _fmt(r.get("step_ms"), ".1f"), split,
            mfu, _fmt(r.get("peak_mem_gib"), ".2f")]


def format_table(rows: list[dict]) -> str:
    """Markdown table of run_bench results."""
    return markdown_table(BENCH_HEAD, [bench_cells(r) for r in rows])
