"""The Triton sigmoid-attention kernels (CUDA path of `model.attention=sigmoid`) against a float64 reference.

On CPU the kernels run under the Triton interpreter (TRITON_INTERPRET=1) in a subprocess, as in
test_triton_attention.py (the variable must be set before the kernels are defined); the interpreter runs
16x16 blocks, so the sizes below cross block edges. Skipped cleanly when triton is not installed. The `gpu`
tests check the compiled kernels in bf16 at 256, 258 and 4096 tokens and under torch.compile.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
HAS_TRITON = importlib.util.find_spec("triton") is not None

# (B, H, N, M, D, causal, dtype, fused-qkv strides); fused needs N == M
CASES = [
    (1, 2, 37, 37, 32, False, "float32", True),
    (1, 1, 37, 37, 64, True, "float32", False),
    (2, 1, 1, 1, 32, False, "float32", False),
    (1, 1, 1, 19, 32, True, "float32", False),       # one query sees every key (causal offset M - N)
    (1, 1, 21, 45, 32, True, "bfloat16", False),     # cross-attention sizes, more keys than queries
    (1, 1, 45, 21, 64, True, "float32", False),      # fewer keys: the first 24 queries see none
    (1, 1, 30, 50, 64, False, "bfloat16", False),
    (1, 1, 130, 130, 32, True, "bfloat16", True),
    (1, 1, 64, 64, 32, False, "float16", False),     # block multiples: the unmasked (EVEN) loads
]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def make_qkv(B, H, N, M, D, dtype, fused, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    if fused:  # the views Attention makes of one [B, N, 3*H*D] projection: non-contiguous, unit last stride
        assert N == M
        qkv = torch.randn(B, N, 3, H, D, generator=g, device=device).to(dtype)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
    else:
        q = torch.randn(B, H, N, D, generator=g, device=device).to(dtype)
        k, v = (torch.randn(B, H, M, D, generator=g, device=device).to(dtype) for _ in range(2))
    return [t.detach().requires_grad_(True) for t in (q, k, v)]


def check_case(B, H, N, M, D, causal, dtype, fused, tol, device="cpu", q_scale=1.0):
    """Forward and dq/dk/dv of the kernels vs float64 `sigmoid_attention_plain`; returns the errors."""
    from genlab.nn.attention import sigmoid_attention_plain
    from genlab.nn.triton_sigmoid import sigmoid_attention_triton
    dt = getattr(torch, dtype)
    q, k, v = make_qkv(B, H, N, M, D, dt, fused, device=device, seed=N * D + M)
    if q_scale != 1.0:  # logits far past the exponent cap of the kernels' sigmoid (|x| log2 e > 100)
        q = (q.detach() * q_scale).requires_grad_(True)
    out = sigmoid_attention_triton(q, k, v, causal=causal)
    assert out.shape == (B, H, N, D) and out.dtype == dt
    do = torch.randn(out.shape, generator=torch.Generator(device=device).manual_seed(1), device=device).to(dt)
    out.backward(do)
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref = sigmoid_attention_plain(q64, k64, v64, causal=causal)
    ref.backward(do.double())
    if causal and N > M:  # queries that see no key: exactly zero
        assert (out[..., : N - M, :] == 0).all()
    errs = {"out": rel(out, ref), "dq": rel(q.grad, q64.grad), "dk": rel(k.grad, k64.grad), "dv": rel(v.grad, v64.grad)}
    for name, e in errs.items():
        assert e == e and e < tol, f"{name} rel. error {e:.2e} >= {tol} for {(B, H, N, M, D, causal, dtype, fused)}"
    return errs


def _interpreter_main():
    """Run every case under the interpreter (this file executed as a script with TRITON_INTERPRET=1)."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from test_triton_attention import _patch_interpreter_bf16_dot
    _patch_interpreter_bf16_dot()
    torch.manual_seed(0)
    for case in CASES:
        errs = check_case(*case, tol={"bfloat16": 2e-2, "float16": 3e-3}.get(case[6], 1e-5))
        print(case, " ".join(f"{k}={v:.1e}" for k, v in errs.items()), flush=True)
    errs = check_case(1, 1, 40, 40, 32, False, "float32", False, tol=1e-5, q_scale=40.0)
    print("large logits", " ".join(f"{k}={v:.1e}" for k, v in errs.items()), flush=True)
    check_compile()
    print("OK")


