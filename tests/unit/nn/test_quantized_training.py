"""torchao's quantized-training prototypes as converters (issue 33): bitnet_torchao against genlab's own BitLinear
(the same b1.58 formula, so the same outputs and gradients to float error), int8_mixed against a float64 reference
of its row-wise int8 matmul, the module selection, training with falling loss, exact resume through genlab's
checkpoints (plain tensors in them), and invalid combinations as one-line errors. Both run on the CPU
(torch._int_mm); the CUDA path (Triton int8 kernels, bf16 autocast) is marked `gpu`."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from conftest import straight_and_resumed, tiny_config

pytest.importorskip("torchao")

NAMES = ["bitnet_torchao", "int8_mixed"]
SUBCLASS = {"bitnet_torchao": "BitNetTrainingLinearWeight", "int8_mixed": "AutocastInt8MixedLinear"}


def count_quantized_training(model: nn.Module) -> dict[str, int]:
    """How many linears each torchao form converts: weight subclasses (bitnet) and swapped modules (int8_mixed)."""
    out: dict[str, int] = {}
    for m in model.modules():
        for kind in (type(m).__name__, type(getattr(m, "weight", None)).__name__):
            if kind in SUBCLASS.values():
                out[kind] = out.get(kind, 0) + 1
    return out


def _tiny_dit():
    from genlab.families.image_flow.dit import DiT, DiTSpec
    return DiT(DiTSpec(image_size=8, channels=1, num_classes=10, dim=32, depth=2, heads=2))


def _block(seed=0):
    """A block-like linear: converters only touch linears under `blocks`."""
    torch.manual_seed(seed)
    m = nn.Module()
    m.blocks = nn.ModuleList([nn.Linear(48, 24)])
    return m


def test_bitnet_torchao_matches_genlabs_bitlinear_in_forward_and_gradients():
    """Both implement b1.58: absmean ternary weights, per-token absmax int8 activations, straight-through
    gradients from the quantised operands, each after BitNet's input RMSNorm (train.bitlinear_norm=rmsnorm, the same
    module in both, its gain not 1). torchao multiplies the int8 codes exactly (int32 accumulation), genlab the
    dequantised values in float32: they agree to float32's summation error over K = 48 terms."""
    from genlab.nn.bitlinear import add_input_norm, to_bitlinear
    from genlab.nn.quantized_training import convert_quantized_training
    ours, theirs = _block(), _block()
    gain = torch.rand(48) + 0.5
    for m in (ours, theirs):
        add_input_norm(m.blocks[0])
        with torch.no_grad():
            m.blocks[0].norm.weight.copy_(gain)
    to_bitlinear(ours.blocks[0])
    convert_quantized_training(theirs, "bitnet_torchao")
    assert type(theirs.blocks[0].weight).__name__ == "BitNetTrainingLinearWeight"
    x = torch.randn(2, 7, 48) * 3
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ya, yb = ours.blocks[0](xa), theirs.blocks[0](xb)
    torch.testing.assert_close(yb, ya, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ya)
    ya.backward(g), yb.backward(g)
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(theirs.blocks[0].weight.grad, ours.blocks[0].weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(theirs.blocks[0].bias.grad, ours.blocks[0].bias.grad)
    torch.testing.assert_close(theirs.blocks[0].norm.weight.grad, ours.blocks[0].norm.weight.grad, rtol=1e-5, atol=1e-5)
    assert ours.blocks[0].norm.weight.grad.abs().sum() > 0
    # the same state-dict names in both, plain tensors: a checkpoint of one loads into the other
    sa, sb = ours.state_dict(), theirs.state_dict()
    assert list(sa) == list(sb) == ["blocks.0.weight", "blocks.0.bias", "blocks.0.norm.weight"]
    assert all(type(v) is torch.Tensor for v in sb.values())


def test_int8_mixed_forward_is_the_rowwise_int8_matmul():
    """out = (round(x/s_x) @ round(W/s_w)^T) * s_x * s_w + b, s_x = absmax per token / 127, s_w = absmax per output
    row / 127, against float64: the integer product is exact, so only float32 scaling error remains."""
    from genlab.nn.quantized_training import convert_quantized_training
    m = _block()
    W, b = m.blocks[0].weight.detach().double(), m.blocks[0].bias.detach().double()
    convert_quantized_training(m, "int8_mixed")
    x = torch.randn(9, 48) * 2
    s_x = x.double().abs().amax(1, keepdim=True) / 127
    s_w = W.abs().amax(1, keepdim=True) / 127
    want = (torch.round(x.double() / s_x) @ torch.round(W / s_w).T) * s_x * s_w.T + b
    xg = x.clone().requires_grad_(True)
    torch.testing.assert_close(m.blocks[0](xg).double(), want, rtol=1e-5, atol=1e-5)
    # and it is an approximation of the plain linear within int8's half-step error per operand
    plain = x.double() @ W.T + b
    # |x_q W_q^T - x W^T| <= |x_q - x| |W_q|^T + |x| |W_q - W|^T, each operand within half its step
    bound = 0.5 * (s_x * (W.abs() + 0.5 * s_w).sum(1) + x.double().abs() @ s_w.expand(-1, 48).T) + 1e-6
    assert ((want - plain).abs() <= bound).all()


def test_int8_mixed_under_autocast_keeps_the_autocast_dtype_and_matches_the_cast_operands():
    """torchao's module swap alone returned float32 here (bf16 input + float32 bias), which broke the CUDA backward.
    The output is bf16 like a plain linear's under autocast, and equals the int8 matmul of the bf16-cast operands."""
    from genlab.nn.quantized_training import convert_quantized_training
    m = _block()
    W, b = m.blocks[0].weight.detach().clone(), m.blocks[0].bias.detach().clone()
    convert_quantized_training(m, "int8_mixed")
    x = (torch.randn(9, 48) * 2).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m.blocks[0](x)
        plain = nn.functional.linear(x, W, b)
    assert y.dtype == plain.dtype == torch.bfloat16
    xb, Wb, bb = x.detach().bfloat16().double(), W.bfloat16().double(), b.bfloat16().double()
    s_x, s_w = xb.abs().amax(1, keepdim=True) / 127, Wb.abs().amax(1, keepdim=True) / 127
    want = (torch.round(xb / s_x) @ torch.round(Wb / s_w).T) * s_x * s_w.T + bb
    torch.testing.assert_close(y.double(), want, rtol=2e-2, atol=2e-2)  # bf16 output: 8 bits of mantissa
    y.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32 and m.blocks[0].weight.grad.dtype == torch.float32


@pytest.mark.parametrize("name", NAMES)
def test_converter_wraps_the_block_linears_only_and_keeps_a_plain_state_dict(name):
    from genlab.nn.convert import apply_converters
    m = _tiny_dit()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    apply_converters(m, [name], "cpu")
    # qkv, proj, fc1, fc2 per block, as genlab's bitlinear; not adaLN, embeddings or the final layer
    assert count_quantized_training(m) == {SUBCLASS[name]: 4 * 2}
    sd = m.state_dict()
    assert list(sd) == list(before)
    assert all(type(v) is torch.Tensor and torch.equal(v, before[k]) for k, v in sd.items())
    # a plain checkpoint loads into the converted model (copied into the subclass in place)
    fresh = _tiny_dit()
    m.load_state_dict(fresh.state_dict())
    assert count_quantized_training(m) == {SUBCLASS[name]: 4 * 2}
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in m.state_dict().items())


