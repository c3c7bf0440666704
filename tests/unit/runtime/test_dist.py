"""Data parallelism on CPU with gloo, launched like production (torchrun): DDP, FSDP2 and HSDP follow the
single-process trajectory on the same global batch, with and without gradient accumulation, and a DCP
checkpoint written by 2 ranks resumes on 1.

Tolerances: losses agree to 1e-5 relative; weights after 5 AdamW steps (lr 1e-2) to 1e-4 absolute
(float32 reductions in a different order, amplified a little by Adam's normalisation).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, TESTS, cli_in_process

WORKER = TESTS / "dist_worker.py"
STEPS = 5


def _env():
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO / "src") + os.pathsep + e.get("PYTHONPATH", "")
    e["OMP_NUM_THREADS"] = "1"
    return e


def launch(out, nproc, *args):
    if nproc == 1:
        cmd = [sys.executable, str(WORKER)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(WORKER)]
    r = subprocess.run(cmd + [str(out), *map(str, args)], env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(out, weights_only=False)


def launch_batch(d, nproc, runs: dict):
    """Several worker runs ({name: options}) in ONE launch on `nproc` ranks: each run trains from the same start
    in turn, so each result is what its own launch would give, without paying torchrun's and every rank's
    interpreter start-up once per run. Returns {name: result}."""
    spec = d / "runs.json"
    spec.write_text(json.dumps({k: [str(x) for x in v] for k, v in runs.items()}))
    return launch(d / "out.pt", nproc, "--batch", spec)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    d = tmp_path_factory.mktemp("two")
    got = launch_batch(d, 2, {
        "ddp-1": ["--mode", "ddp", "--steps", STEPS, "--accum", 1],
        "ddp-2": ["--mode", "ddp", "--steps", STEPS, "--accum", 2],
        "fsdp-2": ["--mode", "fsdp", "--steps", STEPS, "--accum", 2],
        "fsdp-fused": ["--mode", "fsdp", "--steps", STEPS, "--fused", "--prefetch", 1, "--keep-last", 1],
        "fsdp-ckpt": ["--mode", "fsdp", "--steps", STEPS, "--save-at", 3, "--ckpt", d / "ckpt"]})
    return got, d / "ckpt"


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, two_ranks):
    """The single-process runs, in one launch: the reference, fused AdamW, and the resume (on 1 rank) of the
    2-rank FSDP run's DCP checkpoint at step 3."""
    return launch_batch(tmp_path_factory.mktemp("one"), 1, {
        "ref": ["--mode", "none", "--steps", STEPS],
        "fused": ["--mode", "none", "--steps", STEPS, "--fused"],
        "resumed": ["--mode", "none", "--steps", STEPS, "--resume", two_ranks[1] / "step_00000003.dcp"]})


@pytest.fixture(scope="module")
def reference(one_process):
    return one_process["ref"]


def assert_same_run(got, ref):
    assert len(got["losses"]) == len(ref["losses"])
    torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(ref["losses"]), rtol=1e-5, atol=1e-6)
    for k, v in ref["model"].items():
        torch.testing.assert_close(got["model"][k], v, rtol=0, atol=1e-4, msg=f"weight {k}")
    for k, v in ref["ema"].items():
        torch.testing.assert_close(got["ema"][k], v, rtol=0, atol=1e-4, msg=f"ema {k}")


@pytest.mark.slow  # its fixture (one rank, 9 s) serves the multi-rank tests, all slow
def test_reference_trains(reference):
    assert reference["losses"][-1] < reference["losses"][0]


@pytest.mark.slow  # torchrun: the 2-rank and 1-rank launches of the module's fixtures (~10 s)
@pytest.mark.parametrize("mode,accum", [("ddp", 1), ("ddp", 2), ("fsdp", 2)])
def test_two_ranks_match_one_process(two_ranks, reference, mode, accum):
    got = two_ranks[0][f"{mode}-{accum}"]
    assert got["world"] == 2
    assert_same_run(got, reference)


