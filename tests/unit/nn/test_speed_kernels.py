"""Issue 5 speed switches against references on CPU: the fused LayerNorm+adaLN equals the unfused path (float64,
eager and compiled, values and gradients), forced SDPA backends are the same function, clipping folded into the
fused AdamW kernel gives the same update as clip-then-step, and the profiler summary of `genlab bench`."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_config

from genlab.families.image_flow.dit import DiT, DiTSpec
from genlab.nn.norm import norm_modulate_fused, norm_modulate_unfused
from genlab.runtime.parallel import clip_grads, fusable_grad_scale


def _inputs(dtype=torch.float64, B=3, N=5, D=16):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(B, N, D, generator=g, dtype=dtype) * 3 + 1).requires_grad_()
    sh = torch.randn(B, D, generator=g, dtype=dtype).requires_grad_()
    sc = torch.randn(B, D, generator=g, dtype=dtype).requires_grad_()
    return x, sh, sc


@pytest.mark.parametrize("compiled", [False, True])
def test_fused_adaln_equals_unfused_in_float64(compiled):
    fn = torch.compile(norm_modulate_fused, backend="aot_eager") if compiled else norm_modulate_fused
    x, sh, sc = _inputs()
    gy = torch.randn(3, 5, 16, dtype=torch.float64)
    ref = norm_modulate_unfused(x, sh, sc, 1e-6)
    ref_grads = torch.autograd.grad(ref, (x, sh, sc), gy)
    out = fn(x, sh, sc, 1e-6)
    grads = torch.autograd.grad(out, (x, sh, sc), gy)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.slow  # an inductor compile (~3 s on 2 cores); eager and aot_eager are checked fast above
def test_fused_adaln_compiled_path_is_the_same_function():
    """The expression inductor fuses (var_mean/rsqrt) against F.layer_norm, float64, through inductor."""
    x, sh, sc = _inputs()
    out = torch.compile(norm_modulate_fused)(x, sh, sc, 1e-6)
    torch.testing.assert_close(out, norm_modulate_unfused(x, sh, sc, 1e-6), rtol=1e-12, atol=1e-12)


def test_fused_adaln_returns_the_autocast_dtype_and_matches_fp32():
    x, sh, sc = _inputs(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = norm_modulate_fused(x, sh.bfloat16(), sc.bfloat16(), 1e-6)
        ref = norm_modulate_unfused(x, sh.bfloat16(), sc.bfloat16(), 1e-6)
    assert out.dtype == torch.bfloat16  # cast once to what the next matmul consumes
    torch.testing.assert_close(out.float(), ref.float(), rtol=1e-2, atol=1e-2)


def test_dit_gradients_are_the_same_with_fused_and_unfused_adaln():
    def grads(adaln):
        torch.manual_seed(0)
        m = DiT(DiTSpec(image_size=8, channels=1, num_classes=3, dim=32, depth=2, heads=2, adaln=adaln)).double()
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for b in m.blocks:
                b.ada[1].weight.normal_(0, 0.1, generator=g)
            m.final.ada[1].weight.normal_(0, 0.1, generator=g)
            m.final.linear.weight.normal_(0, 0.1, generator=g)
        x = torch.randn(4, 1, 8, 8, generator=g, dtype=torch.float64)
        t, y = torch.rand(4, generator=g, dtype=torch.float64), torch.randint(0, 3, (4,), generator=g)
        loss = F.mse_loss(m(x, t, y), torch.randn(4, 1, 8, 8, generator=g, dtype=torch.float64))
        loss.backward()
        return loss.detach(), {k: p.grad for k, p in m.named_parameters()}
    (l1, g1), (l2, g2) = grads("unfused"), grads("fused")
    torch.testing.assert_close(l1, l2, rtol=1e-12, atol=0)
    assert g1.keys() == g2.keys()
    for k in g1:
        torch.testing.assert_close(g1[k], g2[k], rtol=1e-9, atol=1e-12, msg=k)


def test_adaln_is_a_listed_switch_and_keeps_state_dict_keys(tmp_path):
    from genlab.core.errors import GenlabError
    from genlab.core.registry import all_registries
    assert {"fused", "unfused"} <= set(all_registries()["adaln"].names())
    with pytest.raises(GenlabError, match="adaln"):
        tiny_config(tmp_path, "model.adaln=triton_maybe")
    a = DiT(DiTSpec(image_size=8, channels=1, num_classes=3, dim=32, depth=2, heads=2, adaln="fused"))
    b = DiT(DiTSpec(image_size=8, channels=1, num_classes=3, dim=32, depth=2, heads=2, adaln="unfused"))
    assert list(a.state_dict()) == list(b.state_dict())


def test_compile_mode_is_a_listed_switch_handed_to_torch_compile(tmp_path, monkeypatch):
    from genlab.core.errors import GenlabError
    from genlab.core.registry import all_registries
    from genlab.runtime import switches
    assert set(all_registries()["compile_mode"].names()) == {
        "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"}
    with pytest.raises(GenlabError, match="compile_mode 'fast'.*max-autotune"):
        tiny_config(tmp_path, "train.compile_mode=fast")
    seen = []
    monkeypatch.setattr(switches.torch, "compile", lambda model, mode=None: seen.append(mode) or model)
    for mode, expected in (("default", None), ("max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs")):
        cfg = tiny_config(tmp_path, "train.compile=model", f"train.compile_mode={mode}")
        switches.compile_model_by_name(torch.nn.Linear(2, 2), cfg.train)
    assert seen == [None, "max-autotune-no-cudagraphs"]


@pytest.mark.parametrize("name", ["sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_contiguous"])
def test_forced_sdpa_backends_are_listed_and_compute_attention(name):
    from genlab.nn.attention_spec import attention_registry
    q, k, v = (torch.randn(2, 3, 7, 8) for _ in range(3))
    ref = attention_registry.get("math")(q, k, v)
    torch.testing.assert_close(attention_registry.get(name)(q, k, v), ref, rtol=1e-5, atol=1e-5)


def test_contiguous_qkv_attention_gives_the_same_gradients_through_the_fused_projection():
    from genlab.nn.attention import Attention
    torch.manual_seed(0)
    a, b = Attention(16, 4, backend="sdpa").double(), Attention(16, 4, backend="sdpa_contiguous").double()
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    for causal in (False, True):
        ya, yb = a(x, causal=causal), b(x, causal=causal)
        torch.testing.assert_close(ya, yb)
        ga = torch.autograd.grad(ya.square().sum(), list(a.parameters()))
        gb = torch.autograd.grad(yb.square().sum(), list(b.parameters()))
        for u, w in zip(ga, gb):
            torch.testing.assert_close(u, w)


# -- clipping folded into the fused AdamW kernel ------------------------------------------------------
@pytest.mark.parametrize("max_norm", [0.05, 100.0])  # clipping active / inactive
def test_clip_folded_into_fused_adamw_equals_clip_then_step(max_norm):
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU(), torch.nn.Linear(5, 3))
    b = copy.deepcopy(a)
    oa = torch.optim.AdamW(a.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    ob = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    assert fusable_grad_scale(ob) and not fusable_grad_scale(torch.optim.AdamW(a.parameters(), foreach=True))
    for step in range(4):
        x = torch.randn(9, 6)
        for m in (a, b):
            (m(x) ** 2).sum().backward()
        na = torch.nn.utils.clip_grad_norm_(a.parameters(), max_norm)
        oa.step()
        nb = clip_grads(b.parameters(), max_norm, ob)
        assert torch.is_tensor(ob.grad_scale)
        ob.step()
        torch.testing.assert_close(nb, na, rtol=1e-6, atol=0)
        for o in (oa, ob):
            o.zero_grad(set_to_none=True)
        for pa, pb in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(pb, pa, rtol=1e-6, atol=1e-7)
    clip_grads(b.parameters(), 0.0, ob)  # no clipping: the factor is removed again
    assert ob.grad_scale is None


def test_bench_profile_writes_a_kernel_summary(tmp_path):
    from genlab.lab.bench import kernel_category, run_bench
    cfg = tiny_config(tmp_path, "train.device=cpu", "train.batch_size=4")
    r = run_bench(cfg, steps=1, warmup=1, split_steps=1, profile_dir=tmp_path / "prof", profile_steps_n=1)
    assert (tmp_path / "prof" / "profile.md").exists() and r["profile"]["wall_ms_per_step"] > 0
    assert kernel_category("sm90_xmma_gemm_bf16bf16_bf16f32") == "matmul"
    assert kernel_category("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT") == "matmul"
    assert kernel_category("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel") == "attention"
    assert kernel_category("triton_per_fused_add_mul_native_layer_norm_0") == "fused elementwise/reduction (inductor)"
    assert kernel_category("triton_poi_fused__scaled_mm__to_copy_clamp_mul_reciprocal_7") == "fused elementwise/reduction (inductor)"
    assert kernel_category("triton_tem_fused_mm_3") == "matmul"
    assert kernel_category("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>") == "optimizer"
    assert kernel_category("ncclDevKernel_AllGather_RING_LL") == "communication"


def test_communication_overlap_matches_a_brute_force_count_on_a_grid():
    """Exposed communication = time covered by communication kernels when no compute kernel runs; checked against
    counting unit cells of a grid, on random overlapping spans (integer ends, so the count is exact)."""
    import random

    from genlab.lab.bench import communication_overlap
    rng = random.Random(0)
    for _ in range(200):
        spans = [[(a, a + rng.randint(1, 12)) for a in (rng.randint(0, 80) for _ in range(rng.randint(0, 8)))]
                 for _ in range(2)]
        comm, compute = spans
        got = communication_overlap(comm, compute)
        in_comm = [any(a <= t < z for a, z in comm) for t in range(100)]
        in_comp = [any(a <= t < z for a, z in compute) for t in range(100)]
        assert got["comm_us"] == sum(in_comm)
        assert got["exposed_us"] == sum(c and not k for c, k in zip(in_comm, in_comp))


def test_residual_switch_fp32_is_the_old_model_and_compute_keeps_the_stream_in_bf16():
    from genlab.core.registry import all_registries
    assert {"fp32", "compute"} <= set(all_registries()["residual"].names())
    spec = dict(image_size=8, channels=1, num_classes=3, dim=32, depth=2, heads=2)
    torch.manual_seed(0)
    a = DiT(DiTSpec(**spec, residual="fp32"))
    b = DiT(DiTSpec(**spec, residual="compute"))
    b.load_state_dict(a.state_dict())
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in (a, b):
            for blk in m.blocks:
                blk.ada[1].weight.copy_(torch.randn(blk.ada[1].weight.shape, generator=torch.Generator().manual_seed(2)) * 0.1)
    x, t, y = torch.randn(4, 1, 8, 8, generator=g), torch.rand(4, generator=g), torch.randint(0, 3, (4,), generator=g)
    seen = []
    hook = b.blocks[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ya, yb = a(x, t, y), b(x, t, y)
    hook.remove()
    assert seen == [torch.bfloat16]
    torch.testing.assert_close(yb.float(), ya.float(), rtol=0.05, atol=0.05)
    torch.testing.assert_close(a(x, t, y), b(x, t, y), rtol=0, atol=0)  # without autocast: the same model


def test_sync_sites_name_the_python_line_of_each_sync_warning():
    import inspect
    import warnings

    from genlab.lab.bench import recording_syncs
    with recording_syncs() as sites:
        warnings.warn("called a synchronizing CUDA operation")
        line = inspect.currentframe().f_lineno - 1
        with warnings.catch_warnings(record=True) as others:  # other warnings are left alone
            warnings.simplefilter("always")
            warnings.warn("something else")
            # what set_sync_debug_mode("warn") itself says: counting it read as one sync per step
            warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all "
                          "synchronizing operations")
    assert sites == [f"nn/test_speed_kernels.py:{line}"]  # the last two parts of the path
    assert [str(w.message)[:16] for w in others] == ["something else", "Synchronization "]


def test_a_sync_inside_a_library_names_the_genlab_line_that_called_it():
    from traceback import FrameSummary

    from genlab.lab.bench import sync_site
    stack = [FrameSummary("/x/genlab/bench.py", 10, "step"), FrameSummary("/x/genlab/training/step.py", 239, "f"),
             FrameSummary("/y/torch/nn/module.py", 5, "g"), FrameSummary("/y/torch/cuda/__init__.py", 1270, "h")]
    assert sync_site(stack) == "cuda/__init__.py:1270 <- training/step.py:239"
    assert sync_site(stack[:2]) == "training/step.py:239"


_HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy")


def _host_reads(fn, root: str) -> list[str]:
    """Calls that read a tensor's value back to the host (each one a device sync on CUDA), made by code under
    `root`, while fn runs: the CPU stand-in for CUDA's sync debug mode. Library-internal reads (torch's own CPU-side
    optimizer step counters) are left out: only the lines `root` controls are counted."""
    import traceback
    seen = []
    saved = {n: getattr(torch.Tensor, n) for n in _HOST_READS}

    def counting(name):
        def read(self, *a, **k):
            caller = traceback.extract_stack(limit=2)[0]
            if root in caller.filename:
                seen.append(f"{name} at {caller.filename.rsplit('/', 1)[-1]}:{caller.lineno}")
            return saved[name](self, *a, **k)
        return read
    try:
        for n in _HOST_READS:
            setattr(torch.Tensor, n, counting(n))
        fn()
    finally:
        for n, f in saved.items():
            setattr(torch.Tensor, n, f)
    return seen


def test_the_host_read_counter_sees_a_read_and_its_line():
    x = torch.ones(2)
    reads = _host_reads(lambda: (x.sum().item(), bool(x.sum() > 0)), root="tests/unit/nn/test_speed_kernels.py")
    assert [r.split(" at ")[0] for r in reads] == ["item", "__bool__"]


@pytest.mark.parametrize("preset,extra", [("digits_flow", []), ("digits_flow", ["method.name=meanflow"]),
                                          ("digits_flow", ["method.name=shortcut"]), ("text_ar", []), ("text_mdlm", [])])
def test_a_training_step_reads_no_tensor_back_to_the_host(preset, extra):
    """Issue 37: zero host syncs per step. On CUDA the bench counts them with the sync debug mode (tests/integration/test_gpu.py);
    here every value read genlab's own code makes inside a step (forward, backward, clipping, optimizer, EMA) is
    counted: a read there would be a sync on the GPU."""
    import os

    import genlab
    from genlab.config.tree import load_config
    from genlab.lab.bench import BenchStep
    cfg = load_config(preset, [*extra, "model.size=tiny", "train.device=cpu", "train.compile=off", "train.batch_size=8"])
    b = BenchStep(cfg)
    b.step()  # first step: lazy state (optimizer moments, EMA copies) is made here
    assert _host_reads(b.step, root=os.path.dirname(genlab.__file__)) == []
