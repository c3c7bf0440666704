"""The attention zoo entries (sigmoid, differential, linear) against float64 references written out here."""
from __future__ import annotations

import math

import pytest
import torch

from genlab.core.errors import GenlabError
from genlab.nn.attention import Attention, DifferentialAttention, linear_attention, math_attention, sigmoid_attention, sigmoid_attention_flex
from genlab.nn.attention_spec import attention_registry


def qkv(B=2, H=3, n=7, d=8, m=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    m = m or n
    return tuple(torch.randn(B, H, L, d, generator=g, dtype=dtype) for L in (n, m, m))


def ref_sigmoid(q, k, v, causal):
    """Explicit loops: out_i = sum_j sigmoid(q_i.k_j / sqrt(d) - log m) v_j over the keys j it may see."""
    B, H, n, d = q.shape
    m = k.shape[-2]
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            for i in range(n):
                for j in range(m):
                    if causal and j > i + (m - n):
                        continue
                    w = 1 / (1 + math.exp(-(float(q[b, h, i] @ k[b, h, j]) / math.sqrt(d) - math.log(m))))
                    out[b, h, i] += w * v[b, h, j]
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("m", [7, 10])
def test_sigmoid_matches_loops(causal, m):
    q, k, v = qkv(m=m)
    torch.testing.assert_close(sigmoid_attention(q, k, v, causal=causal), ref_sigmoid(q, k, v, causal))


def test_sigmoid_bias_is_minus_log_n_and_causal_zeroes_future():
    # q = 0: every logit is the bias alone, so each visible key has weight sigmoid(-log n) = 1 / (n + 1)
    n = 6
    v = torch.eye(n, dtype=torch.float64).view(1, 1, n, n)  # out row i = the weights of query i
    w = sigmoid_attention(torch.zeros(1, 1, n, n, dtype=torch.float64), torch.randn(1, 1, n, n, dtype=torch.float64),
                          v, causal=False)
    torch.testing.assert_close(w, torch.full_like(w, 1 / (n + 1)))
    w = sigmoid_attention(torch.randn(1, 1, n, n, dtype=torch.float64), torch.randn(1, 1, n, n, dtype=torch.float64),
                          v, causal=True)
    past = torch.ones(n, n, dtype=torch.bool).tril()
    assert (w[0, 0][~past] == 0).all() and (w[0, 0][past] > 0).all()


@pytest.mark.parametrize("causal", [False, True])
def test_sigmoid_flex_path_matches_plain(causal):
    q, k, v = qkv(n=16, d=16, dtype=torch.float32)  # flex's eager CPU forward; CUDA runs the compiled kernel
    torch.testing.assert_close(sigmoid_attention_flex(q, k, v, causal=causal),
                               sigmoid_attention(q, k, v, causal=causal), rtol=1e-4, atol=1e-5)


def ref_linear(q, k, v, causal, eps=1e-6):
    """The quadratic form: out_i = sum_j (relu(q_i).relu(k_j)) v_j / (sum_j relu(q_i).relu(k_j) + eps)."""
    n, m = q.shape[-2], k.shape[-2]
    s = q.relu() @ k.relu().transpose(-2, -1)  # dense [n, m]
    if causal:
        s = s * torch.ones(n, m, dtype=s.dtype).tril(m - n)
    return (s @ v) / (s.sum(-1, keepdim=True) + eps)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("m", [7, 10])
def test_linear_matches_quadratic_form(causal, m):
    q, k, v = qkv(m=m)
    out = linear_attention(q, k, v, causal=causal)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref_linear(q, k, v, causal))
    out32 = linear_attention(*(t.float() for t in (q, k, v)), causal=causal)  # the fp32 path the models run
    torch.testing.assert_close(out32.double(), ref_linear(q, k, v, causal), rtol=1e-4, atol=1e-5)


def test_linear_refuses_masks_and_dropout():
    q, k, v = qkv()
    with pytest.raises(GenlabError, match="linear"):
        linear_attention(q, k, v, mask=torch.ones(7, 7, dtype=torch.bool))
    with pytest.raises(GenlabError, match="linear"):
        linear_attention(q, k, v, dropout_p=0.1)


