"""The benchmark suites (benchmarks/suites/*.toml) are sweep files of stages, run by the one job engine (`genlab
sweep`, or benchmarks/run.py, which forwards to it): every suite parses with its commands and run configs checked,
the tiny_cpu suite runs end to end on a CPU, and a bad entry is a one-line error before any work."""
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from genlab.cli import main as genlab_main
from genlab.config.tree import SWEEP_DIR
from genlab.lab.sweep.spec import load_sweep, select

ROOT = Path(__file__).resolve().parents[3]
SUITE_DIR = ROOT / "benchmarks" / "suites"
SUITES = sorted(p.stem for p in SUITE_DIR.glob("*.toml"))


def test_there_are_suites_and_no_second_engine():
    assert "perf" in SUITES and "tiny_cpu" in SUITES
    assert not (ROOT / "benchmarks" / "suite_driver").exists() and not list((ROOT / "benchmarks").glob("gpu_*.sh"))


@pytest.mark.parametrize("name", SUITES)
def test_suite_parses_and_names_runnable_commands(name):
    """Every script a stage runs exists, every shipped sweep it runs too, and every `genlab bench` stage's preset and
    overrides pass genlab's own validation (run stages are checked by load_sweep itself)."""
    import genlab
    sw = load_sweep(SUITE_DIR / f"{name}.toml")
    assert sw.description and sw.stages and not sw.variants and select(sw, []).stages
    assert {st.table for st in sw.stages if st.table} <= set(sw.tables)
    for st in sw.stages:
        words = st.command
        if words[:1] == ["python"] and words[1].endswith(".py"):
            assert (ROOT / words[1]).is_file(), (st.name, words[1])
        if words[:2] == ["genlab", "sweep"] and words[2] != "report":
            assert (SWEEP_DIR / f"{words[2]}.toml").is_file(), (st.name, words[2])
        if words[:2] == ["genlab", "bench"]:
            items = [w for w in words[2:words.index("--")] if w not in ("", "{out}")] if "--" in words else words[2:]
            items = [w for w in items if not w.startswith("-") and not w.isdigit()]
            genlab.load_config(items[0], [o for o in items[1:] if "=" in o and not o.startswith("eval.val_path=")])


def _suite(tmp_path, text: str) -> str:
    p = tmp_path / "s.toml"
    p.write_text('description = "x"\n' + text)
    return str(p)


