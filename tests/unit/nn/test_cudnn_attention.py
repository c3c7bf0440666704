"""model.attention=cudnn_packed (nn/cudnn_attention.py): attention reading q, k, v as views of the fused QKV output and
writing their gradients into one packed buffer, through cuDNN frontend SDPA graphs on CUDA.

* On the CPU the same two custom ops run a plain composition of the graphs' contract (o in a [B, N, H, hd] buffer,
  the log-sum-exp as stats, the backward from the stats): forward and every gradient against float64 autograd of
  plain attention, the layouts, one graph under torch.compile, the fallbacks of the layer, one training step of a
  DiT and a GPT equal to sdpa's, and the config's refusal of a missing `cudnn` on a CUDA machine.
* On a GPU with the frontend: the cuDNN graphs against float64 under bf16, and a compiled layer in one graph.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from conftest import assert_one_inductor_graph_like_eager, relative_error
from genlab.nn import cudnn_attention
from genlab.nn.attention import Attention, math_attention
from genlab.nn.cudnn_attention import packed_attention, views

HAS_CUDNN = importlib.util.find_spec("cudnn") is not None
CUDA = torch.cuda.is_available()


rel = relative_error


def packed_input(B, N, H, hd, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(B, N, 3 * H * hd, generator=g, dtype=dtype, device=device)


def reference(h, heads, causal):
    """Plain math attention on the same views, in float64 autograd."""
    return math_attention(*views(h, heads), causal=causal)


SHAPES = [(2, 7, 3, 8), (1, 16, 2, 16), (3, 5, 4, 8)]  # odd token counts included


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,N,H,hd", SHAPES)
def test_cpu_ops_match_float64_attention_forward_and_dh(B, N, H, hd, causal):
    h = packed_input(B, N, H, hd)
    cot = torch.randn(B, H, N, hd, dtype=torch.float64)
    out = packed_attention(h.clone().requires_grad_(), H, causal)
    ref_h = h.clone().requires_grad_()
    ref = reference(ref_h, H, causal)
    assert rel(out, ref) < 1e-12
    x = h.clone().requires_grad_()
    dh, = torch.autograd.grad((packed_attention(x, H, causal) * cot).sum(), x)
    ref_dh, = torch.autograd.grad((ref * cot).sum(), ref_h)
    assert rel(dh, ref_dh) < 1e-12
    # float32 inputs: within float32 rounding of the float64 reference
    x32 = h.float().requires_grad_()
    o32 = packed_attention(x32, H, causal)
    dh32, = torch.autograd.grad((o32 * cot.float()).sum(), x32)
    assert rel(o32, ref) < 1e-5 and rel(dh32, ref_dh) < 1e-5


def test_cpu_layouts_o_is_bnhd_and_dh_is_one_packed_buffer():
    B, N, H, hd = 2, 5, 3, 8
    C = H * hd
    h = packed_input(B, N, H, hd)
    o, stats = cudnn_attention._fwd(h, H, False, hd ** -0.5)
    assert o.shape == (B, H, N, hd) and o.stride() == (N * C, hd, C, 1)  # a [B, N, H, hd] buffer
    assert o.transpose(1, 2).is_contiguous() and stats.shape == (B, H, N, 1)
    q, k, v = views(h, H)
    assert q.stride() == (N * 3 * C, hd, 3 * C, 1) and (k.storage_offset(), v.storage_offset()) == (C, 2 * C)
    torch.testing.assert_close(stats, (q @ k.transpose(-2, -1) * hd ** -0.5).logsumexp(-1, keepdim=True))
    do = torch.randn(B, H, N, hd, dtype=torch.float64)
    dh = cudnn_attention._bwd(do, h, o, stats, H, False, hd ** -0.5)
    assert dh.shape == (B, N, 3 * C) and dh.is_contiguous()
    hq, hk, hv = (t.detach().requires_grad_() for t in views(h, H))
    ref = math_attention(hq, hk, hv)
    grads = torch.autograd.grad((ref * do).sum(), [hq, hk, hv])
    for part, g in zip(views(dh, H), grads):  # the thirds of dh hold dq, dk, dv
        torch.testing.assert_close(part, g, rtol=1e-10, atol=1e-12)


def layer_pair(dim=48, heads=3, backend="cudnn_packed", dtype=torch.float64, device="cpu", **kw):
    torch.manual_seed(0)
    ref = Attention(dim, heads, backend="math", **kw).to(device, dtype)
    m = Attention(dim, heads, backend=backend, **kw).to(device, dtype)
    m.load_state_dict(ref.state_dict())
    return m, ref


def layer_grads(m, x, cot, **kw):
    out = m(x, **kw)
    return out, torch.autograd.grad((out.float() * cot).sum(), [x, *m.parameters()])


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_layer_every_gradient_matches_math_attention_in_float64(causal):
    m, ref = layer_pair()
    assert m.packed is packed_attention
    calls = []
    m.packed = lambda *a: calls.append(1) or packed_attention(*a)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 9, 48, generator=g, dtype=torch.float64)
    cot = torch.randn(2, 9, 48, generator=g, dtype=torch.float64)
    out, g1 = layer_grads(m, x.clone().requires_grad_(), cot, causal=causal)
    ref_out, g2 = layer_grads(ref, x.clone().requires_grad_(), cot, causal=causal)
    assert calls == [1]  # the packed path ran
    assert rel(out, ref_out) < 1e-12
    for a, b in zip(g1, g2):  # x, qkv weight and bias, proj weight and bias
        assert a.shape == b.shape and rel(a, b) < 1e-12


def test_cpu_compiles_in_one_graph_and_matches_eager():
    from torch._dynamo.testing import CompileCounterWithBackend
    m, _ = layer_pair(dtype=torch.float32)
    x = torch.randn(2, 9, 48, requires_grad=True)
    eager = m(x, causal=True).tanh()
    g_eager = torch.autograd.grad(eager.sum(), [x, *m.parameters()])
    counter = CompileCounterWithBackend("aot_eager")
    out = torch.compile(lambda t: m(t, causal=True).tanh(), backend=counter, fullgraph=True)(x)
    g = torch.autograd.grad(out.sum(), [x, *m.parameters()])
    assert counter.frame_count == 1
    torch.testing.assert_close(out, eager)
    for a, b in zip(g, g_eager):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("case", ["qk_norm", "rope", "mask", "dropout", "qkv_kernel"])
def test_layer_falls_back_to_the_ordinary_path_and_matches_sdpa(case):
    from genlab.nn.positions import build_position
    kw = {"qk_norm": True} if case == "qk_norm" else {"attn_dropout": 0.5} if case == "dropout" else {}
    m, _ = layer_pair(dtype=torch.float32, **kw)
    ref, _ = layer_pair(backend="sdpa", dtype=torch.float32, **kw)
    if case == "qkv_kernel":
        m2 = Attention(48, 3, backend="cudnn_packed", qkv_kernel="triton")
        assert m2.packed is None
        return
    m.packed = lambda *a: pytest.fail("the packed path ran")
    x = torch.randn(2, 6, 48)
    call = {}
    if case == "rope":
        call["rope"] = build_position("rope", 48, 3, (6,), "gpt").rope()
        assert call["rope"] is not None
    if case == "mask":
        call["mask"] = torch.rand(6, 6) > 0.3
        call["mask"].fill_diagonal_(True)
    if case == "dropout":  # the same dropout mask on both sides
        torch.manual_seed(5)
        out = m(x, **call)
        torch.manual_seed(5)
        ref_out = ref(x, **call)
    else:
        out, ref_out = m(x, **call), ref(x, **call)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)


def test_a_swapped_in_fallback_runs_instead_of_the_packed_path():
    """forward_ad_attention / plain_softmax_attention swap a layer's kernel: the packed path must not bypass it."""
    from genlab.nn.attention import plain_softmax_attention
    m, _ = layer_pair(dtype=torch.float32)
    m.packed = lambda *a: pytest.fail("the packed path ran")
    with plain_softmax_attention(m) as n:
        assert n == 1
        m(torch.randn(1, 4, 48))


