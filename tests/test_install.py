"""genlab as an installed tool: a built wheel carries the presets and sweep files and works from any folder."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from conftest import REPO, run_cli


def test_list_shows_presets_and_shipped_sweeps_from_another_folder(tmp_path):
    r = run_cli("list", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    presets = r.stdout.split("presets:\n")[1].split("sweeps")[0].split()
    sweeps = r.stdout.split("sweeps (genlab sweep NAME):\n")[1].split()
    assert "digits_flow" in presets and "gpt2_124m" in presets
    assert {"tiny_cpu", "dtype", "all_axes"} <= set(sweeps)


def test_version_flag_prints_the_package_version():
    from genlab import __version__
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"genlab {__version__}"


@pytest.mark.slow
def test_wheel_ships_presets_and_sweeps_and_runs_outside_the_source_tree(tmp_path):
    wheels, target, src = tmp_path / "wheels", tmp_path / "site", tmp_path / "src"
    # build from a copy: setuptools leaves build/ and *.egg-info behind, and a stale build/ would leak into wheels
    shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy(REPO / "pyproject.toml", src)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = wheels.glob("genlab-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "genlab/configs/digits_flow.toml" in names and "genlab/configs/sweeps/tiny_cpu.toml" in names
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run([sys.executable, "-c", "import genlab; print(genlab.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=60)
    assert where.stdout.startswith(str(target)), where  # the installed copy, not the source tree
    r = subprocess.run([sys.executable, "-m", "genlab", "list"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "  digits_flow\n" in r.stdout and "  tiny_cpu\n" in r.stdout
    r = subprocess.run([sys.executable, "-m", "genlab", "sweep", "tiny_cpu", "--dry-run"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "sweep tiny_cpu: preset digits_flow" in r.stdout, r.stderr