def check_compile():
    """torch.compile (aot_eager: the fake impls and the autograd rule) traces the op in one graph, no break."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from genlab.nn.triton_sigmoid import sigmoid_attention_triton, supports

    def block(q, k, v):
        assert supports(q, k, v)
        return sigmoid_attention_triton(q * 2, k, v, causal=True).transpose(1, 2).sum(-1)

    q, k, v = make_qkv(1, 2, 20, 20, 32, torch.float32, fused=True)
    eager = block(q, k, v)
    g_eager = torch.autograd.grad(eager.square().sum(), (q, k, v))
    counter = CompileCounterWithBackend("aot_eager")
    out = torch.compile(block, backend=counter, fullgraph=True)(q, k, v)
    g = torch.autograd.grad(out.square().sum(), (q, k, v))
    assert counter.frame_count == 1, counter.frame_count
    torch.testing.assert_close(out, eager)
    for a, b in zip(g, g_eager):
        torch.testing.assert_close(a, b)
    print("torch.compile: one graph, matches eager", flush=True)


@pytest.mark.slow  # the Triton interpreter: tens of seconds on 2 cores; the full suite runs it
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_triton_sigmoid_interpreter_matches_float64_reference():
    from test_triton_attention import run_under_interpreter
    run_under_interpreter(__file__)


def test_sigmoid_entry_stays_plain_on_cpu_and_names_the_triton_path():
    """On CPU the registry entry never touches triton (import genlab must not import it either)."""
    from genlab.nn.attention import sigmoid_attention, sigmoid_attention_plain
    from genlab.nn.attention_spec import attention_registry
    from genlab.nn.triton_sigmoid import supports
    q, k, v = (torch.randn(1, 2, 5, 32) for _ in range(3))
    torch.testing.assert_close(sigmoid_attention(q, k, v), sigmoid_attention_plain(q, k, v))
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        assert not supports(q, k, v)  # CPU tensors: not the Triton path
    assert "Triton" in attention_registry.doc("sigmoid") and "Flex" in attention_registry.doc("sigmoid_flex")
    code = "import sys, genlab.nn; print('genlab.nn.triton_sigmoid_kernels' in sys.modules, 'triton' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    kernels, triton = r.stdout.split()
    assert kernels == "False" and (triton == "False" or torch.cuda.is_available()), r.stdout  # torch may load triton on GPU hosts


def test_without_triton_both_kernel_paths_refuse_in_one_line(monkeypatch):
    """No importable triton: the softmax backend's check and the sigmoid op name the package and the import error."""
    import sys

    from genlab.core.errors import GenlabError
    from genlab.nn import triton_attention, triton_sigmoid
    monkeypatch.setitem(sys.modules, "triton", None)
    for name in ("triton_attention_kernels", "triton_sigmoid_kernels"):
        monkeypatch.delitem(sys.modules, f"genlab.nn.{name}", raising=False)
    monkeypatch.setattr(triton_attention, "_LOADED", {})
    with pytest.raises(GenlabError, match=r"needs the 'triton' package \(ModuleNotFoundError: .*valid choices"):
        triton_attention.check_available(64)
    q = torch.randn(1, 1, 4, 64)
    assert not triton_sigmoid.triton_available()
    with pytest.raises(GenlabError, match=r"Triton path needs the 'triton' package \(ModuleNotFoundError: "):
        triton_sigmoid._check(q, q, q)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("case, needle", [("head_dim", "D in (32, 64, 128)"), ("kv_shape", "k, v [B, H, M, D]"),
                                          ("dtype", "of one dtype"), ("float64", "fp16/bf16/fp32")])
