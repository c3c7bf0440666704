"""model.mlp=gelu_quack (nn/quack_mlp.py): the GELU MLP with fc1's GELU and GELU' in quack-kernels' GEMM epilogues.

* CPU tensors run the plain gelu composition, bit for bit; CPU training is refused in one line, as is a missing quack.
* The two custom ops and their autograd rule, with quack's `gemm_act` / `gemm_dact` replaced by float64 references of
  their documented contract (a stand-in module, CPU): forward and every gradient against the plain MLP in float64, and
  one graph under torch.compile.
* On a Hopper GPU with quack installed: the real kernels against float64 under bf16 autocast, and compiled.
"""
from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_one_inductor_graph_like_eager, mlp_pair, output_and_grads, relative_error
from genlab.nn import quack_mlp

HAS_QUACK = importlib.util.find_spec("quack") is not None
HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


rel = relative_error


def pair(dim=24, hidden=96, dtype=torch.float64, device="cpu"):
    return mlp_pair("gelu", "gelu_quack", dim, hidden, dtype, device)


grads = output_and_grads


def test_gelu_quack_is_plain_gelu_on_cpu():
    m, ref = pair()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, 24, generator=g, dtype=torch.float64).requires_grad_()
    cot = torch.randn(2, 7, 24, generator=g, dtype=torch.float64)
    assert not quack_mlp.supports(x, m.fc1.weight)
    out, g1 = grads(m, x, cot)
    ref_out, g2 = grads(ref, x, cot)
    assert torch.equal(out, ref_out) and all(torch.equal(a, b) for a, b in zip(g1, g2))


def test_gelu_quack_refuses_cpu_training_and_a_missing_quack_in_one_line(monkeypatch):
    from genlab.config.tree import load_config
    from genlab.core.errors import GenlabError
    with pytest.raises(GenlabError, match=r"^model.mlp=gelu_quack is a CUDA kernel .* valid choices on the CPU: gelu, "
                                          r"mixffn, swiglu$"):
        load_config("digits_flow", ["model.mlp=gelu_quack", "train.device=cpu"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("quack", "liger_kernel") else real(name, *a))
    with pytest.raises(GenlabError, match=r"^model.mlp=gelu_quack needs the 'quack' package .*valid choices: "
                                          r"gelu, mixffn, swiglu$"):
        load_config("digits_flow", ["model.mlp=gelu_quack", "train.device=cuda"])


# -- the ops' glue, with quack's two epilogue GEMMs replaced by references of their contract ------------------------
def _gelu_grad(pre):
    """d/dz of the tanh GELU, written out (not autograd), as the dact epilogue computes it."""
    c = (2 / torch.pi) ** 0.5
    u = c * (pre + 0.044715 * pre ** 3)
    t = torch.tanh(u)
    return 0.5 * (1 + t) + 0.5 * pre * (1 - t * t) * c * (1 + 3 * 0.044715 * pre * pre)


def _stand_in():
    def gemm_act(A, B, bias=None, activation=None, store_preact=True, tuned=True):
        assert activation == "gelu_tanh_approx" and store_preact
        pre = A @ B + bias
        return pre, F.gelu(pre, approximate="tanh")

    def gemm_dact(A, B, PreAct, activation=None, tuned=True):
        assert activation == "gelu_tanh_approx"
        return (A @ B) * _gelu_grad(PreAct), F.gelu(PreAct, approximate="tanh")

    mod = types.ModuleType("quack.gemm_interface")
    mod.gemm_act, mod.gemm_dact = gemm_act, gemm_dact
    return mod


@pytest.fixture
def stand_in_quack(monkeypatch):
    monkeypatch.setitem(sys.modules, "quack", types.ModuleType("quack"))
    monkeypatch.setitem(sys.modules, "quack.gemm_interface", _stand_in())
    monkeypatch.setattr(quack_mlp, "supports", lambda x, w1: True)


def test_gelu_quack_ops_forward_and_gradients_match_plain_gelu_in_float64(stand_in_quack):
    m, ref = pair(dim=16, hidden=40)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 16, generator=g, dtype=torch.float64)
    cot = torch.randn(3, 5, 16, generator=g, dtype=torch.float64)
    out, g1 = grads(m, x.clone().requires_grad_(), cot)
    ref_out, g2 = grads(ref, x.clone().requires_grad_(), cot)
    assert rel(out, ref_out) < 1e-12
    for a, b in zip(g1, g2):  # x, fc1.weight, fc1.bias, fc2.weight, fc2.bias
        assert a.shape == b.shape and rel(a, b) < 1e-12