def _one_step(build, cfg, inputs, loss_of):
    torch.manual_seed(0)
    model = build(cfg.model)
    layers = [a for a in model.modules() if isinstance(a, Attention)]
    calls = []
    for a in layers:
        if a.packed is not None:
            a.packed = lambda *args, _f=a.packed: calls.append(1) or _f(*args)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with torch.no_grad():  # adaLN-Zero: move off the zero init so the attention matters
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    losses = []
    for _ in range(2):
        loss = loss_of(model, *inputs)
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return losses, len(calls)


@pytest.mark.parametrize("family", ["dit", "gpt"])
def test_a_model_trains_a_step_as_with_sdpa(family):
    from genlab.config.tree import load_config
    small = ["model.dim=32", "model.depth=2", "model.heads=2", "train.device=cpu"]
    g = torch.Generator().manual_seed(3)
    if family == "dit":
        from genlab.families.image_flow.dit import build_dit
        preset, extra = "digits_flow", []
        spec = {"kind": "image", "image_size": 8, "channels": 1, "num_classes": 3}
        build = lambda m: build_dit(m, spec)  # noqa: E731
        inputs = (torch.randn(4, 1, 8, 8, generator=g), torch.rand(4, generator=g), torch.randint(0, 3, (4,), generator=g),
                  torch.randn(4, 1, 8, 8, generator=g))
        loss_of = lambda model, x, t, y, target: (model(x, t, y) - target).square().mean()  # noqa: E731
    else:
        from genlab.families.lm.gpt import build_gpt
        preset, extra = "shakespeare_char_ar", ["model.dropout=0"]
        build = lambda m: build_gpt(m, {"kind": "tokens", "vocab_size": 65, "seq_len": 16})  # noqa: E731
        idx = torch.randint(0, 65, (4, 17), generator=g)
        inputs = (idx[:, :-1], idx[:, 1:])
        loss_of = lambda model, x, y: model(x, y)  # noqa: E731
    runs = {}
    for attn in ("sdpa", "cudnn_packed"):
        cfg = load_config(preset, small + extra + [f"model.attention={attn}"])
        runs[attn] = _one_step(build, cfg, inputs, loss_of)
    (ref, _), (got, calls) = runs["sdpa"], runs["cudnn_packed"]
    assert calls == 2 * 2  # both blocks, both steps: the packed path ran
    assert got == pytest.approx(ref, rel=1e-5), (got, ref)  # the step moved both models the same way


