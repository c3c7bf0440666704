"""The benchmark suites (benchmarks/suites/*.toml) parse, name entries the driver can run, and the driver runs a
tiny CPU suite end to end."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from suite_driver import spec  # noqa: E402
from suite_driver.execute import Runner  # noqa: E402

SUITES = spec.all_suites()


def test_there_are_suites_and_no_gpu_shell_scripts_left():
    assert "perf" in SUITES and "tiny_cpu" in SUITES
    assert not list((ROOT / "benchmarks").glob("gpu_*.sh"))


@pytest.mark.parametrize("name", SUITES)
def test_suite_parses_and_names_runnable_entries(name, tmp_path):
    suite = spec.load(name, environ={})
    assert suite.description and suite.entries
    assert spec.problems(suite) == []
    runner = Runner(suite, tmp_path, "test", echo=lambda s: None)
    for entry in suite.entries:
        argv, _ = runner.command(entry, runner.values(entry), dry=True)
        assert argv and all(isinstance(a, str) and a for a in argv), entry.name
    tables_used = {e.table for e in suite.entries if e.table}
    assert tables_used <= set(suite.tables)


@pytest.mark.parametrize("name", SUITES)
def test_bench_and_train_entries_are_valid_genlab_configs(name):
    """Every `genlab bench` / `genlab train` entry's preset and overrides pass genlab's own validation (but for the
    held-out folder, which the GPU machine has and this one may not)."""
    import genlab
    for entry in spec.load(name, environ={}).entries:
        if entry.kind in ("bench", "train"):
            overrides = [a for a in entry.args[1:] if "=" in a and not a.startswith(("-", "eval.val_path="))]
            genlab.load_config(entry.args[0], overrides + ["eval.val_path="])


def test_unknown_key_kind_table_and_placeholder_are_one_line_errors(tmp_path):
    cases = {
        'nme = "x"\n': "unknown key",
        '[[entry]]\nname = "a"\nkind = "bash"\n': "kind 'bash'",
        '[[entry]]\nname = "a"\nkind = "python"\ntable = "t"\n': "not declared",
        '[[entry]]\nname = "a"\nkind = "python"\nargs = ["{NOPE}"]\n': "unknown placeholder",
    }
    for text, message in cases.items():
        p = tmp_path / "bad.toml"
        p.write_text('description = "x"\n' + text)
        with pytest.raises(spec.SuiteError, match=message):
            spec.load(str(p), environ={})


def test_placeholders_expand_to_words_conditions_and_matrix(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('description = "x"\n[params]\nA = "p q"\nB = ""\nL = "1;2"\n'
                 '[[entry]]\nname = "e{n}"\nkind = "python"\nmatrix = { n = "{L}" }\n'
                 'args = ["s.py", "{A}", "{B?--b}", "{B}", "{n=2?two}", "x={n}"]\n')
    suite = spec.load(str(p), environ={})
    assert [e.name for e in suite.entries] == ["e1", "e2"]
    assert suite.entries[0].args == ["s.py", "p", "q", "x=1"]
    assert suite.entries[1].args == ["s.py", "p", "q", "two", "x=2"]
    assert spec.load(str(p), {"B": "v"}, environ={}).entries[0].args == ["s.py", "p", "q", "--b", "v", "x=1"]
    with pytest.raises(spec.SuiteError, match="not a parameter"):
        spec.load(str(p), {"C": "1"}, environ={})


def test_only_picks_every_matrix_entry_of_a_template_by_its_bare_name(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('description = "x"\n[[entry]]\nname = "up{split}"\nkind = "python"\nmatrix = { split = ["", "_test"] }\n'
                 'args = ["s.py"]\n[[entry]]\nname = "other"\nkind = "python"\nargs = ["s.py"]\n')
    entries = spec.load(str(p), environ={}).entries
    assert [e.name for e in entries] == ["up", "up_test", "other"]
    assert [e.name for e in spec.select(entries, "up")] == ["up", "up_test"]
    assert [e.name for e in spec.select(entries, "up_test")] == ["up_test"]


@pytest.mark.slow
def test_driver_runs_the_tiny_cpu_suite_end_to_end(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--suite", "tiny_cpu", "--out", str(tmp_path),
                        "--set", "RUNS=" + str(tmp_path / "runs")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    bench, train = (tmp_path / "bench.md").read_text(), (tmp_path / "train.md").read_text()
    assert "| bench_tiny | dit-" in bench and "commit" in bench and "command: `python benchmarks/run.py" in bench
    assert "| train_tiny | finished | 2 |" in train
    assert (tmp_path / "logs.tgz").exists() and (tmp_path / "env.txt").exists()


def test_a_stopped_driver_still_writes_the_tables_of_what_ran(tmp_path):
    """SIGTERM (an outer `timeout`, a scheduler) stops the running entry and its process group, and the tables keep
    the finished rows and name the stopped one, instead of nothing."""
    import signal
    import time
    suite = tmp_path / "stop.toml"
    suite.write_text('description = "x"\n[tables.t]\ntitle = "t"\ncolumns = ["name", "status"]\n'
                     '[[entry]]\nname = "quick"\nkind = "shell"\nshell = "echo done"\ntable = "t"\n'
                     '[[entry]]\nname = "slow"\nkind = "shell"\nshell = "sleep 120"\ntable = "t"\ntimeout = 300\n')
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--suite", str(suite), "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = out / "main.log"
    deadline = time.monotonic() + 60
    while not (log.exists() and "slow: start" in log.read_text()):
        assert time.monotonic() < deadline and p.poll() is None, p.communicate()[0]
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=60) == 128 + signal.SIGTERM
    table = (out / "t.md").read_text()
    assert "quick: ok" in table and "slow: stopped (SIGTERM)" in table
