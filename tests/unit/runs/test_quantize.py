"""Post-training quantization (`genlab quantize`): NF4 and int8 round trips against float64 references of their
formulas, a quantized run that samples and evaluates, its folder never overwritten, one-line refusals, and the
quantization gap over a run's checkpoints."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from conftest import cli_in_process, tiny_config

# torchao's NF4 levels (QLoRA's normal quantiles, normalised to [-1, 1]), as float64
NF4_LEVELS = torch.tensor([-1.0, -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0911, 0.0, 0.0796, 0.1609, 0.2461,
                           0.3379, 0.4407, 0.5626, 0.7230, 1.0], dtype=torch.float64)


def _weights(rows, cols, seed=0):
    """Gaussian weights whose rows differ in scale by 100x, so the blocks' absmax scales differ too."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g) * torch.logspace(-2, 0, rows).unsqueeze(1)


def _linear(w):
    m = nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        m.weight.copy_(w)
    return m


def _nf4_reference(w):
    """float64 reference of NF4 with double quantization: the nearest level's code per weight, and the largest
    |dequantized - w| per weight: half the gap to the neighbouring level times the block absmax, plus the int8 error
    of that absmax (double quantization: (absmax - mean) in int8 per group of scalers, at most 1/128 of the group's
    range). Blocks of 64 in memory order."""
    from genlab.nn.ptq import NF4_BLOCK, nf4_scaler_block
    blocks = w.double().reshape(-1, NF4_BLOCK)
    absmax = blocks.abs().amax(1, keepdim=True)
    dist = (blocks.div(absmax).unsqueeze(-1) - NF4_LEVELS).abs()
    codes = dist.argmin(-1)
    near_tie = (dist.topk(2, largest=False).values.diff(dim=-1).squeeze(-1)) < 1e-6  # float32 may pick either level
    gaps = NF4_LEVELS.diff()
    half_gap = 0.5 * torch.maximum(torch.cat([gaps[:1], gaps]), torch.cat([gaps, gaps[-1:]]))[codes]
    centred = (absmax - absmax.mean()).reshape(-1, nf4_scaler_block(w.numel()))
    scale_err = (centred.abs().amax(1, keepdim=True) / 128).expand_as(centred).reshape(-1, 1)
    bound = (half_gap * absmax + scale_err) * (1 + 1e-5) + 1e-7
    return codes, near_tie, half_gap, bound.reshape(w.shape)


def test_nf4_codes_match_a_float64_reference_and_error_is_within_the_codebook_bound():
    from genlab.nn.ptq import ptq_registry
    w = _weights(256, 128)
    m = _linear(w)
    ptq_registry.get("nf4").apply(m, torch.device("cpu"))
    q = m.weight
    ref_codes, near_tie, half_gap, bound = _nf4_reference(w)
    packed = q.quantized_data
    codes = torch.stack([packed >> 4, packed & 15], 1).reshape(ref_codes.shape).long()
    assert ((codes == ref_codes) | near_tie).all()
    err = (q.get_original_weight().double() - w.double()).abs()
    assert (err <= bound).all()
    # the known worst case: half the widest gap (between -1 and -0.6962) of the absmax
    assert (half_gap <= 0.1519 + 1e-12).all() and err.max() > 0


def test_int8_weight_only_round_trip_is_within_half_a_scale_per_element():
    from genlab.nn.ptq import ptq_registry
    w = _weights(96, 64, seed=1)
    m = _linear(w)
    ptq_registry.get("int8").apply(m, torch.device("cpu"))
    q = m.weight
    scale = q.scale.double().reshape(-1, 1)
    # symmetric per-row scale: the row's absmax spread over 255 steps
    torch.testing.assert_close(scale, w.double().abs().amax(1, keepdim=True) / 127.5, rtol=1e-6, atol=0)
    err = (q.dequantize().double() - w.double()).abs()
    # + float32 rounding of w / scale and of q * scale, relative to |w| (the clamped absmax sits exactly at scale/2)
    assert (err <= scale / 2 + 4 * torch.finfo(torch.float32).eps * w.double().abs()).all()
    assert q.qdata.dtype == torch.int8