def test_config_refuses_cudnn_packed_without_the_frontend_on_cuda_in_one_line(monkeypatch):
    from genlab.config.tree import load_config
    from genlab.core.errors import GenlabError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cudnn" else real(name, *a))
    with pytest.raises(GenlabError, match=r"^model.attention=cudnn_packed needs the 'cudnn' package \(not installed\); "
                                          r"valid choices: .*\bsdpa\b") as e:
        load_config("digits_flow", ["model.attention=cudnn_packed", "train.device=cuda"])
    assert "\n" not in str(e.value) and "cudnn_packed" not in str(e.value).split("valid choices:")[1]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "cudnn" else real(name, *a))
    assert load_config("digits_flow", ["model.attention=cudnn_packed", "train.device=cuda"]).model.attention == "cudnn_packed"


def test_build_refuses_head_dims_cudnn_does_not_take():
    from genlab.core.errors import GenlabError
    with pytest.raises(GenlabError, match=r"^model.attention=cudnn_packed needs a head dim that is a multiple of 8 .*"
                                          r"got 12; valid choices for this model: .*sdpa"):
        Attention(36, 3, backend="cudnn_packed")
    with pytest.raises(GenlabError, match="at most"):
        Attention(3 * 264, 3, backend="cudnn_packed")


# -- the cuDNN graphs ------------------------------------------------------------------------------------------------
GPU = pytest.mark.skipif(not (CUDA and HAS_CUDNN), reason="needs a CUDA GPU and nvidia-cudnn-frontend (import cudnn)")


@pytest.mark.gpu
@GPU
@pytest.mark.parametrize("B,N,H,hd,causal", [(8, 256, 12, 64, False), (4, 1024, 12, 64, True), (2, 256, 16, 72, False)])
def test_gpu_cudnn_graphs_match_float64_under_bf16(B, N, H, hd, causal):
    """Forward and dh in bf16 against float64 plain attention: no further from it than SDPA on the same bf16
    views (x2 margin), and the cuDNN path taken."""
    h = packed_input(B, N, H, hd, torch.float32, "cuda").bfloat16()
    assert cudnn_attention.supports(h, H)
    cot = torch.randn(B, H, N, hd, device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    ref_h = h.double().requires_grad_()
    ref = reference(ref_h, H, causal)
    ref_dh, = torch.autograd.grad((ref * cot.double()).sum(), ref_h)
    errs = {}
    for name, fn in (("cudnn", lambda x: packed_attention(x, H, causal)),
                     ("sdpa", lambda x: torch.nn.functional.scaled_dot_product_attention(*views(x, H), is_causal=causal))):
        x = h.clone().requires_grad_()
        out = fn(x)
        dh, = torch.autograd.grad((out.float() * cot).sum(), x)
        errs[name] = (rel(out, ref), rel(dh, ref_dh))
        if name == "cudnn":
            assert out.transpose(1, 2).is_contiguous() and dh.is_contiguous() and dh.shape == h.shape
    assert max(errs["cudnn"]) < 2e-2, errs
    assert all(c <= 2 * s + 1e-3 for c, s in zip(errs["cudnn"], errs["sdpa"])), errs


@pytest.mark.gpu
@GPU
def test_gpu_compiled_dit_b2_layer_is_one_graph_and_matches_eager():
    m, _ = layer_pair(768, 12, dtype=torch.float32, device="cuda")
    x = torch.randn(8, 256, 768, device="cuda", requires_grad=True)
    assert_one_inductor_graph_like_eager(m, x)
