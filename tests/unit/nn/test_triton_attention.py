"""The Triton flash-attention backend (`model.attention=triton`) against a float64 math reference.

On CPU the kernels run under the Triton interpreter (TRITON_INTERPRET=1) in a subprocess (the variable
must be set before the kernels are defined, and a GPU test in the same session needs them compiled);
skipped cleanly when triton is not installed. The `gpu` test checks the compiled kernels at the real
long-sequence shape against SDPA.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[3]
HAS_TRITON = importlib.util.find_spec("triton") is not None

# (B, H, N, D, causal, dtype, bwd mode, fused-qkv strides): N not a multiple of the interpreter's 32-blocks
CASES = [
    (1, 2, 80, 16, False, "bfloat16", "split", True),
    (2, 1, 50, 32, False, "float16", "split", False),
    (1, 1, 48, 64, False, "bfloat16", "split", False),
    (1, 2, 70, 16, True, "bfloat16", "split", True),
    (1, 2, 80, 16, False, "bfloat16", "atomic", False),
    (1, 1, 45, 32, True, "float16", "atomic", False),
]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def make_qkv(B, H, N, D, dtype, fused, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    if fused:  # the views Attention makes of one [B, N, 3*H*D] projection: non-contiguous, unit last stride
        qkv = torch.randn(B, N, 3, H, D, generator=g, device=device).to(dtype)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
    else:
        q, k, v = (torch.randn(B, H, N, D, generator=g, device=device).to(dtype) for _ in range(3))
    return [t.detach().requires_grad_(True) for t in (q, k, v)]


def check_case(B, H, N, D, causal, dtype, bwd, fused, tol):
    """Forward and dq/dk/dv of the triton backend vs float64 `math_attention`; returns the errors."""
    from genlab.nn.attention import math_attention
    from genlab.nn.triton_attention import flash_attention
    os.environ["GENLAB_TRITON_ATTN_BWD"] = bwd
    dt = getattr(torch, dtype)
    q, k, v = make_qkv(B, H, N, D, dt, fused, seed=N * D + B)
    out = flash_attention(q, k, v, causal=causal)
    assert out.shape == (B, H, N, D) and out.dtype == dt
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(dt)
    out.backward(do)
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    ref = math_attention(q64, k64, v64, causal=causal)
    ref.backward(do.double())
    errs = {"out": rel(out, ref), "dq": rel(q.grad, q64.grad), "dk": rel(k.grad, k64.grad), "dv": rel(v.grad, v64.grad)}
    for name, e in errs.items():
        assert e == e and e < tol, f"{name} rel. error {e:.2e} >= {tol} for {(B, H, N, D, causal, dtype, bwd, fused)}"
    return errs


def _patch_interpreter_bf16_dot():
    """Triton's interpreter (3.9) stores bf16 as uint16 bit patterns and its `dot` multiplies those integers;
    widen bf16 operands to float32 (exact) first. A no-op for other dtypes."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as I
    orig = I.InterpreterBuilder.create_dot

    def widen(h):
        if h.dtype.scalar != tl.bfloat16:
            return h
        return I.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def create_dot(self, a, b, d, *args, **kw):
        return orig(self, widen(a), widen(b), d, *args, **kw)
    I.InterpreterBuilder.create_dot = create_dot


def _interpreter_main():
    """Run every case under the interpreter (this file executed as a script with TRITON_INTERPRET=1)."""
    assert os.environ.get("TRITON_INTERPRET") == "1"
    _patch_interpreter_bf16_dot()
    torch.manual_seed(0)
    for case in CASES:
        errs = check_case(*case, tol=1.5e-2 if case[5] == "bfloat16" else 2e-3)
        print(case, " ".join(f"{k}={v:.1e}" for k, v in errs.items()), flush=True)
    print("OK")


@pytest.mark.slow  # the Triton interpreter
@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_triton_attention_interpreter_matches_float64_reference():
    run_under_interpreter(__file__)


def run_under_interpreter(script):
    """Run a test file as a script with TRITON_INTERPRET=1 (set before any kernel is defined); it prints OK last."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="2")
    r = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    print(r.stdout)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("OK"), r.stdout[-3000:] + r.stderr[-3000:]


def test_triton_backend_refuses_clearly_without_cuda(monkeypatch):
    from genlab.core.errors import GenlabError
    from genlab.nn import triton_attention as T
    from genlab.nn.attention import Attention
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if not torch.cuda.is_available():  # no CUDA (or no triton): one line that names the valid choices
        with pytest.raises(GenlabError, match=r"valid choices.*sdpa") as e:
            Attention(64, 4, backend="triton")
        assert "\n" not in str(e.value)
    if T._kernels() is not None or torch.cuda.is_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        with pytest.raises(GenlabError, match=r"head dims .*got 8.*valid choices"):
            Attention(64, 8, backend="triton")  # head dim 8 is not supported


def test_triton_backend_is_registered():
    import genlab.nn  # noqa: F401
    from genlab.config.tree import load_config
    from genlab.nn.attention_spec import attention_registry
    assert "triton" in attention_registry
    assert load_config("bench_longseq", ["model.attention=triton"]).model.attention == "triton"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_TRITON, reason="needs CUDA and triton")
@pytest.mark.parametrize("exp_mode", ["0", "2"])
@pytest.mark.parametrize("bwd", ["split", "atomic"])
def test_triton_attention_gpu_matches_sdpa_at_long_sequence(monkeypatch, exp_mode, bwd):
    """Compiled kernels at the bench_longseq shape (N=16384, D=16; 2 heads): as close to an fp32 reference as SDPA."""
    import torch.nn.functional as F

    from genlab.nn.triton_attention import flash_attention
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("GENLAB_TRITON_ATTN_EXP", exp_mode)
    monkeypatch.setenv("GENLAB_TRITON_ATTN_BWD", bwd)
    monkeypatch.setenv("GENLAB_TRITON_ATTN_TUNE", "0")  # the kernels' math, not the tuner (bench_attention.py checks tuned ones)
    for causal, fused in ((False, True), (True, False)):
        q, k, v = make_qkv(1, 2, 16384, 16, torch.bfloat16, fused, device="cuda")
        do = torch.randn(1, 2, 16384, 16, device="cuda", dtype=torch.bfloat16)
        out = flash_attention(q, k, v, causal=causal)
        out.backward(do)
        got = [out, q.grad, k.grad, v.grad]
        for t in (q, k, v):
            t.grad = None
        sd = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        sd.backward(do)
        base = [sd, q.grad, k.grad, v.grad]
        q32, k32, v32 = (t.detach().float().requires_grad_(True) for t in (q, k, v))
        ref = F.scaled_dot_product_attention(q32, k32, v32, is_causal=causal)
        ref.backward(do.float())
        refs = [ref, q32.grad, k32.grad, v32.grad]
        for name, a, b, r in zip(("out", "dq", "dk", "dv"), got, base, refs):
            ea, eb = rel(a, r), rel(b, r)
            assert ea == ea and ea <= 2 * eb + 2e-3, f"{name}: triton {ea:.2e} vs sdpa {eb:.2e} (causal={causal})"


if __name__ == "__main__":
    _interpreter_main()
