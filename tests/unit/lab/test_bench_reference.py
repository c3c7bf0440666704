"""benchmarks/bench_reference.py: the reference's training step runs from a file named on the command line (here a
tiny stand-in with the public code's constructor interface) and reports a rate, and the table divides genlab's rate
by the reference's of the same workload."""
import dataclasses
import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks"

STAND_INS = {
    "dit": """
        import torch
        from torch import nn

        class TinyDiT(nn.Module):  # DiT's forward(x, t, y), learn_sigma's doubled output channels
            def __init__(self, input_size=32, in_channels=4, num_classes=1000):
                super().__init__()
                self.y = nn.Embedding(num_classes + 1, 8)
                self.net = nn.Linear(in_channels + 8, 2 * in_channels)

            def forward(self, x, t, y):
                h = torch.cat([x, self.y(y)[:, :, None, None].expand(-1, -1, *x.shape[2:])], 1)
                return self.net(h.movedim(1, -1)).movedim(-1, 1) * (t[:, None, None, None] / 1000)

        DiT_models = {"DiT-B/2": TinyDiT, "DiT-S/2": TinyDiT}
        """,
    "gpt": """
        from dataclasses import dataclass
        import torch
        from torch import nn
        import torch.nn.functional as F

        @dataclass
        class GPTConfig:
            block_size: int = 1024
            vocab_size: int = 50304
            n_layer: int = 12
            n_head: int = 12
            n_embd: int = 768
            dropout: float = 0.0
            bias: bool = True

        class GPT(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.wte = nn.Embedding(config.vocab_size, 8)
                self.head = nn.Linear(8, config.vocab_size, bias=False)

            def forward(self, idx, targets=None):
                logits = self.head(self.wte(idx))
                return logits, F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.view(-1))

            def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
                return torch.optim.AdamW(self.parameters(), lr=learning_rate, betas=betas, weight_decay=weight_decay)
        """,
}


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # its `from common import ...`
    spec = importlib.util.spec_from_file_location("bench_reference", BENCH / "bench_reference.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_reference", module)  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("workload", ["dit_b2", "gpt2_b32"])
def test_the_reference_step_runs_from_its_file_and_reports_a_rate(bench, tmp_path, workload):
    w = bench.tiny(bench.WORKLOADS[workload])
    path = tmp_path / "ref.py"
    path.write_text(textwrap.dedent(STAND_INS[w.family]))
    r = bench.time_reference(dataclasses.replace(w, vocab=64), path, steps=2, warmup=1, device="cpu", compile=False)
    assert r["samples_per_s"] > 0 and r["step_ms"] > 0
    assert (r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * w.seq_len)) if w.family == "gpt" else r["tokens_per_s"] is None


def test_a_missing_reference_file_is_named(bench, tmp_path):
    with pytest.raises(FileNotFoundError, match="no reference file at"):
        bench.time_reference(bench.tiny(bench.WORKLOADS["dit_b2"]), tmp_path / "nope.py", 1, 0, "cpu", compile=False)


def test_the_ratio_column_is_genlab_over_the_reference_of_the_same_workload(bench):
    def row(workload, side, rate):
        return {"workload": workload, "side": side, "code": side, "samples_per_s": rate, "tokens_per_s": None,
                "step_ms": 1e3 / rate, "mfu": 0.25, "peak_gib": 1.0}
    text = bench.table([row("dit_b2", "reference", 100.0), row("dit_b2", "genlab", 150.0),
                        row("dit_xl2", "reference", 40.0), row("dit_xl2", "genlab", 30.0)])
    lines = text.splitlines()
    assert lines[0].split("|")[-2].strip() == "genlab/reference"
    ratios = [line.split("|")[-2].strip() for line in lines[2:]]
    assert ratios == ["", "1.50x", "", "0.75x"]
    assert "25.0%" in lines[2]