@pytest.mark.parametrize("text,args,needle", [
    ('[[stage]]\nname = "a"\ncommand = "python s.py"\nnproc_ = 2\n', [], "stage 'a': unknown key(s) nproc_; valid: "),
    ('[[stage]]\nname = "a"\ncommand = "python s.py"\ntable = "t"\n', [], "table 't' is not one of the file's [tables]"),
    ('[[stage]]\nname = "a"\ncommand = "python s.py {NOPE}"\n', [], "unknown placeholder {NOPE}"),
    ('[[stage]]\nname = "a"\ncommand = "python s.py"\ntimeout = "soon"\n', [], "timeout must be a positive number"),
    ('[[stage]]\nname = "a"\ncommand = "genlab eval {stage:b}"\n', [], "{stage:b} names no earlier stage"),
    ('[params]\nN = "1"\n[[stage]]\nname = "a"\ncommand = "python s.py {N}"\n', ["M=2"],
     "neither a sweep key (steps, seeds, launcher, nproc, timeout), a parameter of this file (N) nor a config key"),
    ('[[stage]]\nname = "a"\ncommand = "python s.py"\n', ["--only", "b"], "--only: no variant or stage named b; choices: a"),
    ('[tables.t]\ncolumn = ["name"]\n[[stage]]\nname = "a"\ncommand = "python s.py"\n', [], "[tables.t]: takes"),
])
def test_bad_entries_fail_in_one_line_before_any_work(tmp_path, capsys, text, args, needle):
    root = tmp_path / "sweeps"
    assert genlab_main(["sweep", _suite(tmp_path, text), *args, "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not root.exists()


def test_parameters_matrix_and_conditions_fill_the_commands(tmp_path):
    path = _suite(tmp_path, '[params]\nA = "p q"\nB = ""\nL = "1;2"\n'
                            '[[stage]]\nname = "e{n}"\nmatrix = { n = "{L}" }\n'
                            'command = "python s.py {A} {B?--b} {B} {n=2?two} x={n}"\n'
                            '[[stage]]\nname = "off"\ncommand = "python s.py"\nwhen = "{B}"\n')
    sw = load_sweep(path)
    assert [(s.name, s.command) for s in sw.stages] == [("e1", ["python", "s.py", "p", "q", "x=1"]),
                                                        ("e2", ["python", "s.py", "p", "q", "two", "x=2"])]
    sw = load_sweep(path, ["B=v"])
    assert sw.stages[0].command == ["python", "s.py", "p", "q", "--b", "v", "x=1"] and sw.stages[-1].name == "off"


def test_only_picks_a_template_by_its_bare_name_a_part_and_what_they_need(tmp_path):
    path = _suite(tmp_path, '[[stage]]\nname = "up{split}"\nmatrix = { split = ["", "_test"] }\ncommand = "python s.py"\n'
                            '[[stage]]\nname = "other"\ncommand = "python s.py {stage:up}"\npart = "p"\n'
                            '[[stage]]\nname = "extra"\ncommand = "python s.py"\noptional = true\n')
    names = [s.name for s in select(load_sweep(path), []).stages]
    assert names == ["up", "up_test", "other"]
    assert [s.name for s in select(load_sweep(path), ["up"]).stages] == ["up", "up_test"]
    assert [s.name for s in select(load_sweep(path), ["up_test,extra"]).stages] == ["up_test", "extra"]
    assert [s.name for s in select(load_sweep(path), ["p"]).stages] == ["up", "other"]  # and the stage it needs


def test_grouped_stages_run_at_once_and_a_stage_past_its_timeout_fails(tmp_path):
    stamp = "bash -c 'date +%s.%N > {out}/start; sleep 2; date +%s.%N > {out}/end'"
    path = _suite(tmp_path, '[tables.t]\ntitle = "t"\ncolumns = ["name", "status"]\n'
                            + "".join(f'[[stage]]\nname = "{n}"\ncommand = "{stamp}"\ngroup = "g"\ntable = "t"\n'
                                      for n in ("a", "b"))
                            + '[[stage]]\nname = "slow"\ncommand = "bash -c \'sleep 30\'"\ntimeout = 1\ntable = "t"\n')
    assert genlab_main(["sweep", path, "--root", str(tmp_path / "sw")]) == 1
    d = tmp_path / "sw" / "s"
    starts = [float((d / "stages" / n / "start").read_text()) for n in "ab"]
    ends = [float((d / "stages" / n / "end").read_text()) for n in "ab"]
    assert max(starts) < min(ends)
    report = (d / "report.md").read_text()
    assert "slow: failed: timeout after 1 s" in report and "a: finished" in report and "commit" in report


@pytest.mark.slow
def test_the_tiny_cpu_suite_runs_end_to_end(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--suite", "tiny_cpu", "--set", "STEPS=2",
                        "--root", str(tmp_path / "sw"), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = (tmp_path / "out" / "tiny_cpu.md").read_text()
    assert "| bench_tiny | dit-" in report and "commit" in report and "command-line overrides: STEPS=2" in report
    assert "| train_tiny | finished | 2 |" in report and (tmp_path / "out" / "tiny_cpu.tgz").exists()


def _stop_signals_at_default():
    """The sweep starts as from a terminal: SIGINT and SIGTERM unblocked and at their defaults, whatever this test process
    inherited (a background job ignores SIGINT; the full suite in a loaded CI run once left this test waiting)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM))
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_DFL)


@pytest.mark.slow  # a `genlab sweep` subprocess stopped by SIGTERM
def test_a_stopped_suite_still_reports_what_ran(tmp_path):
    """SIGTERM (an outer `timeout`, a scheduler) stops the running stage and its process group; the report keeps the
    finished rows and names the stopped one, and the next call runs it again."""
    path = _suite(tmp_path, '[tables.t]\ntitle = "t"\ncolumns = ["name", "status"]\n'
                            '[[stage]]\nname = "quick"\ncommand = "bash -c \'echo done\'"\ntable = "t"\n'
                            '[[stage]]\nname = "slow"\ncommand = "bash -c \'sleep 120\'"\ntable = "t"\ntimeout = 300\n')
    cmd = f"{shlex.quote(sys.executable)} -m genlab sweep {path} --root {tmp_path / 'sw'}"
    p = subprocess.Popen(shlex.split(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")}, preexec_fn=_stop_signals_at_default)
    log, deadline = tmp_path / "sw" / "s" / "logs" / "slow.log", time.monotonic() + 120
    while not log.exists():
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()[0]
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=120) == 130
    report = (tmp_path / "sw" / "s" / "report.md").read_text()
    assert "quick: finished" in report and "slow: interrupted: stopped" in report