@pytest.mark.parametrize("layer", [0, 1, 5, 11])
def test_differential_lambda_init_follows_depth(layer):
    att = DifferentialAttention(head_dim=8, heads=2, layer=layer)
    assert att.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * ((layer + 1) - 1)))
    with torch.no_grad():  # zero re-parameterisation vectors: lambda = 1 - 1 + lambda_init
        for p in (att.lambda_q1, att.lambda_k1, att.lambda_q2, att.lambda_k2):
            p.zero_()
    assert float(att.lam().detach()) == pytest.approx(att.lambda_init)


def test_attention_builds_differential_per_layer():
    blocks = [Attention(16, 2, backend="differential", layer=i) for i in range(3)]
    assert [b.attend.lambda_init for b in blocks] == [0.8 - 0.6 * math.exp(-0.3 * i) for i in range(3)]
    assert any(n.startswith("attend.lambda_q1") for n, _ in blocks[0].named_parameters())
    with pytest.raises(GenlabError, match="odd"):
        Attention(6, 2, backend="differential")  # head dim 3 cannot be split in halves


def _rms(x, w, eps=1e-5):
    return x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("causal", [False, True])
def test_differential_matches_dense_reference(causal):
    att = DifferentialAttention(head_dim=8, heads=3, layer=2).double()
    q, k, v = qkv()
    half = 4
    lam = (torch.exp(att.lambda_q1 @ att.lambda_k1) - torch.exp(att.lambda_q2 @ att.lambda_k2) + att.lambda_init)

    def softmax_map(qh, kh):
        s = qh @ kh.transpose(-2, -1) / math.sqrt(half)
        if causal:
            s = s.masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), float("-inf"))
        return s.softmax(-1)

    a = softmax_map(q[..., :half], k[..., :half]) - lam * softmax_map(q[..., half:], k[..., half:])
    ref = _rms(a @ v, att.norm.weight) * (1 - att.lambda_init)
    torch.testing.assert_close(att(q, k, v, causal=causal), ref)


@pytest.mark.parametrize("causal", [False, True])
def test_differential_with_lambda_zero_is_softmax_over_first_half(causal):
    att = DifferentialAttention(head_dim=8, heads=3, layer=4).double()
    with torch.no_grad():  # exp(0) - exp(log(1 + lambda_init)) + lambda_init = 0
        for p in (att.lambda_q1, att.lambda_k1, att.lambda_q2, att.lambda_k2):
            p.zero_()
        att.lambda_q2[0], att.lambda_k2[0] = math.log(1 + att.lambda_init), 1.0
    assert abs(float(att.lam().detach())) < 1e-12
    q, k, v = qkv()
    first = math_attention(q[..., :4], k[..., :4], v, causal=causal)  # softmax with scale 1/sqrt(4)
    torch.testing.assert_close(att(q, k, v, causal=causal), _rms(first, att.norm.weight) * (1 - att.lambda_init))


@pytest.mark.parametrize("name", ["sigmoid", "differential", "linear"])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_are_finite(name, causal):
    torch.manual_seed(0)
    layer = Attention(16, 2, backend=name, layer=1)
    x = torch.randn(2, 9, 16, requires_grad=True)
    layer(x, causal=causal).square().mean().backward()
    grads = [x.grad] + [p.grad for p in layer.parameters()]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


def test_entries_are_registered():
    assert {"sigmoid", "differential", "linear"} <= set(attention_registry.names())


def test_differential_blocks_compile_once_not_once_per_depth(monkeypatch):
    """lambda_init differs per block; read from a Python float, torch.compile guarded on it and compile=blocks made a
    graph per block (past dynamo's recompile limit the rest ran eager). The buffer keeps one graph for all blocks."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    from genlab.config.tree import load_config
    from genlab.families.image_flow.dit import build_dit
    from genlab.runtime.switches import compile_model_by_name
    torch._dynamo.reset()
    counter = CompileCounter()
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda m, **kw: compile_(m, backend=counter))
    cfg = load_config("digits_flow", ["model.attention=differential", "model.depth=4", "train.compile=blocks"])
    model = build_dit(cfg.model, {"kind": "image", "image_size": 8, "channels": 1, "num_classes": 3})
    assert len({b.attn.attend.lambda_init for b in model.blocks}) == 4
    out = compile_model_by_name(model, cfg.train)(torch.randn(2, 1, 8, 8), torch.rand(2), torch.zeros(2, dtype=torch.long))
    assert out.shape[0] == 2 and counter.frame_count == 1
