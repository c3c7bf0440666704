"""Every measured figure in README.md is a record of benchmarks/results.toml: the README shows the latest value of
its key, each record names its date, commit, device and a command that exists, and a new figure without a marker
is caught.

Markers. `<!-- r: KEY KEY:SPEC ... -->` at the end of a line covers that line; on its own line right after a code
block's closing fence it covers the whole block (a comment inside a code block would be shown). The keys are listed
in the order their figures appear, and each figure is found after the previous one."""
from __future__ import annotations

import datetime
import importlib.util
import re
import shlex
import subprocess
from decimal import Decimal

import pytest
import tomllib
from conftest import REPO

from genlab.lab.sweep.spec import load_sweep, select

README = REPO / "README.md"
RESULTS = REPO / "benchmarks" / "results.toml"
MARKER = re.compile(r"<!-- r:(.*?)-->", re.S)
FENCE = re.compile(r"^```", re.M)

# What a measured figure looks like: a number followed by a unit of time, rate, share, size or count of tests, or a
# metric's name followed by a number ("FD 0.458", "loss: 0.4148"). Config values ("batch 512", "--steps 50",
# "model.depth=12", "8×8 digits") match neither: no unit follows them, and "×" counts only when no digit follows.
NUMBER = r"(?<![\w.])\d[\d,]*(?:\.\d+)?"
UNIT = (r"\s?(?:%|×(?!\d)|(?:s|min|ms|h|img/s|samples/s|tok/s|tokens/s|TFLOP/s|MFU|dB|GiB|GB|MB|bits/dim"
        r"|tests|passed|skipped|failed)(?![\w/]))")
METRIC = rf"\b(?:FD|MFU|loss|accuracy|acc|precision|recall|floor|PSNR|perplexity)\b:?\s+(?:of\s+)?~?{NUMBER}"
MEASURED = re.compile(rf"{NUMBER}{UNIT}|{METRIC}")
# README lines (stripped) that look measured but are not; empty while the detector above stays this precise.
NOT_MEASURED: frozenset[str] = frozenset()


def _records(toml_text: str | None = None) -> dict[str, dict]:
    """The latest record of each key: the newest date, on a tie the later in the file; with its measurement's fields."""
    latest = {}
    for m in tomllib.loads(RESULTS.read_text() if toml_text is None else toml_text)["measurement"]:
        for r in m["results"]:
            rec = {**{k: v for k, v in m.items() if k != "results"}, **r}
            if r["key"] not in latest or rec["date"] >= latest[r["key"]]["date"]:
                latest[r["key"]] = rec
    return latest


def _shown(rec: dict, spec: str | None) -> str:
    # the decimal as written in the file, so 0.4135 rounds as a person would read it, not as its binary float
    return format(Decimal(str(rec["value"])), spec or rec.get("fmt", "g"))


def _markers(text: str):
    """(line number, covered span, [(key, spec)]) of each marker; the marker's own text is blanked by the caller."""
    fences = [m.start() for m in FENCE.finditer(text)]
    blocks = list(zip(fences[::2], fences[1::2]))  # (opening fence, closing fence) offsets
    for m in MARKER.finditer(text):
        line_no = text.count("\n", 0, m.start()) + 1
        line_start = text.rfind("\n", 0, m.start()) + 1
        assert not any(a < m.start() < b for a, b in blocks), f"README line {line_no}: a marker inside a code block shows"
        if text[line_start:m.start()].strip():
            span = (line_start, m.start())
        else:
            block = [(a, b) for a, b in blocks if text.find("\n", b) + 1 == line_start]
            assert block, f"README line {line_no}: a marker on its own line must follow a code block's closing fence"
            span = block[0]
        keys = [tuple(t.split(":", 1)) if ":" in t else (t, None) for t in m.group(1).split()]
        assert keys, f"README line {line_no}: an empty marker"
        yield line_no, span, keys


def _matched_spans(text: str, records: dict) -> list[tuple[int, int]]:
    found = []
    for line_no, (start, end), keys in _markers(text):
        pos = start
        for key, spec in keys:
            assert key in records, f"README line {line_no}: {key!r} is not a key of benchmarks/results.toml"
            shown = _shown(records[key], spec)
            m = re.compile(rf"(?<![\d.,]){re.escape(shown)}(?![\d]|[.,]\d)").search(text, pos, end)
            assert m, (f"README line {line_no}: {key} is {records[key]['value']} {records[key]['unit']} "
                       f"(shown as {shown!r}, {records[key]['date']}, {records[key]['commit']}), not found in order there")
            found.append(m.span())
            pos = m.end()
    return found


def _blanked(text: str) -> str:
    return MARKER.sub(lambda m: " " * len(m.group(0)), text)  # same offsets, no figures read from the markers


def test_every_marked_figure_is_the_latest_record_of_its_key_and_every_key_is_shown():
    text, records = README.read_text(), _records()
    _matched_spans(text, records)
    shown = {key for _, _, keys in _markers(text) for key, _ in keys}
    assert not set(records) - shown, f"records the README does not show: {sorted(set(records) - shown)}"