@pytest.mark.slow  # the 2-rank torchrun fixture
def test_fsdp_with_fused_adamw_prefetch_and_unsharded_last_block_matches_one_process(two_ranks, reference):
    """The FSDP2 speed switches change no numbers: fused AdamW on DTensor shards, explicit prefetch, last block
    kept unsharded after the forward (and the clip on local shards with one all-reduce)."""
    got = two_ranks[0]["fsdp-fused"]
    assert_same_run(got, reference)
    torch.testing.assert_close(torch.tensor(got["gnorms"]), torch.tensor(reference["gnorms"]), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # the worker launches of the module's fixtures
def test_fused_adamw_single_process_matches_foreach(one_process, reference):
    got = one_process["fused"]
    assert_same_run(got, reference)


@pytest.mark.slow  # the 2-rank torchrun fixture
def test_fsdp_matches_and_dcp_checkpoint_resumes_on_one_rank(two_ranks, one_process, reference):
    got, ck = two_ranks[0]["fsdp-ckpt"], two_ranks[1]
    assert got["mesh"] == [2]
    assert_same_run(got, reference)
    dcp_dir = ck / "step_00000003.dcp"
    assert (dcp_dir / ".metadata").exists() and (dcp_dir / "meta.pt").exists()
    assert not list(ck.glob(".*.tmp"))
    resumed = one_process["resumed"]  # `--resume dcp_dir` in the single-process launch
    # the 1-process continuation (steps 3, 4) equals the uninterrupted run's last two steps
    torch.testing.assert_close(torch.tensor(resumed["losses"]), torch.tensor(reference["losses"][3:]), rtol=1e-5, atol=1e-6)
    for k, v in reference["model"].items():
        torch.testing.assert_close(resumed["model"][k], v, rtol=0, atol=1e-4)


@pytest.mark.slow
def test_hsdp_two_by_two_mesh_on_four_ranks(tmp_path, reference):
    got = launch(tmp_path / "hsdp.pt", 4, "--mode", "hsdp", "--steps", STEPS, "--replicate", 2, "--shard", 2)
    assert got["world"] == 4 and got["mesh"] == [2, 2]
    assert_same_run(got, reference)


@pytest.mark.slow
def test_trainer_fsdp_run_writes_dcp_and_export_that_sample_loads(tmp_path, capfd):
    """`genlab train` under torchrun with parallel=fsdp: DCP checkpoints, model.safetensors, then sample/eval/resume work."""
    over = ["model.dim=32", "model.depth=2", "model.heads=2", "train.batch_size=16", "train.steps=4",
            "train.parallel=fsdp", "train.device=cpu", "log.every=2", "log.progress=false", "log.tensorboard=false",
            "eval.num_samples=0", "eval.grid_per_class=1", "eval.sample_steps=2", "optim.warmup_steps=1",
            f"train.out_dir={tmp_path}", "train.name=fsdp"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "genlab", "train", *over]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("status: finished") == 1, r.stdout  # the summary comes from rank 0 only
    run = tmp_path / "fsdp"
    assert (run / "checkpoints" / "step_00000004.dcp" / "meta.pt").exists()
    assert (run / "model.safetensors").exists()
    from genlab.runtime.checkpoint import load_checkpoint
    dcp_state, exported = load_checkpoint(run), load_checkpoint(run / "model.safetensors")
    assert dcp_state["step"] == 4 and exported["step"] == 4
    for k, v in exported["model"].items():  # the export holds the EMA weights of the DCP checkpoint
        torch.testing.assert_close(v, dcp_state["ema"][k], rtol=0, atol=0)
    s = cli_in_process(capfd, "sample", str(run), "--n", "4", "--out", str(tmp_path / "grid.png"), "--device", "cpu")
    assert s.returncode == 0, s.stderr[-2000:]
    s = cli_in_process(capfd, "sample", str(run / "model.safetensors"), "--n", "4", "--out", str(tmp_path / "grid2.png"), "--device", "cpu")
    assert s.returncode == 0, s.stderr[-2000:]
    # (sample and resume run in-process: the CLI's main with this argv)
    # resume the 2-rank run in ONE process (no parallel wrapper) for two more steps
    s = cli_in_process(capfd, "train", "--resume", str(run), "train.steps=6", "train.parallel=auto")
    assert s.returncode == 0, s.stderr[-2000:]
    assert load_checkpoint(run)["step"] == 6


SPARSE_OVER = ["train.steps=4", "train.batch_size=8", "train.device=cpu", "log.every=1", "log.progress=false",
               "log.tensorboard=false", "log.ckpt_every=0", "eval.num_samples=0"]


def _run_losses(run):
    import json
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return torch.tensor([r["loss"] for r in rows if "loss" in r])


@pytest.fixture(scope="module")
def sparse_one_process(tmp_path_factory):
    from genlab.cli import main
    out = tmp_path_factory.mktemp("sparse1")  # the one-process run: `genlab train` in-process
    assert main(["train", "sparse_tiny_cpu", *SPARSE_OVER, f"train.out_dir={out}", "train.parallel=none", "train.name=one"]) == 0
    return out / "one"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_sparse_transformer_two_ranks_follow_the_one_process_run(tmp_path, mode, sparse_one_process):
    """The Sparse Transformer family under torchrun: 2 ranks (DDP or FSDP2) train the same trajectory as
    one process on the same global batch (image_ar draws no noise, so only the reduction order differs).
    It also pins the model's init: every rank builds it under the same seed (FSDP2 keeps each rank's shard)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "genlab", "train",
           "sparse_tiny_cpu", *SPARSE_OVER, f"train.out_dir={tmp_path}", f"train.parallel={mode}", "train.name=two"]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = _run_losses(sparse_one_process), _run_losses(tmp_path / "two")
    assert len(a) == len(b) == 4
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    from genlab.runtime.checkpoint import load_checkpoint
    w1, w2 = load_checkpoint(sparse_one_process)["model"], load_checkpoint(tmp_path / "two")
    w2 = w2["model"] if w2.get("model") else w2["ema"]
    for k, v in w1.items():
        torch.testing.assert_close(w2[k], v, rtol=0, atol=1e-4, msg=f"weight {k}")


@pytest.mark.slow
def test_reshard_resume_script_continues_the_losses_on_fewer_ranks_and_exports_the_same_weights(tmp_path):
    """benchmarks/reshard_resume.py on gloo: a DCP checkpoint written by 2 ranks resumes on 1 with the written run's
    losses (fp32, tiny GPT: summation order only), and `genlab export` of it equals the checkpoint's weights."""
    import json
    script = Path(__file__).resolve().parents[3] / "benchmarks" / "reshard_resume.py"
    cmd = [sys.executable, str(script), "--cpu", "--world", "2", "--resume-on", "1", "--steps", "4", "--at", "2",
           "--out", str(tmp_path / "out"), "--runs", str(tmp_path / "runs"), "gpt2_124m", "model.size=tiny",
           "data.seq_len=16", "data.vocab_size=50", "train.precision=fp32", "train.compile=off", "train.batch_size=4",
           "data.size=64"]
    r = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "out" / "reshard.json").read_text())
    resumed = res["rows"][1]
    assert resumed["world"] == 1 and resumed["steps"] == "3-4"
    torch.testing.assert_close(torch.tensor(resumed["losses"]), torch.tensor(res["reference_losses"]), rtol=1e-5, atol=1e-6)
    assert res["export"]["max_abs_vs_dcp"] == 0.0 and res["export"]["missing_in_file"] == ["head.weight"]