def test_unsupported_inputs_are_refused_by_the_op_and_routed_away_by_supports(monkeypatch, case, needle):
    """The op's one-line errors and `supports` read the same shape and dtype rules (here under the interpreter,
    so only the inputs decide)."""
    from genlab.core.errors import GenlabError
    from genlab.nn import triton_sigmoid
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q = k = v = torch.randn(1, 2, 8, 32)
    if case == "head_dim":
        q = k = v = torch.randn(1, 2, 8, 48)
    elif case == "kv_shape":
        k = torch.randn(1, 2, 8, 32)[..., :8, :]
        v = torch.randn(1, 2, 6, 32)
    elif case == "dtype":
        v = v.half()
    else:
        q = k = v = q.double()
    assert triton_sigmoid.supports(torch.randn(1, 2, 8, 32), torch.randn(1, 2, 5, 32), torch.randn(1, 2, 5, 32))
    assert not triton_sigmoid.supports(q, k, v)
    with pytest.raises(GenlabError, match=re.escape(needle)):
        triton_sigmoid._check(q, k, v)


# ----------------------------------------------------------------------------------------------
# GPU: compiled kernels in bf16 at DiT sizes, and through torch.compile
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs CUDA and triton")
@pytest.mark.parametrize("n", [256, 258, 4096])
@pytest.mark.parametrize("causal", [False, True])
def test_triton_sigmoid_gpu_matches_reference(monkeypatch, n, causal):
    """bf16 kernels vs float64 at 256/258/4096 tokens (fused qkv views), as close as the bf16 plain-torch path."""
    from genlab.nn.attention import sigmoid_attention, sigmoid_attention_plain
    from genlab.nn.triton_sigmoid import supports
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    B = max(1, 8192 // n)
    q, k, v = make_qkv(B, 12, n, n, 64, torch.bfloat16, fused=True, device="cuda")
    assert supports(q, k, v)
    do = torch.randn(B, 12, n, 64, device="cuda", dtype=torch.bfloat16)
    got = [sigmoid_attention(q, k, v, causal=causal)]  # the registry entry takes the Triton path on CUDA
    got += list(torch.autograd.grad(got[0], (q, k, v), do))
    base = [sigmoid_attention_plain(q, k, v, causal=causal)]
    base += list(torch.autograd.grad(base[0], (q, k, v), do))
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref = [sigmoid_attention_plain(q64, k64, v64, causal=causal)]
    ref += list(torch.autograd.grad(ref[0], (q64, k64, v64), do.double()))
    for name, a, b, r in zip(("out", "dq", "dk", "dv"), got, base, ref):
        ea, eb = rel(a, r), rel(b, r)
        assert ea == ea and ea <= 2 * eb + 2e-3, f"{name}: triton {ea:.2e} vs plain bf16 {eb:.2e} (n={n}, causal={causal})"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs CUDA and triton")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_triton_sigmoid_gpu_cross_attention_and_fp32(monkeypatch, dtype):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for N, M, D, causal in ((100, 333, 32, True), (333, 100, 128, True), (77, 200, 64, False), (1, 1, 64, False)):
        check_case(2, 3, N, M, D, causal, dtype, False, tol=2e-2 if dtype == "bfloat16" else 1e-5, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs CUDA and triton")
def test_triton_sigmoid_under_torch_compile_has_no_graph_break(monkeypatch):
    """A small attention module compiles in one graph (custom op with a fake impl) and matches eager."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    from genlab.nn.attention import Attention
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    torch.manual_seed(0)
    layer = Attention(768, 12, backend="sigmoid").cuda()
    x = torch.randn(4, 258, 768, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager = layer(x)
    g_eager = torch.autograd.grad(eager.float().square().mean(), x)[0]
    torch._dynamo.reset()
    counter = CompileCounter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        torch.compile(layer, backend=counter, fullgraph=True)(x)
    assert counter.frame_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(layer)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = compiled(x)
    g = torch.autograd.grad(out.float().square().mean(), x)[0]
    assert rel(out, eager) < 2e-2 and rel(g, g_eager) < 3e-2, (rel(out, eager), rel(g, g_eager))


if __name__ == "__main__":
    _interpreter_main()
