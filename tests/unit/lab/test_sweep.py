"""`genlab sweep`: a 3-variant CPU sweep where one variant diverges, the report, resume, and sweep-file errors."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import REPO, cli_in_process, stop_after

from genlab.cli import main as genlab_main
from genlab.core.errors import GenlabError
from genlab.lab.sweep.spec import load_sweep

TINY_SWEEP = REPO / "src" / "genlab" / "configs" / "sweeps" / "tiny_cpu.toml"


def _write_sweep(tmp_path, body: str, name="s") -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(body)
    return p


BASE = TINY_SWEEP.read_text().split("[[axis]]")[0].replace('name = "tiny_cpu"', 'name = "failing"')


@pytest.mark.slow
def test_sweep_runs_records_failure_reports_and_skips_finished(tmp_path, capfd):
    # lr=1e30 makes the third variant diverge (non-finite loss) while the other two finish.
    # The sweep command runs in-process; each variant is still its own `genlab train` process.
    p = _write_sweep(tmp_path, BASE + '\n[[axis]]\nkey = "optim.lr"\nvalues = [1e-3, 3e-3, 1e30]\n')
    r = cli_in_process(capfd, "sweep", str(p), "--root", str(tmp_path / "sweeps"))
    d = tmp_path / "sweeps" / "failing"
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]  # one variant failed
    status = json.loads((d / "status.json").read_text())
    assert [status[k]["status"] for k in ("lr=0.001-s0", "lr=0.003-s0", "lr=1e+30-s0")] == ["finished", "finished", "failed"]
    assert status["lr=1e+30-s0"]["reason"].startswith("diverged")
    assert Path(status["lr=1e+30-s0"]["log"]).exists()

    # good rows carry the numbers of their own metrics.jsonl
    import csv
    rows = {row["variant"]: row for row in csv.DictReader(open(d / "results.csv"))}
    for name in ("lr=0.001", "lr=0.003"):
        recs = [json.loads(x) for x in (d / "runs" / f"{name}-s0" / "metrics.jsonl").read_text().splitlines()]
        train = [x for x in recs if "loss" in x]
        assert float(rows[name]["final_loss"]) == pytest.approx(train[-1]["loss"], rel=1e-12)
        steady = train[1:]
        assert float(rows[name]["samples_per_s"]) == pytest.approx(sum(x["samples_per_s"] for x in steady) / len(steady), rel=1e-9)
        assert float(rows[name]["loss@10"]) == pytest.approx([x for x in train if x["step"] == 10][0]["loss"], rel=1e-12)
        ev = [x for x in recs if "eval/sample_accuracy" in x][-1]
        assert float(rows[name]["sample_accuracy"]) == pytest.approx(ev["eval/sample_accuracy"])
        assert rows[name]["status"] == "finished"
    assert rows["lr=1e+30"]["status"] == "failed" and "diverged" in rows["lr=1e+30"]["reason"]
    md = (d / "report.md").read_text()
    assert "lr=1e+30" in md and "diverged" in md

    # the HTML report references every plot and sample grid, and they exist
    page = (d / "report.html").read_text()
    refs = re.findall(r'src="([^"]+)"', page)
    for f in ("loss_vs_step.png", "loss_vs_time.png", "throughput.png",
              "grids/lr=0.001.png", "grids/lr=0.003.png"):
        assert f in refs and (d / f).exists(), f
    assert "memory.png" not in refs and "No memory chart" in page  # peak memory is not measured on a CPU

    # re-running skips finished (and failed) variants: their runs are not touched
    mtimes = {k: (d / "runs" / k / "summary.json").stat().st_mtime for k in ("lr=0.001-s0", "lr=0.003-s0")}
    r = cli_in_process(capfd, "sweep", str(p), "--root", str(tmp_path / "sweeps"))
    assert "3 already done, 0 to run" in r.stdout
    assert mtimes == {k: (d / "runs" / k / "summary.json").stat().st_mtime for k in mtimes}

    # the report is rebuilt from the run folders alone: delete it and rebuild
    (d / "report.md").unlink()
    assert genlab_main(["sweep", "report", str(d)]) == 0
    assert (d / "report.md").read_text() == md

    # side by side: B is a copy of A where one run's final loss doubled and one variant is missing
    import shutil
    b = tmp_path / "other" / "failing"
    shutil.copytree(d, b)
    m = b / "runs" / "lr=0.003-s0" / "metrics.jsonl"
    recs = [json.loads(x) for x in m.read_text().splitlines()]
    last = max(i for i, x in enumerate(recs) if "loss" in x)
    recs[last]["loss"] *= 2
    m.write_text("".join(json.dumps(x) + "\n" for x in recs))
    st = json.loads((b / "status.json").read_text())
    del st["lr=0.001-s0"]
    (b / "status.json").write_text(json.dumps(st))
    capfd.readouterr()
    assert genlab_main(["sweep", "report", str(d), "--compare", str(b)]) == 0
    out = capfd.readouterr().out
    head = [c.strip() for c in out.splitlines()[2].strip("|").split("|")]
    cells = {ln.split("|")[1].strip(): [c.strip() for c in ln.strip().strip("|").split("|")] for ln in out.splitlines()[4:]}
    i = head.index("final loss B/A")
    assert cells["lr=0.003"][i] == "2.000"
    assert cells["lr=0.001"][head.index("final loss B")] == "" and cells["lr=0.001"][-1] == "absent"


@pytest.mark.slow  # trains, then the sweep resumes it in a subprocess
def test_interrupted_variant_resumes(tmp_path):
    from genlab.lab.sweep.runner import run_sweep
    p = _write_sweep(tmp_path, BASE.replace('name = "failing"', 'name = "resume"') + '\n[[axis]]\nkey = "optim.lr"\nvalues = [1e-3]\n')
    sw = load_sweep(p)
    # simulate an interrupted variant: a run stopped at step 10 with a checkpoint, no summary of a finished run
    from genlab.config.tree import load_config
    from genlab.training.trainer import Trainer
    v = sw.variants[0]
    runs = tmp_path / "sweeps" / "resume" / "runs"
    cfg = load_config(sw.preset, v.overrides + [f"train.out_dir={runs}", f"train.name={v.run_name}", "log.progress=false"])
    assert stop_after(Trainer(cfg), 10).fit()["status"] == "interrupted"
    d = run_sweep(sw, root=tmp_path / "sweeps", progress=False)
    st = json.loads((d / "status.json").read_text())[v.run_name]
    assert st["status"] == "finished" and st["resumed"] is True
    steps = [json.loads(x)["step"] for x in (runs / v.run_name / "metrics.jsonl").read_text().splitlines()]
    assert steps[:2] == [5, 10] and steps[-2] == 20  # continued from 10, not restarted


@pytest.mark.slow  # waits out a 5 s timeout per case
@pytest.mark.parametrize("by_this_run", [True, False])
def test_a_run_past_its_timeout_keeps_a_summary_it_wrote_itself(tmp_path, monkeypatch, by_this_run):
    """The timeout kills a run. One that wrote a finished summary (it was exiting) keeps its result; a finished
    summary left from before this process started does not count."""
    import sys

    from genlab.lab.sweep import runner
    p = _write_sweep(tmp_path, BASE.replace('name = "failing"', 'name = "late"') + '\n[[axis]]\nkey = "optim.lr"\nvalues = [1e-3]\n')
    sw = load_sweep(p)
    sw.timeout = 5
    v = sw.variants[0]
    d = tmp_path / "sweeps" / "late"
    run = d / "runs" / v.run_name
    (run / "checkpoints" / "step_1").mkdir(parents=True)  # a checkpoint, so the runner resumes and keeps the folder
    summary = run / "summary.json"
    write = f"import pathlib; pathlib.Path({str(summary)!r}).write_text('{{\"status\": \"finished\"}}'); "
    if not by_this_run:
        summary.write_text('{"status": "finished"}')
        write = ""
    monkeypatch.setattr(runner, "_command", lambda *a: [sys.executable, "-c", write + "import time; time.sleep(60)"])
    rec = runner.run_variant(sw, v, d)
    assert rec["status"] == ("finished" if by_this_run else "failed") and rec["seconds"] < 40, rec
    assert "timeout" in rec["reason"] and ("while exiting" in rec["reason"]) == by_this_run, rec


@pytest.mark.parametrize("axis,needle", [
    ('[[axis]]\nkey = "optim.lr"\nvalues = []\n', "is empty"),
    ('[[axis]]\nkey = "optim.learning_rate"\nvalues = [1e-3]\n', "unknown config key 'optim.learning_rate'"),
    ('[[axis]]\nkey = "train.compile"\nvalues = ["turbo"]\n', "unknown compile 'turbo'"),
    ('[[axis]]\nzip = { "model.depth" = [2, 4], "model.dim" = [32] }\n', "different lengths"),
    ('', "at least one [[axis]]"),
    ('[[axis]]\nkey = "train.seed"\nvalues = [1, 2]\n', "set by the sweep itself"),
    ('[[axis]]\nvariants = [{ name = "a", overrides = ["model.depth"] }]\n', "is not 'key=value'"),
    ('[[axis]]\nkey = "optim.lr"\nvalues = [1e-3]\nvariants = [{ name = "a" }]\n', "exactly one of"),
    ('[[axis]]\ntype = "constant_params"\ndepths = [12, 24]\nref = { depth = 12, dim = 768 }\n', "no width within 5%"),
])
def test_sweep_file_errors_fail_before_anything_runs(tmp_path, capsys, axis, needle):
    p = _write_sweep(tmp_path, BASE + "\n" + axis)
    assert genlab_main(["sweep", str(p), "--root", str(tmp_path / "sweeps")]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "sweeps").exists()


def test_unknown_sweep_key(tmp_path):
    p = _write_sweep(tmp_path, 'stepz = 3\n' + BASE + '[[axis]]\nkey = "optim.lr"\nvalues = [1e-3]\n')
    with pytest.raises(GenlabError, match="unknown sweep key"):
        load_sweep(p)


def test_grid_zip_and_variants_expand_with_seeds(tmp_path):
    p = _write_sweep(tmp_path, BASE.replace("seeds = [0]", "seeds = [0, 1]") +
                     '[[axis]]\nkey = "model.depth"\nvalues = [1, 2]\n'
                     '[[axis]]\nzip = { "optim.lr" = [1e-3, 2e-3], "optim.warmup_steps" = [1, 2] }\n'
                     '[[axis]]\nvariants = [{ name = "ema", overrides = ["train.ema_decay=0.99"] }, { name = "noema", overrides = ["train.ema_decay=0"] }]\n')
    sw = load_sweep(p)
    assert len(sw.variants) == 2 * 2 * 2 * 2
    names = {v.run_name for v in sw.variants}
    assert "depth=1-lr=0.001-warmup_steps=1-ema-s1" in names
    v = next(v for v in sw.variants if v.run_name == "depth=2-lr=0.002-warmup_steps=2-noema-s0")
    assert {"model.depth=2", "optim.lr=0.002", "optim.warmup_steps=2", "train.ema_decay=0", "train.seed=0"} <= set(v.overrides)


@pytest.mark.parametrize("head_dim,depths", [(32, [4, 8, 12, 28]), (64, [4, 6, 12, 18, 28])])  # 64: model_size.toml
def test_constant_param_sizes_match_real_parameter_counts(head_dim, depths):
    import torch

    from genlab.config.tree import ModelConfig
    from genlab.families.image_flow.dit import build_dit
    from genlab.lab.match import constant_param_dims
    spec = {"kind": "image", "image_size": 32, "channels": 4, "num_classes": 1000}

    def count(mc):  # the real DiT's parameter count (shapes only: meta device)
        with torch.device("meta"):
            return sum(p.numel() for p in build_dit(mc, spec).parameters())
    ref = count(ModelConfig(size="B"))  # DiT-B/2: depth 12, dim 768
    assert 125e6 < ref < 135e6  # DiT-B/2's published ~130M
    for depth, dim, heads, err in constant_param_dims(12, 768, depths, head_dim=head_dim):
        n = count(ModelConfig(size="B", depth=depth, dim=dim, heads=heads))
        assert (n - ref) / ref == pytest.approx(err, abs=1e-12)
        assert abs(err) < 0.05, (depth, dim, err)
        assert dim % head_dim == 0 and dim // heads == head_dim


def test_seeds_are_combined_as_mean_and_sample_std(tmp_path):
    import statistics

    from genlab.lab.sweep.report import collect, markdown_table, shown_columns
    d = tmp_path / "s"
    status = {}
    finals = {"a": [1.0, 1.5, 2.5], "b": [4.0]}
    for var, losses in finals.items():
        for seed, final in enumerate(losses):
            rn = f"{var}-s{seed}"
            run = d / "runs" / rn
            run.mkdir(parents=True)
            recs = [{"step": 5, "loss": 9.0, "samples_per_s": 1.0, "wall_time": 1.0},
                    {"step": 10, "loss": final, "samples_per_s": 10.0 * (seed + 1), "wall_time": 2.0}, {"step": 10, "eval/sample_accuracy": 0.5}]
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
            status[rn] = {"status": "finished", "variant": var, "seed": seed}
    status["b-s1"] = {"status": "failed", "variant": "b", "seed": 1, "reason": "oom: x"}
    (d / "status.json").write_text(json.dumps(status))
    rows, cols = collect(d)
    a, b = rows
    assert a["final_loss"] == pytest.approx(statistics.mean(finals["a"]))
    assert a["final_loss_std"] == pytest.approx(statistics.stdev(finals["a"]))
    assert a["samples_per_s"] == pytest.approx(20.0)  # the first interval of each run (warm-up) is left out
    assert b["final_loss"] == 4.0 and b["final_loss_std"] is None and b["status"] == "failed (1/2 seeds finished)"
    table = markdown_table(rows, shown_columns(rows, cols, ["final_loss", "sample_accuracy"]))
    assert table.splitlines()[0] == "| variant | seeds | final loss | sample_accuracy | status |"
    assert "| a | 3 | 1.667 ± 0.7638 | 50.0% ± 0.0% | finished |" in table and "failed (1/2 seeds finished): oom: x" in table


def test_parameter_counts_have_units_so_small_models_are_not_zero():
    from genlab.lab.sweep.report import format_count, markdown_table
    assert [format_count(n) for n in (7, 812, 12_345, 999_999, 4_561_234, 1_200_000_000)] == \
        ["7", "812", "12.3 k", "1 M", "4.56 M", "1.2 B"]
    rows = [{"variant": "tiny", "seeds": 1, "status": "finished", "reason": "", "params_m": 0.012345},
            {"variant": "dit_b", "seeds": 2, "status": "finished", "reason": "", "params_m": 130.5, "params_m_std": 0.0}]
    table = markdown_table(rows, ["params_m"])
    assert table.splitlines()[0] == "| variant | seeds | params | status |"
    assert "| tiny | 1 | 12.3 k | finished |" in table and "| dit_b | 2 | 130 M | finished |" in table


def _sweep_folder(d, peak_mems) -> Path:
    """A sweep folder of finished one-seed runs; peak_mems: each run's logged peak memory (None: not measured)."""
    status = {}
    for i, mem in enumerate(peak_mems):
        run = d / "runs" / f"v{i}-s0"
        run.mkdir(parents=True)
        extra = {} if mem is None else {"peak_mem_gib": mem}
        recs = [{"step": 5, "loss": 2.0, "samples_per_s": 5.0, "wall_time": 1.0, **extra},
                {"step": 10, "loss": 1.0, "samples_per_s": 6.0, "wall_time": 2.0, **extra}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        status[f"v{i}-s0"] = {"status": "finished", "variant": f"v{i}", "seed": 0}
    (d / "status.json").write_text(json.dumps(status))
    return d


def test_memory_chart_is_skipped_and_said_so_when_no_run_measured_memory(tmp_path):
    from genlab.lab.sweep.report import NO_MEMORY, write_report
    d = _sweep_folder(tmp_path / "cpu", [None, None])
    (d / "memory.png").write_bytes(b"stale")  # from an earlier rebuild
    md = write_report(d).read_text()
    page = (d / "report.html").read_text()
    assert not (d / "memory.png").exists() and "memory.png" not in md and "memory.png" not in page
    assert NO_MEMORY in md and NO_MEMORY in page and "throughput.png" in md and (d / "throughput.png").exists()
    d = _sweep_folder(tmp_path / "gpu", [None, 1.5])  # one measured figure is enough for the chart
    md = write_report(d).read_text()
    assert (d / "memory.png").exists() and "memory.png" in md and 'src="memory.png"' in (d / "report.html").read_text()
    assert NO_MEMORY not in md


def test_only_selects_variants_and_dry_run_lists_them(tmp_path, capsys):
    assert genlab_main(["sweep", str(TINY_SWEEP), "--dry-run", "--only", "lr=0.003,lr=0.01-s0"]) == 0
    out = capsys.readouterr().out
    assert "2 runs" in out and "lr=0.003-s0:" in out and "lr=0.01-s0:" in out and "lr=0.001" not in out
    assert genlab_main(["sweep", str(TINY_SWEEP), "--dry-run", "--only", "lr=42"]) == 2
    assert "no variant or stage named lr=42" in capsys.readouterr().err


def test_shipped_sweep_runs_by_name_from_any_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no configs/ folder here: the name resolves to the packaged file
    assert genlab_main(["sweep", "tiny_cpu", "--dry-run"]) == 0
    assert "sweep tiny_cpu: preset digits_flow" in capsys.readouterr().out
    assert genlab_main(["sweep", "no_such_sweep", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "sweep file 'no_such_sweep' not found" in err and "tiny_cpu" in err and "dtype" in err
    assert genlab_main(["sweep", "dtyp", "--dry-run"]) == 2
    assert "did you mean 'dtype'?" in capsys.readouterr().err


def test_command_line_overrides_shrink_every_run_and_run_stage(tmp_path):
    """`genlab sweep NAME key=value ...`: sweep keys replace the file's, config keys go last on every run and run stage."""
    from genlab.lab.sweep.runner import _command
    sw = load_sweep("tiny_cpu", ["steps=4", "seeds=0,1", "model.dim=16", "data.name=digits", "launcher=cpu"])
    assert sw.steps == 4 and sw.seeds == [0, 1] and sw.launcher == "cpu" and len(sw.variants) == 6
    for v in sw.variants:
        assert v.overrides[-3:-1] == ["model.dim=16", "data.name=digits"] and "train.steps=4" in v.overrides
        cfg, _ = sw.configs[v.name]
        assert (cfg.model.dim, cfg.train.steps, cfg.train.device) == (16, 4, "cpu")
        assert "model.dim=16" in _command(sw, v, tmp_path / "runs", resume=False)
    staged = _write_sweep(tmp_path, BASE + '[[stage]]\nname = "teacher"\npreset = "digits_flow"\noverrides = ["train.steps=50"]\n'
                                           '[[axis]]\nkey = "optim.lr"\nvalues = [1e-3]\n')
    sw = load_sweep(staged, ["train.steps=3"])
    assert sw.stages[0].overrides == ["train.steps=50", "train.steps=3"] and sw.configs["teacher"][0].train.steps == 3
    assert sw.configs["lr=0.001"][0].train.steps == 3
    named = _write_sweep(tmp_path, BASE + '[[axis]]\nvariants = [{ name = "wide", overrides = ["model.dim=64"] }, { name = "base" }]\n')
    with pytest.raises(GenlabError, match="model.dim is what this sweep's variants differ in \\(64\\)"):
        load_sweep(named, ["model.dim=16"])  # the one variant that sets it would become the other


@pytest.mark.parametrize("overrides,needle", [
    (["train.device=cuda"], 'train.device=cuda does not go with launcher = "cpu"'),
    (["launcher=torchrun", "train.device=cuda"], "train.device=cuda but no CUDA device is visible"),
    (["launcher=gpu"], 'launcher = "gpu" but no CUDA device is visible'),
    (["data.name=images", "data.path=no_such_folder"], "variant 'lr=0.001': no dataset at 'no_such_folder'"),
    (["model.dimm=16"], "command line: unknown config key 'model.dimm'"),
    (["stepz=4"], "neither a sweep key (steps, seeds, launcher, nproc, timeout) nor a config key section.key=value (did you mean 'steps'?)"),
    (["steps=0"], "steps must be a positive int"),
    (["launcher=slurm"], "unknown launcher 'slurm'; valid: cpu, gpu, per_gpu, torchrun"),
    (["optim.lr=1e-3"], "optim.lr is what this sweep's variants differ in (0.001, 0.003, 0.01); pick variants with --only"),
    (["train.seed=3"], "command line: 'train.seed=3' is set by the sweep itself"),
    (["train.precision=float8_rowwise"], "variant 'lr=0.001': float8 precision needs an SM89+/SM90 CUDA GPU"),
])
def test_dry_run_makes_every_check_the_run_makes(tmp_path, capsys, overrides, needle):
    """--dry-run exits 2 with one line where the run would fail: no device, no data, a bad key; it creates nothing."""
    if "CUDA" in needle and __import__("torch").cuda.is_available():
        pytest.skip("a GPU is visible")
    for dry in (["--dry-run"], []):
        assert genlab_main(["sweep", "tiny_cpu", *overrides, *dry, "--root", str(tmp_path / "sweeps")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "sweeps").exists()


def test_a_sweep_folder_refuses_runs_with_other_command_line_overrides(tmp_path, capsys, monkeypatch):
    """Its finished runs would be skipped as done: a re-run with other overrides would mix two sweeps in one table."""
    from genlab.lab.sweep import runner
    monkeypatch.setattr(runner, "run_variant", lambda sw, v, d, gpus=None: {"status": "finished", "log": "", "run_dir": ""})
    root = ["--root", str(tmp_path / "sweeps")]
    assert genlab_main(["sweep", "tiny_cpu", "steps=4", *root]) == 0
    assert json.loads((tmp_path / "sweeps" / "tiny_cpu" / "overrides.json").read_text()) == ["steps=4"]
    capsys.readouterr()
    for other in (["steps=5"], []):
        assert genlab_main(["sweep", "tiny_cpu", *other, "--dry-run", *root]) == 2
        assert "has runs made with the overrides [steps=4], not [" in capsys.readouterr().err
    assert genlab_main(["sweep", "tiny_cpu", "steps=4", "--dry-run", *root]) == 0


def test_gpu_launcher_without_gpu_fails_before_anything_runs(tmp_path, capsys):
    if __import__("torch").cuda.is_available():
        pytest.skip("a GPU is visible")
    p = _write_sweep(tmp_path, BASE.replace('launcher = "cpu"', 'launcher = "gpu"') + '[[axis]]\nkey = "optim.lr"\nvalues = [1e-3]\n')
    assert genlab_main(["sweep", str(p), "--root", str(tmp_path / "sweeps")]) == 2
    assert "no CUDA device is visible" in capsys.readouterr().err
    assert not (tmp_path / "sweeps").exists()


def test_runs_needing_more_gpus_are_skipped_rows_and_time_budget_leaves_runs_for_later(tmp_path):
    from genlab.lab.sweep.runner import load_status, run_sweep, todo_runs
    body = BASE.replace('launcher = "cpu"', 'launcher = "gpu"') + (
        '[[axis]]\nvariants = [{ name = "ddp4", overrides = ["train.parallel=ddp"], nproc = 4 }, '
        '{ name = "single", overrides = [] }]\n')
    sw = load_sweep(_write_sweep(tmp_path, body))
    d = run_sweep(sw, root=tmp_path / "sweeps", progress=False, max_time=0)  # no time: nothing may start
    st = load_status(d)
    assert st["ddp4-s0"]["status"] == "not_run" and st["single-s0"]["status"] == "not_run"
    assert [v.run_name for v in todo_runs(sw, d, st, retry_failed=False)] == ["ddp4-s0", "single-s0"]
    assert not (d / "runs").exists()
    sw.variants = sw.variants[:1]  # the 4-process run: recorded as skipped on a machine with fewer GPUs, not dropped
    d = run_sweep(sw, root=tmp_path / "sweeps", progress=False)
    st = load_status(d)
    assert st["ddp4-s0"]["status"] == "skipped" and st["ddp4-s0"]["reason"].startswith("needs 4 GPUs")
    md = (d / "report.md").read_text()
    assert "| ddp4 | 1 |" in md and "skipped: needs 4 GPUs" in md and "not_run: sweep time budget used up" in md


@pytest.mark.parametrize("log,rc,reason", [
    ("step 5\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n", 1, "oom: torch.OutOfMemoryError"),
    ("genlab: diverged: non-finite loss or gradient before step 10\n", 3, "diverged: genlab: diverged"),
    ("Traceback (most recent call last):\n  File x\nValueError: bad shape\n  more\n", 1, "crashed (exit 1): ValueError: bad shape"),
    ("", -9, "crashed (exit -9): no output"),
])
def test_failure_reasons(tmp_path, log, rc, reason):
    from genlab.lab.sweep.runner import failure_reason
    (tmp_path / "x.log").write_text(log)
    assert failure_reason(tmp_path / "x.log", rc).startswith(reason)


def test_resumed_history_is_one_curve():
    from genlab.runtime.metrics import train_records
    # process 1 logged steps 5, 10, 15 (checkpoint at 10) and died; process 2 resumed at 10 with a fresh clock
    recs = [{"step": 5, "loss": 3.0, "wall_time": 1.0}, {"step": 10, "loss": 2.0, "wall_time": 2.0},
            {"step": 15, "loss": 1.5, "wall_time": 3.0}, {"step": 15, "loss": 1.4, "wall_time": 0.5},
            {"step": 15, "eval/x": 1.0}, {"step": 20, "loss": 1.0, "wall_time": 1.5}]
    out = train_records(recs)
    assert [(r["step"], r["loss"], r["wall_time"], r["_warm"]) for r in out] == [
        (5, 3.0, 1.0, True), (10, 2.0, 2.0, False), (15, 1.4, 3.5, True), (20, 1.0, 4.5, False)]


def test_jobs_per_gpu_packs_runs_onto_one_gpu(tmp_path, monkeypatch):
    """--jobs-per-gpu 2 on one visible GPU: two runs at once, both on GPU 0, never a third; records say so."""
    import threading
    import time

    from genlab.lab.sweep import runner
    body = BASE.replace('launcher = "cpu"', 'launcher = "gpu"') + '[[axis]]\nkey = "optim.lr"\nvalues = [1e-3, 2e-3, 3e-3, 4e-3]\n'
    sw = load_sweep(_write_sweep(tmp_path, body))
    lock, now, seen = threading.Lock(), [0], []

    def fake_run(sw_, v, d, gpus=None):
        with lock:
            now[0] += 1
            seen.append((now[0], tuple(gpus)))
        time.sleep(0.2)
        with lock:
            now[0] -= 1
        return {"status": "finished", "log": "", "run_dir": str(d / "runs" / v.run_name)}
    monkeypatch.setattr(runner, "visible_gpus", lambda: 1)
    monkeypatch.setattr(runner, "run_variant", fake_run)
    d = runner.run_sweep(sw, root=tmp_path / "sweeps", progress=False, jobs_per_gpu=2)
    assert len(seen) == 4 and {g for _, g in seen} == {(0,)}
    assert max(n for n, _ in seen) == 2
    st = runner.load_status(d)
    assert all(st[r]["jobs_per_gpu"] == 2 and st[r]["status"] == "finished" for r in st)


def test_packed_run_out_of_memory_is_run_again_alone(tmp_path, monkeypatch):
    """--jobs-per-gpu 2: a run that fails with out-of-memory while packed runs once more after the pool,
    with nothing beside it; other failures are not retried."""
    import threading
    import time

    from genlab.lab.sweep import runner
    body = BASE.replace('launcher = "cpu"', 'launcher = "gpu"') + '[[axis]]\nkey = "optim.lr"\nvalues = [1e-3, 2e-3, 3e-3, 4e-3]\n'
    sw = load_sweep(_write_sweep(tmp_path, body))
    big, broken = sw.variants[1].run_name, sw.variants[2].run_name
    lock, running, shared, calls = threading.Lock(), set(), set(), []

    def fake_run(sw_, v, d, gpus=None):
        with lock:  # a run that overlapped another at any moment was packed (not only at its end)
            running.add(v.run_name)
            if len(running) > 1:
                shared.update(running)
            calls.append((v.run_name, len(running)))
        time.sleep(0.2)
        with lock:
            alone = v.run_name not in shared
            running.discard(v.run_name)
            shared.discard(v.run_name)
        rec = {"log": "", "run_dir": str(d / "runs" / v.run_name)}
        if v.run_name == big and not alone:
            return {**rec, "status": "failed", "reason": "oom: torch.OutOfMemoryError: CUDA out of memory"}
        if v.run_name == broken:
            return {**rec, "status": "failed", "reason": "ValueError: bad"}
        return {**rec, "status": "finished"}
    monkeypatch.setattr(runner, "visible_gpus", lambda: 1)
    monkeypatch.setattr(runner, "run_variant", fake_run)
    st = runner.load_status(runner.run_sweep(sw, root=tmp_path / "sweeps", progress=False, jobs_per_gpu=2))
    assert [n for n, _ in calls].count(big) == 2 and [n for n, _ in calls].count(broken) == 1
    assert calls[-1] == (big, 1)  # the retry ran alone, last
    assert st[big]["status"] == "finished" and st[big]["retried_alone_after"].startswith("oom")
    assert st[broken]["status"] == "failed" and "retried_alone_after" not in st[broken]


def test_jobs_per_gpu_needs_a_gpu_launcher(tmp_path, capsys):
    p = _write_sweep(tmp_path, BASE + '[[axis]]\nkey = "optim.lr"\nvalues = [1e-3]\n')
    assert genlab_main(["sweep", str(p), "--root", str(tmp_path / "sweeps"), "--jobs-per-gpu", "2"]) == 2
    assert "--jobs-per-gpu needs launcher gpu or per_gpu" in capsys.readouterr().err
    assert not (tmp_path / "sweeps").exists()


def test_report_races_each_run_to_its_fd_target_runs_final_fd_without_eval_time(tmp_path):
    """fd_target: steps and training seconds (periodic evaluations' eval_s taken out) to the final feature FD of the run
    that differs only in the first axis (data x method), same size and seed; speed-up = the target run's seconds /
    this run's; seeds that never reach it are left out of the means and counted by target_fd_reached."""
    from genlab.lab.sweep.report import collect
    d = tmp_path / "s"
    (d / "runs").mkdir(parents=True)
    (d / "sweep.toml").write_text('fd_target = { a_repa = "a_flow", b_repa = "b_flow" }\n[[axis]]\nvariants = '
                                  '[{ name = "a_flow" }, { name = "a_repa" }, { name = "b_flow" }, { name = "b_repa" }]\n'
                                  '[[axis]]\nkey = "model.size"\nvalues = ["S", "B"]\n')
    status = {}

    def run(name, fds, per_step):  # train records at steps 10, 20, 30; an evaluation of 5 s after steps 10 and 20
        recs, wall = [], 0.0
        for step, fd in zip((10, 20, 30), fds):
            wall += 10 * per_step
            recs.append({"step": step, "loss": 1.0, "wall_time": wall})
            if step < 30:
                recs.append({"step": step, "eval_s": 5.0, "eval/feature_fd": fd})
                wall += 5.0
            else:
                recs.append({"step": step, "eval/feature_fd": fd})  # the final evaluation: after training
        (d / "runs" / name).mkdir()
        (d / "runs" / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        status[name] = {"status": "finished", "variant": name[:-3], "seed": int(name[-1])}
    # every baseline (1.5 s a step) ends at its own FD, a different one per data, size and seed
    finals = {("a", "S"): (3.0, 3.2), ("a", "B"): (2.0, 2.2), ("b", "S"): (4.0, 4.2), ("b", "B"): (3.5, 3.7)}
    repa = {("a", "S"): [8.0, 7.0, 6.0], ("a", "B"): [6.0, 2.1, 1.9], ("b", "S"): [4.1, 3.0, 2.0], ("b", "B"): [9.0, 9.0, 3.6]}
    for data in ("a", "b"):
        for method in ("flow", "repa"):
            for size in ("S", "B"):
                for seed in (0, 1):
                    fds = [9.0, 5.0, finals[data, size][seed]] if method == "flow" else repa[data, size]
                    run(f"{data}_{method}-size={size}-s{seed}", fds, 1.5 if method == "flow" else 1.0)
    (d / "status.json").write_text(json.dumps(status))
    rows = {r["variant"]: r for r in collect(d)[0]}
    base = rows["a_flow-size=B"]  # its own final FD, reached at its last evaluation: 45 s of training (55 s of wall)
    assert (base["target_fd"], base["steps_to_target_fd"], base["time_to_target_fd"]) == (pytest.approx(2.1), 30, 45.0)
    assert base["speedup_to_target_fd"] == pytest.approx(1.0) and base["target_fd_reached"] == 1.0
    ab = rows["a_repa-size=B"]  # s0 races to 2.0 (step 30, 30 s), s1 to 2.2 (step 20, 20 s; 25 s of wall)
    assert (ab["target_fd"], ab["steps_to_target_fd"], ab["time_to_target_fd"]) == (pytest.approx(2.1), 25, 25.0)
    assert ab["speedup_to_target_fd"] == pytest.approx((45 / 30 + 45 / 20) / 2)
    bs = rows["b_repa-size=S"]  # s0 races to 4.0 (step 20, 20 s), s1 to 4.2 (step 10, 10 s)
    assert (bs["target_fd"], bs["steps_to_target_fd"], bs["time_to_target_fd"]) == (pytest.approx(4.1), 15, 15.0)
    assert bs["speedup_to_target_fd"] == pytest.approx((45 / 20 + 45 / 10) / 2)
    bb = rows["b_repa-size=B"]  # 3.6 reaches s0's 3.5 never, s1's 3.7 at step 30
    assert (bb["target_fd"], bb["steps_to_target_fd"], bb["time_to_target_fd"]) == (pytest.approx(3.6), 30, 30.0)
    assert bb["speedup_to_target_fd"] == pytest.approx(1.5) and bb["target_fd_reached"] == 0.5
    a_s = rows["a_repa-size=S"]
    assert a_s["target_fd"] == pytest.approx(3.1) and a_s["target_fd_reached"] == 0.0
    assert a_s["steps_to_target_fd"] is None and a_s["speedup_to_target_fd"] is None


def _race_folder(d, status_of):
    """A baseline and a variant, one seed each, evaluated every 10 steps; the variant is cut at step 20 if
    status_of says so (a timeout: status failed, its metrics.jsonl as far as it got)."""
    (d / "runs").mkdir(parents=True)
    (d / "sweep.toml").write_text('fd_target = { fast = "base" }\n[[axis]]\nvariants = [{ name = "base" }, { name = "fast" }]\n')
    fds = {"base": [5.0, 3.0, 2.0], "fast": [4.0, 1.9]}
    status = {}
    for v, vals in fds.items():
        recs = []
        for i, fd in enumerate(vals):
            recs += [{"step": 10 * (i + 1), "loss": 1.0 / (i + 1), "wall_time": 10.0 * (i + 1)},
                     {"step": 10 * (i + 1), "eval/feature_fd": fd}]
        (d / "runs" / f"{v}-s0").mkdir()
        (d / "runs" / f"{v}-s0" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        status[f"{v}-s0"] = {"variant": v, "seed": 0, **status_of(v)}
    (d / "status.json").write_text(json.dumps(status))
    return d


def test_report_partial_counts_what_unfinished_runs_logged(tmp_path, capfd):
    """A run cut by its timeout has no row by default; `--partial` averages what it logged, says to which step, and
    races it to its finished target. An unfinished target is never raced to (it has no final FD)."""
    from genlab.lab.sweep.report import collect
    cut = {"status": "failed", "reason": "timeout after 60 s"}
    d = _race_folder(tmp_path / "s", lambda v: cut if v == "fast" else {"status": "finished"})
    rows = {r["variant"]: r for r in collect(d)[0]}
    assert rows["fast"].get("final_loss") is None and rows["fast"]["status"] == "failed"
    rows = {r["variant"]: r for r in collect(d, partial=True)[0]}
    fast = rows["fast"]
    assert fast["final_loss"] == 0.5 and fast["feature_fd"] == 1.9 and "partial: 1 unfinished run(s) to step 20" in fast["reason"]
    assert (fast["target_fd"], fast["steps_to_target_fd"], fast["target_fd_reached"]) == (2.0, 20, 1.0)
    assert fast["speedup_to_target_fd"] == pytest.approx(30 / 20)
    r = cli_in_process(capfd, "sweep", "report", d, "--partial")
    assert r.returncode == 0 and "Partial (`--partial`)" in (d / "report.md").read_text()
    d2 = _race_folder(tmp_path / "s2", lambda v: cut if v == "base" else {"status": "finished"})
    for partial in (False, True):  # before, a timed-out target's last FD served as its "final" one
        fast2 = {r["variant"]: r for r in collect(d2, partial=partial)[0]}["fast"]
        assert fast2.get("target_fd") is None and fast2.get("steps_to_target_fd") is None
    r = cli_in_process(capfd, "sweep", "tiny_cpu", "--partial")
    assert r.returncode == 2 and "--partial goes with `genlab sweep report DIR --partial`" in r.stderr


def test_report_marks_the_rows_of_runs_that_stalled(tmp_path):
    """summary.json's `stalled` (training/stall.py): the report's status says so, results.csv counts the runs."""
    import csv

    from genlab.lab.sweep.report import write_report
    d = _race_folder(tmp_path / "s", lambda v: {"status": "finished"})
    (d / "runs" / "fast-s0" / "summary.json").write_text(json.dumps({"status": "finished", "stalled": True}))
    (d / "runs" / "base-s0" / "summary.json").write_text(json.dumps({"status": "finished", "stalled": False}))
    write_report(d)
    rows = {line.split("|")[1].strip(): line for line in (d / "report.md").read_text().splitlines() if line.startswith("| ")}
    assert "finished, STALLED" in rows["fast"] and "STALLED" not in rows["base"]
    with open(d / "results.csv") as f:
        assert {r["variant"]: r["stalled"] for r in csv.DictReader(f)} == {"base": "0", "fast": "1"}


def test_a_run_is_listed_as_running_before_it_starts_so_a_killed_sweep_keeps_it(tmp_path, monkeypatch):
    """A sweep killed outright (SIGKILL: no finally, no status write after the run) used to leave its runs out of
    status.json, so `sweep report --partial` could not show them. Each run is now recorded as running first."""
    from genlab.lab.sweep import runner
    from genlab.lab.sweep.report import collect
    body = BASE + '[[axis]]\nkey = "optim.lr"\nvalues = [1e-3]\n'
    sw = load_sweep(_write_sweep(tmp_path, body))

    class Killed(BaseException):  # stands for SIGKILL: nothing after it runs in the sweep
        pass

    def killed_run(sw_, v, d, gpus=None):
        on_disk = runner.load_status(d)[v.run_name]
        assert on_disk["status"] == "running" and on_disk["variant"] == v.name and on_disk["seed"] == v.seed
        run = d / "runs" / v.run_name
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": 0.7, "wall_time": 5.0}) + "\n")
        raise Killed
    monkeypatch.setattr(runner, "run_variant", killed_run)
    monkeypatch.setattr(runner, "write_report", lambda d, partial=False: None)  # the kill skips it too
    with pytest.raises(Killed):
        runner.run_sweep(sw, root=tmp_path / "sweeps", progress=False)
    d = runner.sweep_dir(sw, tmp_path / "sweeps")
    st = runner.load_status(d)
    name = sw.variants[0].run_name
    assert st[name]["status"] == "running"
    assert [v.run_name for v in runner.todo_runs(sw, d, st, retry_failed=False)] == [name]  # the next call runs it
    row = collect(d, partial=True)[0][0]
    assert row["status"] == "running" and row["final_loss"] == 0.7 and "partial: 1 unfinished run(s) to step 10" in row["reason"]
    assert collect(d)[0][0].get("final_loss") is None  # without --partial an unfinished run has no numbers


def test_report_says_which_named_metrics_no_run_recorded(tmp_path):
    from genlab.lab.sweep.report import write_report
    d = _sweep_folder(tmp_path / "s", [None])
    (d / "sweep.toml").write_text('metrics = ["final_loss", "fd"]\n[[axis]]\nvariants = [{ name = "v0" }]\n')
    md = write_report(d).read_text()
    assert "| variant | seeds | final loss | fd | status |" in md
    assert "No run recorded fd (empty columns); the sweep file's `metrics` can name: final_loss," in md
    assert "No run recorded fd" in (d / "report.html").read_text()
    (d / "sweep.toml").write_text('metrics = ["final_loss"]\n[[axis]]\nvariants = [{ name = "v0" }]\n')
    assert "No run recorded" not in write_report(d).read_text()


def test_fd_target_table_maps_each_first_axis_variant_to_its_own_target(tmp_path):
    from genlab.lab.sweep.report import reference_run
    first, table = ["a_flow", "a_repa", "b_flow", "b_repa"], {"a_repa": "a_flow", "b_repa": "b_flow"}
    assert reference_run("a_repa-size=S-s1", "a_repa-size=S", first, table) == "a_flow-size=S-s1"
    assert reference_run("b_flow-size=B-s0", "b_flow-size=B", first, table) == "b_flow-size=B-s0"  # a target: itself
    assert reference_run("a_repa-s2", "a_repa", first, "b_flow") == "b_flow-s2"
    p = tmp_path / "bad.toml"
    p.write_text('fd_target = { x = "a" }\n[[axis]]\nvariants = [{ name = "a" }, { name = "b" }]\n')
    assert genlab_main(["sweep", str(p), "--dry-run"]) == 2


@pytest.mark.parametrize("spec,want", [("2", [0, 1]), ("4", [0, 1, 2, 3]), ("0,2,3", [0, 2, 3]), ("3,1", [3, 1]), ("2,", [2])])
def test_gpus_option_picks_the_first_n_or_the_listed_gpus(spec, want):
    from genlab.lab.sweep.runner import choose_gpus
    assert choose_gpus(spec, "per_gpu", visible=4) == want


@pytest.mark.parametrize("spec,launcher,needle", [
    ("0", "per_gpu", "choose 1 to 4 GPUs"), ("5", "gpu", "choose 1 to 4 GPUs"), ("1,4", "per_gpu", "GPU 4 is not visible"),
    ("1,1", "torchrun", "GPU 1 is listed twice"), ("a", "per_gpu", "got 'a'"), ("", "per_gpu", "got ''"),
    ("1", "cpu", "--gpus needs launcher gpu, per_gpu or torchrun"),
])
def test_bad_gpus_option_is_one_line_error(spec, launcher, needle):
    from genlab.lab.sweep.runner import choose_gpus
    with pytest.raises(GenlabError, match=re.escape(needle)):
        choose_gpus(spec, launcher, visible=4)
    with pytest.raises(GenlabError, match="no CUDA device is visible"):
        choose_gpus(spec or "1", "torchrun", visible=0)


def test_gpus_option_errors_before_a_sweep_folder_exists(tmp_path, capsys, monkeypatch):
    from genlab.lab.sweep import runner
    monkeypatch.setattr(runner, "visible_gpus", lambda: 4)
    for launcher, spec, needle in [("cpu", "1", "--gpus needs launcher"), ("per_gpu", "5", "choose 1 to 4 GPUs")]:
        p = _write_sweep(tmp_path, BASE.replace('launcher = "cpu"', f'launcher = "{launcher}"') + '[[axis]]\nkey = "optim.lr"\nvalues = [1e-3]\n')
        assert genlab_main(["sweep", str(p), "--root", str(tmp_path / "sweeps"), "--gpus", spec]) == 2
        assert needle in capsys.readouterr().err
    assert not (tmp_path / "sweeps").exists()


def _fake_launch(monkeypatch, seen):
    """Replace the `genlab train` process: note its command and CUDA_VISIBLE_DEVICES, and the runs on each GPU at
    once; write a finished summary so the run counts as finished."""
    import threading
    import time

    from genlab.lab.sweep import runner
    lock, busy = threading.Lock(), {}

    def fake(cmd, log, env, timeout):
        devs = env.get("CUDA_VISIBLE_DEVICES")
        with lock:
            for g in devs.split(","):
                busy[g] = busy.get(g, 0) + 1
            seen.append((cmd, devs, dict(busy), sum(busy.values())))
        time.sleep(0.2)
        out = next(a for a in cmd if a.startswith("train.out_dir=")).split("=", 1)[1]
        name = next(a for a in cmd if a.startswith("train.name=")).split("=", 1)[1]
        (Path(out) / name).mkdir(parents=True, exist_ok=True)
        (Path(out) / name / "summary.json").write_text('{"status": "finished"}')
        with lock:
            for g in devs.split(","):
                busy[g] -= 1
        return 0, 0.2
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(runner, "visible_gpus", lambda: 4)
    monkeypatch.setattr(runner, "_genlab", fake)


def test_per_gpu_sweep_uses_only_the_chosen_gpus_one_run_each(tmp_path, monkeypatch, capsys):
    """--gpus 1,3 on a 4-GPU node, 4 single-process variants: each run sees GPU 1 or GPU 3, never two runs on one
    GPU, both GPUs busy at once; each record names its GPU."""
    seen = []
    _fake_launch(monkeypatch, seen)
    body = BASE.replace('launcher = "cpu"', 'launcher = "per_gpu"') + '[[axis]]\nkey = "optim.lr"\nvalues = [1e-3, 2e-3, 3e-3, 4e-3]\n'
    p = _write_sweep(tmp_path, body)
    assert genlab_main(["sweep", str(p), "--root", str(tmp_path / "sweeps"), "--gpus", "1,3"]) == 0
    assert len(seen) == 4 and {devs for _, devs, _, _ in seen} == {"1", "3"}
    assert max(n for _, _, busy, _ in seen for n in busy.values()) == 1
    assert max(total for _, _, _, total in seen) == 2
    st = json.loads((tmp_path / "sweeps" / "failing" / "status.json").read_text())
    assert len(st) == 4 and all(r["status"] == "finished" for r in st.values())
    assert sorted(r["gpus"] for r in st.values()) == [[1], [1], [3], [3]]


def test_gpu_launcher_runs_one_after_another_on_the_first_chosen_gpu(tmp_path, monkeypatch):
    from genlab.lab.sweep import runner
    seen = []
    _fake_launch(monkeypatch, seen)
    body = BASE.replace('launcher = "cpu"', 'launcher = "gpu"') + '[[axis]]\nkey = "optim.lr"\nvalues = [1e-3, 2e-3]\n'
    st = runner.load_status(runner.run_sweep(load_sweep(_write_sweep(tmp_path, body)), root=tmp_path / "sweeps",
                                             progress=False, gpus=[2, 0]))
    assert [devs for _, devs, _, _ in seen] == ["2", "2"] and max(t for *_, t in seen) == 1
    assert [r["gpus"] for r in st.values()] == [[2], [2]]


def test_multi_process_variants_get_the_chosen_gpus_or_are_skipped(tmp_path, monkeypatch):
    """--gpus 1,3: a 2-process variant runs under torchrun on GPUs 1 and 3 after the single runs; a 4-process one
    is skipped, saying how many GPUs were chosen."""
    from genlab.lab.sweep import runner
    seen = []
    _fake_launch(monkeypatch, seen)
    body = BASE.replace('launcher = "cpu"', 'launcher = "per_gpu"') + (
        '[[axis]]\nvariants = [{ name = "ddp2", overrides = ["train.parallel=ddp"], nproc = 2 }, '
        '{ name = "ddp4", overrides = ["train.parallel=ddp"], nproc = 4 }, { name = "a" }, { name = "b" }]\n')
    st = runner.load_status(runner.run_sweep(load_sweep(_write_sweep(tmp_path, body)), root=tmp_path / "sweeps",
                                             progress=False, gpus=[1, 3]))
    ddp = [(cmd, devs) for cmd, devs, _, _ in seen if "--nproc_per_node=2" in cmd]
    assert len(seen) == 3 and len(ddp) == 1 and ddp[0][1] == "1,3" and seen[-1][1] == "1,3"
    assert st["ddp2-s0"]["status"] == "finished" and st["ddp2-s0"]["gpus"] == [1, 3]
    assert st["ddp4-s0"]["status"] == "skipped" and st["ddp4-s0"]["reason"] == "needs 4 GPUs, 2 chosen"
    assert "gpus" not in st["ddp4-s0"]


def test_chosen_gpus_are_counted_within_our_own_cuda_visible_devices(monkeypatch):
    from genlab.lab.sweep.runner import _env
    sw = load_sweep(TINY_SWEEP)
    sw.launcher = "per_gpu"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert _env(sw, [1, 3])["CUDA_VISIBLE_DEVICES"] == "5,7"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _env(sw, [1, 3])["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert "CUDA_VISIBLE_DEVICES" not in _env(sw, None)


def test_a_second_sweep_on_a_folder_in_use_is_refused_in_one_line(tmp_path, capfd):
    """Two sweep processes on one folder would each write status.json whole and lose the other's records: the second
    is refused (exit 2, one line naming the holder) before it writes anything."""
    import fcntl
    import os
    d = tmp_path / "sweeps" / "tiny_cpu"
    d.mkdir(parents=True)
    with open(d / ".lock", "a+") as held:  # stands for a running sweep (another open file: flock conflicts)
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("4242")
        held.flush()
        r = cli_in_process(capfd, "sweep", str(TINY_SWEEP), "--root", str(tmp_path / "sweeps"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "is in use by another genlab sweep (pid 4242)" in r.stderr and "--root" in r.stderr
    assert sorted(p.name for p in d.iterdir()) == [".lock"]  # no status, no copy of the sweep file, no run
    assert os.path.exists(d / ".lock")


def test_a_killed_sweep_releases_its_folder(tmp_path):
    """The lock is the kernel's: a sweep killed outright (SIGKILL) leaves a folder the next call can take."""
    import os
    import signal
    import subprocess
    import sys

    from genlab.lab.sweep.runner import sweep_lock
    d = tmp_path / "s"
    d.mkdir()
    code = ("import sys, time; from pathlib import Path; from genlab.lab.sweep.runner import sweep_lock\n"
            "with sweep_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code, str(d)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(GenlabError, match=f"in use by another genlab sweep \\(pid {p.pid}\\)"):
            with sweep_lock(d):
                pass
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    with sweep_lock(d):  # not blocked (the lock is tried without waiting): the holder's pid is ours now
        assert (d / ".lock").read_text().strip() == str(os.getpid())


def test_a_yes_no_metric_averages_to_the_share_of_seeds_and_the_cold_start_is_read_from_the_summary(tmp_path):
    """World runs log yes/no results (rollout_beats_copy_all_steps_hH): the report shows the share of seeds for which
    it held, not an empty cell; first_step_s (the cold start) lives only in summary.json."""
    from genlab.lab.sweep.report import collect
    d = tmp_path / "s"
    status = {}
    for seed, (beats, first) in enumerate([(True, 7.5), (False, 8.5), (True, None)]):
        run = d / "runs" / f"a-s{seed}"
        run.mkdir(parents=True)
        recs = [{"step": 10, "loss": 1.0, "wall_time": 2.0}, {"step": 10, "eval/rollout_beats_copy_all_steps_h32": beats}]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        if first is not None:
            (run / "summary.json").write_text(json.dumps({"first_step_s": first}))
        status[f"a-s{seed}"] = {"status": "finished", "variant": "a", "seed": seed}
    (d / "status.json").write_text(json.dumps(status))
    (row,), cols = collect(d)
    assert row["rollout_beats_copy_all_steps_h32"] == pytest.approx(2 / 3)
    assert row["first_step_s"] == pytest.approx(8.0)  # the mean over the runs that recorded it
    assert "first_step_s" in cols