@pytest.mark.parametrize("name", NAMES)
def test_converter_trains_a_tiny_model_with_falling_loss(tmp_path, name):
    """bitnet_torchao with BitNet's input RMSNorm (train.bitlinear_norm's default)."""
    from genlab.runtime.metrics import read_metrics
    from genlab.training.trainer import Trainer
    cfg = tiny_config(tmp_path, f"train.convert={name}", "optim.lr=3e-3", "train.steps=40", "log.every=5",
                      "log.ckpt_every=0", "eval.num_samples=0", "train.name=q")
    s = Trainer(cfg).fit()
    losses = [r["loss"] for r in read_metrics(s["run_dir"]) if "loss" in r]
    assert s["status"] == "finished" and losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize("name", NAMES)
def test_converter_resumes_exactly_through_genlabs_checkpoint(tmp_path, name):
    """4 steps straight == 2 steps, checkpoint (plain tensors through safe_load), resume, 2 steps: bit for bit,
    the EMA included."""
    over = ["train.steps=4", "log.every=1", "log.ckpt_every=2", "eval.num_samples=0", "optim.warmup_steps=2",
            "train.ema_decay=0.9", f"train.convert={name}"]
    _, a, b = straight_and_resumed(tmp_path, 2, *over)
    for part in ("model", "ema"):
        for k, v in a[part].items():
            assert type(v) is torch.Tensor and torch.equal(v, b[part][k]), (part, k)
    for i, st in a["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(v, b["optimizer"]["state"][i][k]), (i, k)


@pytest.mark.slow
def test_a_run_trained_with_bitnet_torchao_samples_converted(tmp_path):
    from genlab.runs.load import load_run, sample_to_file
    from genlab.training.trainer import Trainer
    Trainer(tiny_config(tmp_path, "train.convert=bitnet_torchao", "train.name=bit", "train.steps=3", "log.every=1",
                        "log.ckpt_every=0", "eval.num_samples=0", "optim.warmup_steps=1")).fit()
    _, model, _, _, _ = load_run(tmp_path / "bit", device="cpu")
    assert count_quantized_training(model) == {"BitNetTrainingLinearWeight": 4 * 2}
    assert sample_to_file(tmp_path / "bit", n=4, steps=2, device="cpu", out=tmp_path / "s.png").exists()


def test_float8_and_its_alias_together_are_one_converter():
    from genlab.config.check import check_converter_combination
    check_converter_combination(["float8", "float8_tensorwise"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", NAMES)
def test_gpu_converter_trains_in_bf16_with_falling_loss(tmp_path, name):
    """On CUDA the int8 matmuls are torchao's Triton kernels under bf16 autocast."""
    from genlab.runtime.metrics import read_metrics
    from genlab.training.trainer import Trainer
    cfg = tiny_config(tmp_path, f"train.convert={name}", "train.precision=bf16", "train.device=cuda", "model.dim=64",
                      "model.heads=2", "optim.lr=3e-3", "train.steps=40", "log.every=5", "log.ckpt_every=0",
                      "eval.num_samples=0", "train.name=q")
    s = Trainer(cfg).fit()
    losses = [r["loss"] for r in read_metrics(s["run_dir"]) if "loss" in r]
    assert s["status"] == "finished" and losses[-1] < 0.8 * losses[0], losses
