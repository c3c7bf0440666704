"""A sharded checkpoint written by N processes resumes on fewer, with the same losses, and exports one file.

    python benchmarks/reshard_resume.py --world 4 --resume-on 2,1 --out OUT [PRESET] [key=value ...]

1. `genlab train` on `--world` processes (train.parallel=fsdp) for `--steps` steps, a DCP checkpoint at `--at`.
2. For each world W of `--resume-on`: a copy of that run cut back to step `--at` (later checkpoints and metrics
   removed) resumed on W processes (fsdp; W=1: one process, train.parallel=none) to `--steps`.
3. The losses of steps at+1..steps against the written run's, and `genlab export` of the written run: its
   model.safetensors against the DCP checkpoint's full weights.

The default, GPT-2 124M on synthetic tokens in fp32, has no noise in its loss and a data order that does not depend
on the number of ranks (each rank takes its slice of one global draw), so the resumed losses follow the written run's
up to float summation order. A diffusion run also resumes on any world size, but its per-rank noise streams are
exact only on the same world size. On GPUs, process r of a W-process run sees GPU r (CUDA_VISIBLE_DEVICES).
Writes OUT/reshard.md (a table) and OUT/reshard.json.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import REPO, genlab_env, report
from safetensors.torch import load_file

from genlab.core.tables import markdown_table
from genlab.runtime.dcp import load_dcp_full
from genlab.runtime.metrics import read_metrics

DEFAULT = ["gpt2_124m", "train.precision=fp32", "train.compile=off", "train.batch_size=32", "data.size=4096",
           "optim.warmup_steps=2"]


def _genlab(args: list[str], world: int, gpus: int, log: Path) -> float:
    head = [sys.executable] + (["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"] if world > 1 else [])
    env = genlab_env(**({"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(world))} if gpus else {}))
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.run(head + ["-m", "genlab", *args], env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO).returncode
    if rc != 0:
        sys.exit(f"reshard_resume: `genlab {' '.join(args[:2])}` on {world} process(es) failed (exit {rc}); see {log}")
    return time.time() - t0


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run) if "loss" in r and "step" in r}


def cut_back(src: Path, dst: Path, at: int) -> Path:
    """A copy of the run as it was at step `at`: later checkpoints, the export and later metric rows removed."""
    shutil.copytree(src, dst)
    for c in (dst / "checkpoints").iterdir():
        if c.name.startswith("step_") and int(c.name[5:13]) > at:
            shutil.rmtree(c) if c.is_dir() else c.unlink()
    for f in ("model.safetensors", "summary.json"):
        (dst / f).unlink(missing_ok=True)
    rows = [x for x in (dst / "metrics.jsonl").read_text().splitlines() if x.strip()]
    keep = [x for x in rows if json.loads(x).get("step", 0) <= at]
    (dst / "metrics.jsonl").write_text("\n".join(keep) + "\n")
    return dst / "checkpoints" / f"step_{at:08d}.dcp"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("items", nargs="*", help="preset and overrides (default: GPT-2 124M, fp32, synthetic tokens)")
    p.add_argument("--world", type=int, default=4, help="processes that write the checkpoint")
    p.add_argument("--resume-on", default="2,1", help="comma list of process counts that resume it")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--at", type=int, default=10, help="step of the checkpoint that is resumed")
    p.add_argument("--out", default="out/reshard", help="tables and logs")
    p.add_argument("--runs", default=None, help="run folders and the export (default OUT/runs): checkpoints are large")
    p.add_argument("--cpu", action="store_true", help="gloo on the CPU (a check of the code path, tiny models)")
    a = p.parse_args(argv)
    gpus = 0 if a.cpu else torch.cuda.device_count()
    worlds = [int(w) for w in a.resume_on.split(",") if w.strip()]
    if gpus and max([a.world] + worlds) > gpus:
        sys.exit(f"reshard_resume: needs {max([a.world] + worlds)} GPUs, {gpus} visible")
    out = Path(a.out).resolve()
    if out.exists():
        sys.exit(f"reshard_resume: {out} exists; pick another --out")
    runs = Path(a.runs).resolve() if a.runs else out / "runs"
    if runs.exists() and any(runs.iterdir()):
        sys.exit(f"reshard_resume: {runs} is not empty; pick another --runs")
    out.mkdir(parents=True)
    runs.mkdir(parents=True, exist_ok=True)
    items = a.items or DEFAULT
    dev = ["train.device=cpu"] if a.cpu else []
    common = [*items, *dev, f"train.steps={a.steps}", "log.every=1", f"log.ckpt_every={a.at}", "log.keep_last=0",
              "log.progress=false", "log.tensorboard=false", "eval.num_samples=0", f"train.out_dir={runs}"]
    written = runs / f"w{a.world}"
    secs = _genlab(["train", *common, "train.parallel=fsdp", f"train.name={written.name}"], a.world, gpus, out / "write.log")
    ref = losses(written)
    rows = [{"run": written.name, "world": a.world, "parallel": "fsdp", "steps": f"1-{a.steps}", "seconds": secs,
             "max_abs": 0.0, "max_rel": 0.0}]
    for w in worlds:
        dst = runs / f"w{a.world}_on_w{w}"
        ck = cut_back(written, dst, a.at)
        par = "fsdp" if w > 1 else "none"
        secs = _genlab(["train", "--resume", str(ck), f"train.parallel={par}", *dev], w, gpus, out / f"resume_w{w}.log")
        got = losses(dst)
        steps = sorted(s for s in got if s > a.at)
        if steps != list(range(a.at + 1, a.steps + 1)):
            sys.exit(f"reshard_resume: the resumed run logged steps {steps}, expected {a.at + 1}..{a.steps}")
        diffs = [abs(got[s] - ref[s]) for s in steps]
        rows.append({"run": dst.name, "world": w, "parallel": par, "steps": f"{a.at + 1}-{a.steps}", "seconds": secs,
                     "max_abs": max(diffs), "max_rel": max(d / abs(ref[s]) for d, s in zip(diffs, steps)),
                     "losses": [got[s] for s in steps]})
    # one consolidated file from the sharded checkpoint, equal to its full weights
    exp = runs / "export"
    secs = _genlab(["export", str(written), "--out", str(exp), "--no-ema"], 1, gpus, out / "export.log")
    full = load_dcp_full(sorted((written / "checkpoints").glob("step_*.dcp"))[-1])["model"]
    st = load_file(str(exp / "model.safetensors"))
    # a tied weight (GPT head = embedding) is stored once in the file and tied again on load
    worst = max((st[k].double() - v.double()).abs().max().item() for k, v in full.items() if k in st)
    export = {"seconds": secs, "tensors": len(st), "bytes": (exp / "model.safetensors").stat().st_size,
              "max_abs_vs_dcp": worst, "same_keys": set(st) == set(full),
              "missing_in_file": sorted(set(full) - set(st))}
    res = {"world": a.world, "resume_on": worlds, "items": items, "rows": rows, "reference_losses":
           [ref[s] for s in range(a.at + 1, a.steps + 1)], "export": export,
           "device": torch.cuda.get_device_name(0) if gpus else "cpu"}
    (out / "reshard.json").write_text(json.dumps(res, indent=2))
    md = [f"Checkpoint of step {a.at} written by {a.world} processes (fsdp), resumed to step {a.steps}; "
          f"{' '.join(items)}; device {res['device']}", "",
          markdown_table(["run", "processes", "parallel", "steps", "wall s", "max abs loss diff vs written run",
                          "max rel diff"], [[r["run"], r["world"], r["parallel"], r["steps"], f"{r['seconds']:.0f}",
                                             f"{r['max_abs']:.2e}", f"{r['max_rel']:.2e}"] for r in rows])]
    md += ["", f"`genlab export` of the {a.world}-process run: model.safetensors, {export['tensors']} tensors, "
           f"{export['bytes'] / 2**20:.1f} MiB, max abs diff to the DCP checkpoint's weights {worst:.1e} "
           f"(not in the file, tied on load: {', '.join(export['missing_in_file']) or 'none'}), {secs:.0f} s"]
    report(md, out / "reshard.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