def test_only_block_linears_are_quantized_adaln_on_request():
    from genlab.config.tree import load_config
    from genlab.lab.bench import data_spec_for
    from genlab.nn.ptq import candidate_linears
    from genlab.training.step import build_model_and_method
    cfg = load_config("digits_flow", ["model.dim=32", "model.depth=2", "model.heads=2"])
    model, _ = build_model_and_method(cfg, data_spec_for(cfg))
    names = [n for n, _ in candidate_linears(model)]
    assert names and all(n.startswith("blocks.") and ".ada" not in n for n in names)
    with_ada = [n for n, _ in candidate_linears(model, adaln=True)]
    assert set(with_ada) - set(names) == {"blocks.0.ada.1", "blocks.1.ada.1"}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny digits flow run with checkpoints at steps 10, 20, 30 (no training-time eval: seconds)."""
    from genlab.training.trainer import Trainer
    out = tmp_path_factory.mktemp("quant")
    Trainer(tiny_config(out, "train.name=r", "train.steps=30", "log.every=10", "log.ckpt_every=10", "log.keep_last=0",
                        "eval.num_samples=0", "log.sample_every=0")).fit()
    return out / "r"


def test_quantized_run_loads_as_the_source_quantized_and_samples_and_evals(tiny_run, tmp_path, capfd, one_thread):
    from genlab.nn.ptq import quantize_model
    from genlab.runs.load import load_run
    out = tmp_path / "r_nf4"
    r = cli_in_process(capfd, "quantize", tiny_run, "--to", "nf4", "--out", out)
    assert r.returncode == 0, r.stderr
    rec = json.loads((out / "quant.json").read_text())
    assert rec["format"] == "nf4" and rec["weights"] == "ema" and len(rec["layers"]) == 8
    assert rec["linear_bytes_bf16"] == 2 * rec["quantized_params"]
    # 4 bits a weight plus one int8 scale per 64 and a float factor per scaler group
    assert rec["quantized_params"] / 2 < rec["linear_bytes_quantized"] < rec["quantized_params"] * 0.6
    # loading re-applies the same quantization: the model equals the source quantized by hand
    _, qm, method, dev, _ = load_run(out, "cpu")
    _, fm, _, _, _ = load_run(tiny_run, "cpu")
    quantize_model(fm, "nf4", dev)
    assert all(type(qm.get_submodule(n).weight).__name__ == "NF4Tensor" for n in rec["layers"])
    x, t, y = torch.randn(3, 1, 8, 8), torch.rand(3), torch.arange(3)
    with torch.no_grad():
        torch.testing.assert_close(qm(x, t, y), fm(x, t, y), rtol=0, atol=0)
    r = cli_in_process(capfd, "sample", out, "--n", "10", "--steps", "2")
    assert r.returncode == 0 and (out / "sample_grid.png").is_file(), r.stderr
    r = cli_in_process(capfd, "eval", out, "eval.num_samples=20", "eval.sample_steps=2")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout[r.stdout.index("{"):])
    assert {"sample_accuracy", "feature_fd"} <= set(res) and res["step"] == 30


def test_quantize_never_writes_over_an_existing_folder(tiny_run, tmp_path, capfd):
    out = tmp_path / "q"
    assert cli_in_process(capfd, "quantize", tiny_run, "--to", "int8", "--out", out).returncode == 0
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    r = cli_in_process(capfd, "quantize", tiny_run, "--to", "nf4", "--out", out)
    assert r.returncode == 2 and "exists" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    assert json.loads((out / "quant.json").read_text())["format"] == "int8"


@pytest.mark.parametrize("args,expect", [
    (["--to", "int7"], "valid choices: fp8, int4, int8, nf4"),
    (["--to", "int4"], "use one of: int8, nf4"),
    (["--to", "fp8"], "use one of: int8, nf4"),
    ([], "give --to FORMAT"),
])
def test_bad_format_is_one_line_exit_2_and_writes_nothing(tiny_run, tmp_path, capfd, args, expect):
    if not args or args[1] in ("int4", "fp8"):
        if torch.cuda.is_available():
            pytest.skip("CUDA runs int4/fp8")
    r = cli_in_process(capfd, "quantize", tiny_run, *args, "--out", tmp_path / "q")
    assert r.returncode == 2 and expect in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "q").exists()


def test_a_run_without_weights_is_one_line_exit_2(tmp_path, capfd):
    (tmp_path / "empty").mkdir()
    r = cli_in_process(capfd, "quantize", tmp_path / "empty", "--to", "int8")
    assert r.returncode == 2 and "no checkpoint" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "empty_int8").exists()


def test_export_refuses_a_quantized_run(tiny_run, tmp_path, capfd):
    out = tmp_path / "q8"
    assert cli_in_process(capfd, "quantize", tiny_run, "--to", "int8", "--out", out).returncode == 0
    r = cli_in_process(capfd, "export", out, "--out", tmp_path / "m.safetensors")
    assert r.returncode == 2 and "export its source run" in r.stderr


def test_gap_over_three_checkpoints_writes_the_table_and_plot(tiny_run, capfd, one_thread):
    # the command: `genlab analyze quant-gap RUN`
    r = cli_in_process(capfd, "analyze", "quant-gap", tiny_run, "--formats", "int8,nf4", "eval.num_samples=20",
                       "eval.sample_steps=2")
    assert r.returncode == 0, r.stderr
    res = json.loads((tiny_run / "analysis" / "quant_gap.json").read_text())
    assert [row["step"] for row in res["rows"]] == [10, 20, 30] and res["metric"] == "feature_fd"
    assert all(set(row) >= {"float", "int8", "nf4", "samples"} for row in res["rows"])
    assert set(res["trend"]["nf4"]) >= {"a", "b_per_decade"}
    md = (tiny_run / "analysis" / "quant_gap.md").read_text()
    assert md.count("\n| 10 |") == 1 and "| 30 |" in md and "gap nf4" in md
    assert (tiny_run / "analysis" / "quant_gap.png").stat().st_size > 1000


def test_analyze_quant_gap_without_a_run_is_one_line_exit_2(capfd):
    r = cli_in_process(capfd, "analyze", "quant-gap")
    assert r.returncode == 2 and "give the run folder" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_trend_recovers_a_linear_in_log_gap():
    from genlab.runs.quant_gap import trend
    steps = [100, 1000, 10000]
    t = trend(steps, [0.1 + 0.05 * k for k in range(3)])
    assert t["a"] == pytest.approx(0.0, abs=1e-9) and t["b_per_decade"] == pytest.approx(0.05)
    t = trend(steps, [2e-3 * s ** 0.5 for s in steps])
    assert t["power_k"] == pytest.approx(0.5) and t["power_c"] == pytest.approx(2e-3)


def _check_block_linear_close_to_float(fmt, dev):
    """A block linear quantized to `fmt` on `dev` gives outputs within its format's per-output rounding bound."""
    from genlab.nn.ptq import check_format, ptq_registry
    try:
        check_format(fmt, dev)
    except Exception as e:  # fp8 below SM89
        pytest.skip(str(e))
    w = _weights(256, 256).to(dev)
    m = _linear(w.cpu()).to(dev)
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(1)).to(dev)
    with torch.no_grad():
        ref = m(x)
        ptq_registry.get(fmt).apply(m, dev)
        y = m(x)
    assert y.dtype == torch.float32
    err, bound = (y - ref).abs(), _rounding_bound(fmt, x, w, m.bias.float(), ref)
    assert (err <= bound).all(), f"{fmt}: error/bound up to {(err / bound).max():.2f}"
    assert err.max() > 0  # it did quantize


