"""BitNet's input RMSNorm before every converted block linear (issue 33; nn/bitlinear.py, train.bitlinear_norm):
where it sits, the forward and the straight-through gradients against a float64 reference written out, training with
falling loss and exact resume, `none` reproducing the earlier converters bit for bit, checkpoints saved before the key,
autocast and torch.compile. genlab's BitLinear against torchao's BitNet with the norm: tests/unit/nn/test_quantized_training.py."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import straight_and_resumed, tiny_config

from genlab.config.tree import load_config
from genlab.core.errors import GenlabError
from genlab.nn.bitlinear import NORM_EPS, InputRMSNorm, absmax_int8, add_input_norm, ste, ternary, to_bitlinear
from genlab.nn.convert import apply_converters
from genlab.training.step import build_model_and_method

SPEC = {"kind": "image", "image_size": 8, "channels": 1, "num_classes": 10}
TINY_DIT = ["model.dim=32", "model.depth=2", "model.heads=2"]
BITNETS = ["bitlinear", "bitnet_torchao"]
SHORT = ["train.steps=3", "log.every=1", "log.ckpt_every=0", "eval.num_samples=0", "optim.warmup_steps=1"]
BLOCK_LINEARS = sorted(f"blocks.{i}.{p}" for i in range(2) for p in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"))


def _needs(name):
    if name == "bitnet_torchao":
        pytest.importorskip("torchao")


def _cfg(*overrides):
    return load_config("digits_flow", [*TINY_DIT, *overrides])


def _built(name, norm="rmsnorm", seed=0, live=False):
    """A tiny DiT as a run builds it (the converters' norms added at build), then converted. live: the zero-initialised
    parameters (adaLN-Zero gates, the final layer) drawn at random, so every block linear reaches the output."""
    _needs(name)
    cfg = _cfg(f"train.convert={name}", f"train.bitlinear_norm={norm}")
    torch.manual_seed(seed)
    model, _ = build_model_and_method(cfg, SPEC)
    if live:
        with torch.no_grad():
            for p in model.parameters():
                if not p.any():
                    p.normal_(0, 0.2)
    return apply_converters(model, [name], "cpu", cfg)


def _inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 1, 8, 8, generator=g), torch.rand(4, generator=g), torch.randint(0, 10, (4,), generator=g)


@pytest.mark.parametrize("name", BITNETS)
def test_an_input_norm_sits_before_each_block_linear_and_nowhere_else(name):
    m = _built(name)
    normed = sorted(n.rsplit(".", 1)[0] for n, mod in m.named_modules() if isinstance(mod, InputRMSNorm))
    assert normed == BLOCK_LINEARS  # qkv, proj, fc1, fc2 per block; not adaLN, embeddings or the final layer
    sd = m.state_dict()
    for n in normed:  # the linear's own module, one gain per input feature, saved beside its weight
        assert sd[f"{n}.norm.weight"].shape == (m.get_submodule(n).in_features,)
        assert torch.equal(sd[f"{n}.norm.weight"], torch.ones(m.get_submodule(n).in_features))


def _reference(x, gain, W, b):
    """float64, written out: RMSNorm with its gain, then b1.58 — absmax int8 codes of the normed input per token,
    absmean ternary weights. Returns the output and the dequantised operands (what STE differentiates at)."""
    xn = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * gain
    s_x = 127.0 / xn.abs().amax(-1, keepdim=True)
    x_q = torch.clamp(torch.round(xn * s_x), -128, 127)
    s_w = W.abs().mean()
    w_q = torch.clamp(torch.round(W / s_w), -1, 1)
    assert set(w_q.unique().tolist()) <= {-1.0, 0.0, 1.0}
    return (x_q @ w_q.T) / s_x * s_w + b, x_q / s_x, w_q * s_w


def test_bitlinear_with_its_norm_equals_the_float64_reference_in_forward_and_gradients():
    """The module run in float64 against the formula in float64: both quantise the same values, so only float64
    rounding separates them. Gradients: straight through both quantisers, through the RMSNorm exactly (its gain
    included)."""
    torch.manual_seed(0)
    bl = to_bitlinear(add_input_norm(nn.Linear(48, 24).double()))
    with torch.no_grad():
        bl.norm.weight.uniform_(0.5, 1.5)  # a gain that is not 1: it scales channels before the per-token absmax
    W, b, gain = (t.detach().clone() for t in (bl.weight, bl.bias, bl.norm.weight))
    x = (torch.randn(2, 7, 48, dtype=torch.float64) * 3).requires_grad_(True)
    got = bl(x)
    want, xq, wq = _reference(x.detach(), gain, W, b)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(got)
    got.backward(g)
    up = g @ wq  # d loss / d (normed input), straight through the activation quantiser
    xr, gr = x.detach().clone().requires_grad_(True), gain.clone().requires_grad_(True)
    (xr / torch.sqrt(xr.pow(2).mean(-1, keepdim=True) + NORM_EPS) * gr).backward(up)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(bl.norm.weight.grad, gr.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(bl.weight.grad, g.reshape(-1, 24).T @ xq.reshape(-1, 48), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", BITNETS)
def test_gradients_reach_every_norm_gain(name):
    m = _built(name, live=True)
    m(*_inputs()).square().mean().backward()
    gains = {n: p.grad for n, p in m.named_parameters() if n.endswith(".norm.weight")}
    assert sorted(n.removesuffix(".norm.weight") for n in gains) == BLOCK_LINEARS
    for n, gr in gains.items():
        assert gr is not None and gr.isfinite().all() and gr.abs().sum() > 0, n


class _EarlierBitLinear(nn.Linear):
    """genlab's BitLinear as it was before the input norm (commit 032884c)."""

    def forward(self, x):
        w = ste(self.weight, ternary(self.weight))
        return F.linear(ste(x, absmax_int8(x)), w, self.bias)


@pytest.mark.parametrize("name", BITNETS)
def test_norm_none_reproduces_the_earlier_converter_bit_for_bit(name):
    """The same parameters as a plain model of the same seed, and the same outputs and gradients, to the bit, as the
    converters had before the norm: genlab's earlier class, torchao's subclass on the plain linears."""
    now = _built(name, "none", live=True)
    torch.manual_seed(0)
    earlier, _ = build_model_and_method(_cfg(), SPEC)  # no converter: plain linears
    with torch.no_grad():
        for p in earlier.parameters():
            if not p.any():
                p.normal_(0, 0.2)
    if name == "bitlinear":
        for n, mod in earlier.named_modules():
            if n in BLOCK_LINEARS:
                mod.__class__ = _EarlierBitLinear
    else:
        from genlab.nn.quantized_training import convert_quantized_training
        convert_quantized_training(earlier, name)
    a, b = now.state_dict(), earlier.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    ya, yb = now(*_inputs()), earlier(*_inputs())
    assert torch.equal(ya, yb)
    ya.square().mean().backward(), yb.square().mean().backward()
    for (n, p), q in zip(now.named_parameters(), earlier.parameters()):
        assert torch.equal(p.grad, q.grad), n


def test_norm_on_adds_exactly_the_gains_to_the_earlier_state_dict():
    """The norms draw no random numbers: every other parameter is the plain model's, and the gains start at 1."""
    on, off = _built("bitlinear", "rmsnorm").state_dict(), _built("bitlinear", "none").state_dict()
    extra = [k for k in on if k not in off]
    assert sorted(extra) == [f"{n}.norm.weight" for n in BLOCK_LINEARS]
    assert all(torch.equal(on[k], v) for k, v in off.items())


def test_a_tiny_run_with_the_norm_trains_with_falling_loss_and_moves_the_gains(tmp_path):
    """bitnet_torchao's run with the norm (the default): tests/unit/nn/test_quantized_training.py."""
    name = "bitlinear"
    from genlab.runtime import checkpoint as ckpt
    from genlab.runtime.metrics import read_metrics
    from genlab.training.trainer import Trainer
    s = Trainer(tiny_config(tmp_path, f"train.convert={name}", "optim.lr=3e-3", "train.steps=40", "log.every=5",
                            "log.ckpt_every=0", "eval.num_samples=0", "train.name=q")).fit()
    losses = [r["loss"] for r in read_metrics(s["run_dir"]) if "loss" in r]
    assert s["status"] == "finished" and losses[-1] < 0.8 * losses[0], losses
    gains = {k: v for k, v in ckpt.load_checkpoint(tmp_path / "q")["model"].items() if k.endswith(".norm.weight")}
    assert len(gains) == 8 and all(not torch.equal(v, torch.ones_like(v)) for v in gains.values())


@pytest.mark.parametrize("name", BITNETS)
def test_a_run_with_the_norm_resumes_exactly(tmp_path, name):
    """4 steps straight == 2 steps, checkpoint, resume, 2 steps: bit for bit, the gains and their EMA included."""
    _needs(name)
    over = ["train.steps=4", "log.every=1", "log.ckpt_every=2", "eval.num_samples=0", "optim.warmup_steps=2",
            "train.ema_decay=0.9", f"train.convert={name}"]
    _, a, b = straight_and_resumed(tmp_path, 2, *over)
    for part in ("model", "ema"):
        assert sum(k.endswith(".norm.weight") for k in a[part]) == 8
        for k, v in a[part].items():
            assert type(v) is torch.Tensor and torch.equal(v, b[part][k]), (part, k)
    for i, st in a["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(v, b["optimizer"]["state"][i][k]), (i, k)


def test_a_checkpoint_saved_before_the_switch_loads_and_resumes_without_the_norm(tmp_path):
    """A config saved before train.bitlinear_norm trained BitLinear without the norm: it loads as `none`. Its weights
    under a config with the norm are a one-line error naming the missing gain."""
    from genlab.runs.load import load_run
    from genlab.runtime import checkpoint as ckpt
    from genlab.training.trainer import Trainer, config_for_resume
    Trainer(tiny_config(tmp_path, "train.convert=bitlinear", "train.bitlinear_norm=none", "train.name=old", "train.steps=4",
                        "log.every=1", "log.ckpt_every=2", "eval.num_samples=0", "optim.warmup_steps=1")).fit()
    for path in ckpt.list_checkpoints(tmp_path / "old"):  # as written before the key existed
        state = ckpt.load_checkpoint(path)
        del state["config"]["train"]["bitlinear_norm"]
        ckpt._atomic_save(state, path)
    assert "bitlinear_norm" not in ckpt.load_checkpoint(tmp_path / "old")["config"]["train"]
    cfg, model, _, _, _ = load_run(tmp_path / "old", device="cpu")
    assert cfg.train.bitlinear_norm == "none" and not any(isinstance(m, InputRMSNorm) for m in model.modules())
    assert sum(type(m).__name__ == "BitLinear" for m in model.modules()) == 8
    s = Trainer(config_for_resume(str(tmp_path / "old"), ["train.steps=5"]), resume=str(tmp_path / "old")).fit()
    assert s["status"] == "finished" and s["step"] == 5
    with pytest.raises(GenlabError, match=r"cannot initialise from .*parameter blocks\.0\.attn\.qkv\.norm\.weight, only "
                                          r"in this model \(BitNet's input norm.*train\.bitlinear_norm=none builds") as e:
        Trainer(tiny_config(tmp_path, "train.convert=bitlinear", f"train.init_from={tmp_path / 'old'}",
                            "train.name=new", *SHORT))._setup()
    assert "\n" not in str(e.value)


def test_under_autocast_the_norm_computes_in_float32_and_returns_the_input_dtype():
    """proj and fc2 take bf16 activations under bf16 autocast: the norm's statistics are float32 (one bf16 rounding of
    the result, not of the mean square), its output keeps the input's dtype, and the layer's output is the
    autocast dtype as a plain linear's; the gain's gradient is float32."""
    torch.manual_seed(0)
    bl = to_bitlinear(add_input_norm(nn.Linear(48, 24)))
    with torch.no_grad():
        bl.norm.weight.uniform_(0.5, 1.5)
    xb = (torch.randn(9, 48) * 3).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        n = bl.norm(xb)
        y = bl(xb.float().requires_grad_(True))
    ref = xb.double() / torch.sqrt(xb.double().pow(2).mean(-1, keepdim=True) + NORM_EPS) * bl.norm.weight.double()
    assert n.dtype == torch.bfloat16 and y.dtype == torch.bfloat16
    torch.testing.assert_close(n.double(), ref, rtol=2 ** -8, atol=0)  # within one bf16 rounding of the exact value
    y.float().sum().backward()
    assert bl.norm.weight.grad.dtype == torch.float32 and bl.norm.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("name", BITNETS)
def test_a_tiny_dit_with_the_norms_compiles_into_one_graph(name):
    """torch.compile(fullgraph=True) traces the converted model with its norms without a graph break (the norm's
    float32 region is an autocast context dynamo traces); the traced graph computes what eager does."""
    from torch._dynamo.testing import CompileCounter
    m = _built(name, live=True)
    torch._dynamo.reset()
    counter = CompileCounter()
    got = torch.compile(m, backend=counter, fullgraph=True)(*_inputs())
    assert counter.frame_count == 1
    torch.testing.assert_close(got, m(*_inputs()), rtol=1e-6, atol=1e-6)


def test_a_teacher_trained_with_the_norm_is_built_with_its_gains(tmp_path):
    """Few-step methods build their teacher from its saved config: the norms are there before its EMA loads."""
    from genlab.families.few_step.base import build_teacher, teacher_state
    from genlab.runtime import checkpoint as ckpt
    from genlab.training.trainer import Trainer
    Trainer(tiny_config(tmp_path, "train.convert=bitlinear", "train.name=t", "optim.lr=3e-3", *SHORT)).fit()
    teacher = build_teacher(teacher_state(str(tmp_path / "t")))
    ema = ckpt.load_checkpoint(tmp_path / "t")["ema"]
    gains = {k: v for k, v in teacher.state_dict().items() if k.endswith(".norm.weight")}
    assert sorted(gains) == [f"{n}.norm.weight" for n in BLOCK_LINEARS]
    assert all(torch.equal(v, ema[k]) for k, v in gains.items())
    assert sum(type(m).__name__ == "BitLinear" for m in teacher.modules()) == 8


def test_a_bitnet_student_takes_a_float_teachers_weights_and_starts_its_gains_at_one():
    """A float teacher has no input norms: the student's gains are the only parameters it lacks, and stay 1."""
    from genlab.families.few_step.base import load_student_from_teacher
    torch.manual_seed(3)
    teacher, _ = build_model_and_method(_cfg(), SPEC)
    student = _built("bitlinear")
    load_student_from_teacher(student, teacher.state_dict(), "teacher")
    got = student.state_dict()
    for k, v in got.items():
        assert torch.equal(v, teacher.state_dict()[k] if k in teacher.state_dict() else torch.ones_like(v)), k
    with pytest.raises(GenlabError, match="its model differs"):  # the other way round, the teacher's gains have nowhere to go
        load_student_from_teacher(teacher, student.state_dict(), "teacher")