def test_gelu_quack_ops_compile_in_one_graph(stand_in_quack):
    from torch._dynamo.testing import CompileCounterWithBackend
    m, _ = pair(dim=16, hidden=64, dtype=torch.float32)
    x = torch.randn(3, 5, 16, requires_grad=True)
    eager = m(x).tanh()
    g_eager = torch.autograd.grad(eager.sum(), [x, *m.parameters()])
    counter = CompileCounterWithBackend("aot_eager")
    out = torch.compile(lambda t: m(t).tanh(), backend=counter, fullgraph=True)(x)
    g = torch.autograd.grad(out.sum(), [x, *m.parameters()])
    assert counter.frame_count == 1
    torch.testing.assert_close(out, eager)
    for a, b in zip(g, g_eager):
        torch.testing.assert_close(a, b)


# -- the real kernels ----------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not (HOPPER and HAS_QUACK), reason="needs a Hopper (sm90+) GPU and quack-kernels")
@pytest.mark.parametrize("shape,hidden", [((4, 256, 768), 3072), ((2, 64, 384), 1536), ((3, 17, 128), 512)])
def test_gpu_gelu_quack_matches_float64_under_bf16_autocast(shape, hidden):
    """DiT-B/GPT-2 widths and an odd token count: bf16 autocast against the float64 MLP, within bf16 rounding, and
    no further from it than the plain gelu MLP under the same autocast (x2 margin)."""
    dim = shape[-1]
    m, plain = pair(dim, hidden, torch.float32, "cuda")
    ref, _ = pair(dim, hidden, torch.float64, "cuda")
    ref.load_state_dict(m.state_dict())
    g = torch.Generator(device="cuda").manual_seed(2)
    x = torch.randn(shape, generator=g, device="cuda")
    cot = torch.randn(shape, generator=g, device="cuda")
    assert quack_mlp.supports(x.bfloat16(), m.fc1.weight)
    ref_out, ref_g = grads(ref, x.double().requires_grad_(), cot.double())
    errs = {}
    for name, mod in (("quack", m), ("plain", plain)):
        with torch.autocast("cuda", torch.bfloat16):
            out, gs = grads(mod, x.clone().requires_grad_(), cot)
        errs[name] = [rel(out, ref_out)] + [rel(a, b) for a, b in zip(gs, ref_g)]
    assert max(errs["quack"]) < 2e-2, errs
    assert all(q <= 2 * p + 1e-3 for q, p in zip(errs["quack"], errs["plain"])), errs


@pytest.mark.gpu
@pytest.mark.skipif(not (HOPPER and HAS_QUACK), reason="needs a Hopper (sm90+) GPU and quack-kernels")
def test_gpu_gelu_quack_compiles_in_one_graph_and_matches_eager():
    m, _ = pair(256, 1024, torch.float32, "cuda")
    x = torch.randn(4, 64, 256, device="cuda", requires_grad=True)
    assert_one_inductor_graph_like_eager(m, x)


def test_gelu_quack_refuses_a_quack_outside_site_packages_before_the_run(monkeypatch, tmp_path):
    """quack's compiler fails mid-run when the CuTe DSL is not in a site-packages folder (seen with pip --target):
    the config check says so in one line instead, on a CUDA machine where quack is found."""
    from genlab.config.tree import load_config
    from genlab.core.errors import GenlabError
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec

    def at(folder):
        origin = folder / "cutlass" / "__init__.py"
        return lambda name, *a: (types.SimpleNamespace(origin=str(origin)) if name in ("quack", "cutlass")
                                 else real(name, *a))
    monkeypatch.setattr(importlib.util, "find_spec", at(tmp_path / "site"))
    with pytest.raises(GenlabError, match=r"^model.mlp=gelu_quack: quack-kernels' CuTe DSL .* is at .*site/cutlass/"
                                          r"__init__.py; quack compiles only from a site-packages install"):
        load_config("digits_flow", ["model.mlp=gelu_quack", "train.device=cuda"])
    monkeypatch.setattr(importlib.util, "find_spec", at(tmp_path / "lib" / "site-packages"))
    assert load_config("digits_flow", ["model.mlp=gelu_quack", "train.device=cuda"]).model.mlp == "gelu_quack"


def test_gelu_quack_tuning_knob_reaches_both_epilogue_gemms(stand_in_quack, monkeypatch):
    """GENLAB_QUACK_TUNED=1 hands tuned=True to gemm_act and gemm_dact (quack's autotuner); unset, its default config."""
    seen = []
    mod = sys.modules["quack.gemm_interface"]
    for name in ("gemm_act", "gemm_dact"):
        fn = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _fn=fn, _name=name, **kw: seen.append((_name, kw["tuned"])) or _fn(*a, **kw))
    m, _ = pair(dim=16, hidden=32)
    for env, want in (("0", False), ("1", True)):
        monkeypatch.setenv("GENLAB_QUACK_TUNED", env)
        seen.clear()
        m(torch.randn(2, 3, 16, dtype=torch.float64, requires_grad=True)).sum().backward()
        assert seen == [("gemm_act", want), ("gemm_dact", want)]
