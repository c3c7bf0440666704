"""benchmarks/gpu_tests.py: a selection split over streams, one outcome per test read from each stream's pytest -v
lines, and the tests a stopped stream never reached named (what the device calls lose when a limit strikes)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_tests.py"

FAKE = '''
import time
import pytest

def test_a_pass():
    pass

def test_b_fail():
    assert 1 == 2

def test_c_skip():
    pytest.skip("no device")

def test_d_slow():
    time.sleep(120)

@pytest.mark.parametrize("x", ["p q", "r"])
def test_e_after(x):
    pass
'''


@pytest.mark.slow
def test_streams_report_each_outcome_and_what_a_stopped_stream_never_reached(tmp_path):
    (tmp_path / "test_fake_device.py").write_text(FAKE)
    out = tmp_path / "out" / "t.md"
    r = subprocess.run([sys.executable, str(SCRIPT), "--streams", "2", "--marker", "", "--limit", "8", "--out", str(out),
                        "--", str(tmp_path / "test_fake_device.py")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr  # one failed, two not reached
    text = out.read_text()
    # ids are paths from pytest's rootdir, which depends on the folders above tmp_path: compare from the file name on
    # stream 0 runs items 0, 2, 4 (a, c, e[p q]); stream 1 runs 1, 3, 5 (b, d, e[r]) and is stopped in d
    assert "| 0 (-) | 3 | 3 | 2 | 0 | 1 | - |" in text
    assert re.search(r"\| 1 \(-\) \| 3 \| 1 \| 0 \| 1 \| 0 \| \S*test_fake_device\.py::test_d_slow \|", text), text
    assert "4 of 6 tests reached; 1 failed; 2 not reached." in text
    listed = [(kind + ": " + test_id.rsplit("/", 1)[-1]) for kind, test_id in
              (line.split(": ", 1) for line in text.splitlines() if line.startswith("- "))]
    assert listed == ["- failed: test_fake_device.py::test_b_fail", "- not reached: test_fake_device.py::test_d_slow",
                      "- not reached: test_fake_device.py::test_e_after[r]"], text
    assert "test_a_pass PASSED" in (out.parent / "gpu_tests_stream0.log").read_text()
    # stream 1 was stopped before pytest's summary: the failure's traceback was printed when it happened
    assert re.search(r"test_b_fail \(call\) failed:\n.*assert 1 == 2", (out.parent / "gpu_tests_stream1.log").read_text(),
                     re.S)


@pytest.mark.slow  # two pytest streams in subprocesses (~4 s on 2 cores)
def test_a_selection_that_runs_whole_and_passes_exits_0(tmp_path):
    (tmp_path / "test_ok.py").write_text("import pytest\n\ndef test_one():\n    pass\n\n"
                                          "@pytest.mark.skip(reason='x')\ndef test_two():\n    pass\n")
    r = subprocess.run([sys.executable, str(SCRIPT), "--streams", "3", "--marker", "", "--out", str(tmp_path / "o.md"),
                        "--", str(tmp_path / "test_ok.py")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 of 2 tests reached; 0 failed; 0 not reached." in r.stdout  # 3 streams asked, 2 tests: 2 streams
    assert r.stdout.count("(-) | 1 | 1 |") == 2


ORDER = '''
import os

def test_a_sets_state():
    os.environ["GPU_TESTS_FAKE_STATE"] = "1"

def test_b_needs_a_fresh_process():
    assert "GPU_TESTS_FAKE_STATE" not in os.environ

def test_c_always_fails():
    assert 1 == 2
'''


@pytest.mark.slow  # one stream and two reruns, each a pytest subprocess (~8 s on 2 cores)
def test_retry_alone_reruns_each_failure_in_its_own_process_and_says_which_passed(tmp_path):
    """A test that fails only after another one in the same process (a compile that outran its limit on a loaded host)
    passes when rerun alone; a real failure fails again, and the exit code stays 1."""
    (tmp_path / "test_order.py").write_text(ORDER)
    r = subprocess.run([sys.executable, str(SCRIPT), "--streams", "1", "--marker", "", "--retry-alone", "100",
                        "--out", str(tmp_path / "o.md"), "--", str(tmp_path / "test_order.py")],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 1, r.stdout + r.stderr
    alone = {line.split(": ")[1].rsplit("::", 1)[-1]: line.rsplit(": ", 1)[-1]
             for line in r.stdout.splitlines() if line.startswith("- rerun alone: ")}
    assert alone == {"test_b_needs_a_fresh_process": "PASSED", "test_c_always_fails": "FAILED"}, r.stdout
    assert "3 of 3 tests reached; 2 failed; 0 not reached." in r.stdout
