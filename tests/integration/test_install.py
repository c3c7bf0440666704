"""genlab as an installed tool: a built wheel carries the presets, sweep files and text corpus and works from any folder."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from conftest import REPO, cli_in_process


def test_list_shows_presets_and_shipped_sweeps_from_another_folder(tmp_path, capfd):
    r = cli_in_process(capfd, "list", cwd=tmp_path)  # in-process; the wheel test runs `python -m genlab list` elsewhere
    assert r.returncode == 0, r.stderr
    presets_text, sweeps_text = r.stdout.split("presets:\n")[1].split("sweeps (genlab sweep NAME):\n")
    presets = {line.split()[0]: line for line in presets_text.splitlines()}
    sweeps = {line.split()[0]: line for line in sweeps_text.splitlines()}
    assert {"digits_flow", "gpt2_124m", "text_ar"} <= set(presets) and {"tiny_cpu", "dtype", "all_axes"} <= set(sweeps)
    assert "The default run" in presets["digits_flow"] and "the tests use it" in sweeps["tiny_cpu"]  # each file's first comment


def test_version_flag_prints_the_package_version(capfd):
    from genlab import __version__
    r = cli_in_process(capfd, "--version")  # argparse prints it and exits 0 (SystemExit)
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
    assert "genlab/data/shakespeare_excerpt.txt" in names  # the embedded text corpus (data.name=text)
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
    assert "\n  digits_flow " in r.stdout and "\n  tiny_cpu " in r.stdout
    r = subprocess.run([sys.executable, "-m", "genlab", "sweep", "tiny_cpu", "--dry-run"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "sweep tiny_cpu: preset digits_flow" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-c", "from genlab.data.text import read_corpus; print(len(read_corpus()))"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "39908", r.stderr  # the excerpt's length in characters


def test_readme_and_architecture_name_every_folder():
    """The README's floor map and docs/architecture.md name every package folder (the floors and each family)."""
    text = (REPO / "README.md").read_text()
    block = text[text.index("## How it is built"):]
    block = block[:block.index("```", block.index("```") + 3)]
    arch = (REPO / "docs" / "architecture.md").read_text()
    src = REPO / "src" / "genlab"
    folders = [p.parent for p in src.glob("*/__init__.py")] + [p.parent for p in src.glob("families/*/__init__.py")]
    missing = [f"{f.name}/" for f in folders if f"{f.name}/" not in block or f"{f.name}/" not in arch]
    assert not missing, f"README floor map or docs/architecture.md lacks: {', '.join(missing)}"