@pytest.mark.parametrize("fmt", ["int8", "nf4"])
def test_weight_only_formats_run_a_block_linear_on_the_cpu_within_their_rounding_bound(fmt):
    _check_block_linear_close_to_float(fmt, torch.device("cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", ["int4", "fp8", "int8", "nf4"])
def test_every_format_runs_a_block_linear_on_the_gpu_within_its_rounding_bound(fmt):
    _check_block_linear_close_to_float(fmt, torch.device("cuda"))


BF16_U = 2.0 ** -8   # unit roundoff of bf16 (8 significant bits)
E4M3_U = 2.0 ** -4   # of float8 e4m3 (4 significant bits), for values in its normal range


def _rounding_bound(fmt, x, w, b, ref):
    """Per output, the largest |y - ref| the format's rounding allows (every input rounded the worst way, summed
    without cancellation), on top of the bf16 casts the kernels may add around it: activations, weights and the
    output to bf16 (BF16_U each), accumulation in float32 (negligible here).
    fp8: x and W in e4m3 with one dynamic scale per tensor (amax -> 448): relative E4M3_U each, or an absolute
    2^-10 x scale below e4m3's smallest normal (2^-6 x scale).
    int4: W in asymmetric groups of G input weights, 16 levels spanning the group's range widened to include 0:
    |dW| <= step / 2 with step = range / 15, plus the bf16 rounding of the group's scale and zero point.
    int8 (weight only): symmetric per-row scale absmax / 127.5, |dW| <= scale / 2 (+ float32 rounding).
    nf4: the per-weight codebook bound of `_nf4_reference` (half a level gap of the block absmax + the scale's int8)."""
    ax, aw = x.abs(), w.abs()
    prod = ax @ aw.T                                                            # sum_i |x_i| |w_ji|
    casts = (3 * BF16_U) * prod + BF16_U * (ref.abs() + b.abs())
    if fmt == "fp8":
        sub_x, sub_w = 2.0 ** -10 * x.abs().max() / 448, 2.0 ** -10 * w.abs().max() / 448
        return 2 * E4M3_U * prod + sub_w * ax.sum(1, keepdim=True) + sub_x * aw.sum(1) + casts
    if fmt == "int8":
        dw = (aw.amax(1, keepdim=True) / 127.5 / 2 + 4 * torch.finfo(torch.float32).eps * aw).expand_as(w)
        return ax @ dw.T + casts
    if fmt == "nf4":
        return ax @ _nf4_reference(w.cpu())[3].to(x.device, x.dtype).T + casts
    from genlab.nn.ptq import int4_group
    g = int4_group(w.shape[1])
    wg = w.view(w.shape[0], -1, g)
    span = wg.amax(-1).clamp(min=0) - wg.amin(-1).clamp(max=0)                  # [out, groups]
    dw = (span / 15 / 2 + BF16_U * 16 * wg.abs().amax(-1)).repeat_interleave(g, 1)  # [out, in]
    return ax @ dw.T + casts


def test_gap_of_a_text_run_compares_validation_loss(tmp_path, capfd, one_thread):
    from genlab.config.tree import load_config
    from genlab.runs.quant_gap import quant_gap
    from genlab.training.trainer import Trainer
    lm = ["model.dim=32", "model.depth=2", "model.heads=2", "data.seq_len=32", "train.batch_size=8", "train.steps=4",
          "log.progress=false", "log.tensorboard=false", "log.ckpt_every=2", "log.keep_last=0", "eval.num_samples=0",
          "log.sample_every=0", f"train.out_dir={tmp_path}", "train.name=ar"]
    Trainer(load_config("text_ar", lm)).fit()
    res = quant_gap(tmp_path / "ar", formats=["nf4"], overrides=["eval.num_samples=8"], device="cpu")
    assert res["metric"] == "val_loss" and [r["step"] for r in res["rows"]] == [2, 4]
    assert all(r["tokens"] == r["step"] * 8 * 32 for r in res["rows"])
    # 4-bit weights of a 2-step model: a small change, not none
    assert all(0 < abs(r["nf4"]["val_loss"] - r["float"]["val_loss"]) < 0.5 for r in res["rows"])


@pytest.mark.parametrize("fmt", ["fp8", "int4"])
def test_rounding_bounds_hold_for_a_plain_simulation_of_the_format(fmt):
    """The GPU test's bounds, checked on the CPU against the formats written out in plain torch (e4m3 casts with one
    scale per tensor; 16-level asymmetric groups of 128). The error here is 4.2% (fp8) and 13% (int4) of the largest
    output, above the flat 2% / 8% the GPU test used to assert, which is why both failed on an H100."""
    w = _weights(256, 256)
    m = _linear(w)
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = m(x)
        xb, wb = x.bfloat16().float(), w.bfloat16().float()
        if fmt == "fp8":
            def q8(t):
                s = t.abs().max() / 448
                return (t / s).to(torch.float8_e4m3fn).float() * s
            y = q8(xb) @ q8(wb).T
        else:
            wg = wb.view(256, -1, 128)
            lo, hi = wg.amin(-1, keepdim=True).clamp(max=0), wg.amax(-1, keepdim=True).clamp(min=0)
            step = (hi - lo) / 15
            y = xb @ (((wg - lo) / step).round().clamp(0, 15) * step + lo).view(256, 256).T
        y = (y + m.bias).bfloat16().float()
        err, bound = (y - ref).abs(), _rounding_bound(fmt, x, w, m.bias, ref)
    assert (err <= bound).all()
    assert (err / bound).max() > 0.02  # not vacuous: the bound is within ~50x of the worst error
