"""Stop signals (runtime/stop.py): one stop that arrives twice (GNU `timeout` signals the command, then its process
group) is one request with a final checkpoint; a second Ctrl-C a while later still gives up at once; inductor's
compile workers survive a stop signalled to the whole group."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import REPO, TINY, tiny_config

from genlab.runtime import checkpoint as ckpt
from genlab.runtime.stop import SAME_REQUEST_S, StopSignals
from genlab.training.trainer import Trainer


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_signals_within_the_window_are_one_request_and_a_later_one_is_a_second():
    clock = FakeClock()
    s = StopSignals(clock)
    assert not s.is_second()  # the first
    clock.now += 64e-6
    assert not s.is_second()  # its echo through the process group
    clock.now += SAME_REQUEST_S
    assert s.is_second()  # a person's second Ctrl-C


def not_interrupted(fn, *args):
    """fn(*args), with a KeyboardInterrupt turned into this test's failure (pytest would stop the whole session)."""
    try:
        return fn(*args)
    except KeyboardInterrupt:
        pytest.fail("an echo of the first stop signal was taken for a second Ctrl-C")


def _signalled_during_step(trainer, at_step: int, gap_s: float, clock: FakeClock):
    """Make `trainer` receive SIGINT during step at_step + 1, then SIGINT again gap_s later (by its clock)."""
    step = trainer._train_step

    def signalled():
        if trainer.step == at_step:
            signal.raise_signal(signal.SIGINT)  # runs the handler before it returns
            clock.now += gap_s
            signal.raise_signal(signal.SIGINT)
        return step()
    trainer._train_step = signalled


def test_a_stop_delivered_twice_at_once_still_writes_the_final_checkpoint(tmp_path):
    clock = FakeClock()
    t = Trainer(tiny_config(tmp_path, "train.steps=50", "log.ckpt_every=0", "train.name=echo"))
    t.signals = StopSignals(clock)
    _signalled_during_step(t, 3, 1e-5, clock)
    s = not_interrupted(t.fit)
    assert s["status"] == "interrupted" and s["step"] == 4
    assert ckpt.load_checkpoint(tmp_path / "echo")["step"] == 4


def test_a_second_ctrl_c_a_while_later_stops_at_once_without_a_checkpoint(tmp_path):
    clock = FakeClock()
    t = Trainer(tiny_config(tmp_path, "train.steps=50", "log.ckpt_every=0", "train.name=twice"))
    t.signals = StopSignals(clock)
    _signalled_during_step(t, 3, 2 * SAME_REQUEST_S, clock)
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN under a shell's `cmd &`
    with pytest.raises(KeyboardInterrupt):
        t.fit()
    summary = json.loads((tmp_path / "twice" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and "second Ctrl-C" in summary["error"]
    assert not ckpt.list_checkpoints(tmp_path / "twice")
    assert signal.getsignal(signal.SIGINT) is before  # restored


def test_batched_seeds_take_an_echo_as_one_request_and_a_later_signal_as_a_second(tmp_path):
    from genlab.training.seeds import SeedsTrainer
    clock = FakeClock()
    st = SeedsTrainer(tiny_config(tmp_path, "train.seeds=1,2"))
    st.signals = StopSignals(clock)
    st._on_signal(signal.SIGINT, None)
    clock.now += 1e-5
    not_interrupted(st._on_signal, signal.SIGINT, None)  # an echo
    assert st.stop_requested and all(r.stop_requested for r in st.runs)
    clock.now += SAME_REQUEST_S
    with pytest.raises(KeyboardInterrupt):
        st._on_signal(signal.SIGINT, None)


@pytest.mark.slow  # end to end through the CLI in subprocesses
def test_sigint_to_the_run_and_then_its_process_group_saves_a_checkpoint(tmp_path):
    """What `timeout -s INT` does (the compiled MeanFlow run of issue 32 that ended on "genlab: interrupted" without a
    checkpoint): SIGINT to the process, then to its group. Sent during the step-3 preview (100 sampling steps: a second or more),
    the handler runs for each; the run must stop after the preview and save step 3."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "genlab", "train", *TINY, "train.steps=100000", "log.every=3",
                             "log.sample_every=3", "eval.sample_steps=100", "log.ckpt_every=0",
                             f"train.out_dir={tmp_path}", "train.name=grp"], env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "grp" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and '"step": 3,' in metrics.read_text()):
        time.sleep(0.02)  # logged just before the preview starts
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(0.05)  # the handler has run for the first: the case that once gave up at once
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err  # interrupted with a checkpoint (exit 130 was "genlab: interrupted")
    summary = json.loads((tmp_path / "grp" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["step"] == 3 and "error" not in summary
    assert ckpt.load_checkpoint(tmp_path / "grp")["step"] == 3


COMPILE_POOL = textwrap.dedent("""
    import os, signal, sys, torch
    got = []
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda s, f: got.append(s))  # the trainer's handlers
    from torch._inductor import async_compile
    from genlab.runtime.stop import start_compile_workers
    start_compile_workers(torch.device("cuda"))  # the pool serves CUDA runs; starting it needs no GPU
    pool = next(iter(async_compile._pool_set))
    for sig in (signal.SIGINT, signal.SIGTERM):  # in its first second: SIGINT too killed it then
        os.killpg(0, sig)
    ready = pool.submit(async_compile.AsyncCompile._get_ready).result(timeout=30)  # a dead pool never answers
    print(ready, pool.process.poll(), *sorted(got))
""")


@pytest.mark.slow  # starts inductor's worker pool (~7 s on 2 shared cores)
def test_compile_workers_survive_a_stop_signalled_to_the_process_group():
    pytest.importorskip("triton")  # torch starts the pool for Triton kernels only
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), TORCHINDUCTOR_COMPILE_THREADS="2", TORCH_WARM_POOL="1")
    r = subprocess.run([sys.executable, "-c", COMPILE_POOL], env=env, start_new_session=True, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ready", "None", "2", "15"]  # the pool answers and lives; the run got both signals