def test_the_latest_record_of_a_key_is_the_newest_then_the_last_in_the_file():
    def m(date, value):
        return (f'[[measurement]]\ndate = {date}\ncommit = "abc1234"\ndevice = "d"\ncommand = "c"\nsource = "s"\n'
                f'results = [{{ key = "k", value = {value}, unit = "s" }}]\n')
    assert _records(m("2026-11-24", 2) + m("2026-11-23", 1))["k"]["value"] == 2
    assert _records(m("2026-11-24", 2) + m("2026-11-24", 3))["k"]["value"] == 3
    assert _shown({"value": 0.4135, "fmt": ".3f"}, None) == "0.414" and _shown({"value": 0.996}, ".1%") == "99.6%"


def test_every_measured_looking_figure_in_the_readme_is_marked():
    text = README.read_text()
    marked = _matched_spans(text, _records())
    bare = []
    for m in MEASURED.finditer(_blanked(text)):
        line_start = text.rfind("\n", 0, m.start()) + 1
        line = text[line_start:text.find("\n", m.start())]
        if line.strip() not in NOT_MEASURED and not any(a < m.end() and m.start() < b for a, b in marked):
            bare.append(f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}")
    assert not bare, "measured figures without a `<!-- r: KEY -->` marker (benchmarks/results.toml): " + "; ".join(bare)


def test_the_detector_finds_measurements_and_passes_config_values():
    measured = ["took 205 s", "FD 0.458", "final loss: 0.4148", "98.75% ± 0.28", "1.6–1.8× its floor", "2.3 min",
                "412 img/s", "38% MFU", "1,121 passed", "32.1 dB"]
    config = ["batch 512", "--steps 50 --cfg 2.0", "model.depth=12", "8×8 digits", "DiT-S/4", "torch==2.13.0",
              "(500 samples vs", "4-step samples", "exit code 2", "`.[fp8]`", "1–8 network calls"]
    assert all(MEASURED.search(s) for s in measured), [s for s in measured if not MEASURED.search(s)]
    assert not [s for s in config if MEASURED.search(s)]


def _git_checkout() -> bool:
    r = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip() == "false"  # a shallow clone lacks the older commits


def test_every_record_names_its_date_commit_device_and_unit():
    git = _git_checkout()
    for m in tomllib.loads(RESULTS.read_text())["measurement"]:
        where = m.get("what", m)
        assert isinstance(m.get("date"), datetime.date), where
        assert re.fullmatch(r"[0-9a-f]{7,40}", m.get("commit", "")), where
        assert m.get("device", "").strip() and m.get("source", "").strip(), where
        if git:
            r = subprocess.run(["git", "cat-file", "-e", f"{m['commit']}^{{commit}}"], cwd=REPO, capture_output=True)
            assert r.returncode == 0, f"{where}: commit {m['commit']} is not in this repository"
        for r in m["results"]:
            assert isinstance(r["value"], (int, float)) and not isinstance(r["value"], bool), r
            assert r.get("unit", "").strip(), r
            _shown(r, None)  # a bad fmt fails here


def _check_run_py(args):
    run = _run_py()
    a, _ = run.parse(args)  # run.py's own argument parser; the rest goes to genlab sweep
    sw = load_sweep(run.suite_path(a.suite), a.set)  # the suite (a sweep file) and its --set parameters
    select(sw, [a.only] if a.only else [])  # --only names stages or parts of it


def _check_genlab(args):
    import genlab
    assert args[0] in ("train", "bench"), "only `genlab train|bench` commands are checked; add a check for another one here"
    items = [a for a in args[1:] if not a.startswith("-") and not a.isdigit()]  # bench's --steps N / --warmup N
    preset = items[0] if items and "=" not in items[0] else None
    genlab.load_config(preset, [a for a in items if "=" in a])  # the preset exists and the overrides are valid


def _check_bash(args):
    assert (REPO / args[0]).is_file(), args[0]


def _check_pytest(args):
    assert args[:2] == ["-m", "pytest"] and (REPO / "tests").is_dir(), args


def _run_py():
    loader = importlib.util.spec_from_file_location("benchmarks_run", REPO / "benchmarks" / "run.py")
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


COMMANDS = {("python", "benchmarks/run.py"): _check_run_py, ("genlab",): _check_genlab, ("bash",): _check_bash,
            ("python",): _check_pytest}


def _on_gpu(device: str) -> bool:
    return any(w in device for w in ("NVIDIA", "H100", "H200", "GPU"))


@pytest.mark.parametrize("command,gpu", sorted({(m["command"], _on_gpu(m["device"]))
                                                for m in tomllib.loads(RESULTS.read_text())["measurement"]}))
def test_every_record_names_a_command_that_runs_today(command, gpu):
    words = shlex.split(command)
    if gpu and words[:1] == ["genlab"] and not any(w.startswith("train.device=") for w in words):
        words.append("train.device=cuda")  # checked as on its GPU: a CUDA-only switch is refused on train.device=cpu
    for head, check in COMMANDS.items():  # the longest head first: run.py before any python
        if tuple(words[:len(head)]) == head:
            check(words[len(head):])
            return
    pytest.fail(f"{command!r}: not a `python benchmarks/run.py`, `genlab`, `bash FILE` or `python -m pytest` command")
