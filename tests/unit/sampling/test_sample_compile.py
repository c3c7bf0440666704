"""eval.sample_compile: the evaluation's network compiled (and on CUDA replayed as graphs) draws the samples the eager
network draws; it is built once per model and mode; the block cache, which hooks the blocks, is refused beside it."""
from __future__ import annotations

import pytest
import torch
from conftest import analyze_model, cli_in_process

from genlab.sampling.images import compiled_for_sampling, sample_images


def test_off_and_a_training_compiled_model_are_used_as_they_are_and_each_mode_is_built_once(monkeypatch):
    from types import SimpleNamespace

    from genlab.families.image_flow import flow
    model, method = analyze_model("dit")
    assert compiled_for_sampling(model, "off") is model
    net = compiled_for_sampling(model, "default")
    assert net is not model and net._orig_mod is model
    assert compiled_for_sampling(net, "default") is net  # already compiled (train.compile=model): left alone
    graphed = compiled_for_sampling(model, "reduce-overhead")
    assert graphed is not net and graphed.module._orig_mod is model
    # one build per model and mode: a run's later evaluations reuse the network its first one built
    built, used = [], []
    monkeypatch.setattr(flow, "compiled_for_sampling", lambda m, mode: built.append((m, mode)) or (m, mode))
    monkeypatch.setattr(flow, "generate", lambda method, net, *a: used.append(net))
    ctx = {"eval": SimpleNamespace(sample_compile="default", batch_size=4)}
    for _ in range(3):
        method.pixels(model, ctx)(torch.arange(4))
    assert built == [(model, "default")] and used == [(model, "default")] * 3


@pytest.mark.slow
@pytest.mark.parametrize("sampler, mode", [("euler", "default"), ("heun", "reduce-overhead")])
def test_compiled_sampling_draws_the_eager_samples(sampler, mode):
    """Guided (one batched forward of both halves), in two batches; Heun keeps its first velocity across the second
    network call, which a graph replay would overwrite without its copy. On the CPU inductor's C++ kernels sum in
    another order than eager's: equal to float32 rounding."""
    model, method = analyze_model("dit")
    labels = torch.arange(8) % 4

    def draw(net):
        return sample_images(method, net, labels, steps=3, cfg_scale=2.0, sampler=sampler, batch=4,
                             generator=torch.Generator().manual_seed(3), device="cpu")
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    want, got = draw(model), draw(compiled_for_sampling(model, mode))
    assert counters["stats"]["unique_graphs"] >= 1  # it did run compiled
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_replayed_sampling_on_cuda_draws_the_eager_samples_under_bf16():
    """reduce-overhead on CUDA: cudagraph trees replay the forward; Heun's two calls per step must not share a buffer."""
    model, method = analyze_model("dit")
    model = model.cuda()
    labels = (torch.arange(16) % 4).cuda()

    def draw(net):
        with torch.autocast("cuda", torch.bfloat16):
            return sample_images(method, net, labels, steps=4, cfg_scale=2.0, sampler="heun", batch=8,
                                 generator=torch.Generator("cuda").manual_seed(3), device="cuda").float()
    torch._dynamo.reset()
    want, got = draw(model), draw(compiled_for_sampling(model, "reduce-overhead"))
    assert (got - want).abs().max() < 0.05  # bf16 rounding of the two compiled-vs-eager orders over 8 evaluations


def test_sample_compile_beside_the_block_cache_is_refused_before_training(tmp_path, capfd):
    r = cli_in_process(capfd, "train", "digits_flow", "model.depth=4", "method.cache_blocks=1",
                       "eval.sample_compile=default", f"train.out_dir={tmp_path}", "train.name=bad")
    assert r.returncode == 2 and "eval.sample_compile=default compiles the whole network" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and not (tmp_path / "bad").exists()
    r = cli_in_process(capfd, "train", "digits_flow", "eval.sample_compile=fast", f"train.out_dir={tmp_path}", "train.name=bad")
    assert r.returncode == 2 and "reduce-overhead" in r.stderr and not (tmp_path / "bad").exists(), r.stderr
