"""benchmarks/bench_world.py --sampling: a variant's fields, its defaults, the run's own step count restored between
variants, and a malformed entry refused with exit 2 before any run loads."""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.fixture
def bench_world(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # its `from common import ...`
    spec = importlib.util.spec_from_file_location("bench_world", BENCH / "bench_world.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_variant_fields_default_and_the_runs_own_steps_come_back(bench_world):
    assert bench_world.parse_variant("0:q") == ("0", "q", "1", "0", "0")
    assert bench_world.parse_variant("1:n:2:0.1:8") == ("1", "n", "2", "0.1", "8")
    mcfg = SimpleNamespace()
    bench_world.apply_variant(mcfg, 3, *bench_world.parse_variant("1:n:2:0.1:8"))
    assert (mcfg.sample_temperature, mcfg.quantize_frames, mcfg.action_guidance, mcfg.sample_ctx_noise,
            mcfg.sample_steps) == (1.0, False, 2.0, 0.1, 8)
    bench_world.apply_variant(mcfg, 3, *bench_world.parse_variant("0:q"))
    assert (mcfg.sample_temperature, mcfg.quantize_frames, mcfg.sample_steps) == (0.0, True, 3)


@pytest.mark.parametrize("bad", ["0", "0:x", "0:q:1:0:x", "0:q:1:0:8:9"])
def test_malformed_variant_exits_2_with_one_line(bench_world, bad, capsys):
    with pytest.raises(SystemExit) as e:
        bench_world.parse_variant(bad)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and bad in err and "STEPS" in err
