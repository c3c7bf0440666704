"""Evaluation sampling at FID scale: batches come back to the CPU without the loop waiting on the device (each batch's
decode and copy on a side stream, into pinned memory), the same pixels as drawing, mapping and copying in line, and
no host synchronisation that grows with the number of batches."""
from __future__ import annotations

import warnings

import pytest
import torch
from conftest import analyze_model

from genlab.data.pixels import to_pixels
from genlab.sampling.images import sample_images
from genlab.sampling.samplers import time_grid


def draw(method, model, labels, device, **kw):
    return sample_images(method, model, labels, steps=3, cfg_scale=2.0, sampler="euler", batch=4, device=device,
                         generator=torch.Generator(device).manual_seed(5), **kw)


def test_to_cpu_in_line_gives_the_mapped_batches_of_the_plain_draw():
    model, method = analyze_model("dit")
    labels = torch.arange(10) % 4  # a last, smaller batch
    want = to_pixels(draw(method, model, labels, "cpu"))
    got = draw(method, model, labels, "cpu", post=to_pixels, to_cpu=True)
    assert got.dtype == torch.uint8 and got.shape == want.shape and len(got) == 10 and torch.equal(got, want)


def test_the_time_grid_is_the_same_on_every_device():
    want = time_grid(7, "cpu", "shifted")
    assert want[0] == 0 and want[-1] == 1 and len(want) == 8
    if torch.cuda.is_available():
        torch.testing.assert_close(time_grid(7, "cuda", "shifted").cpu(), want, rtol=0, atol=0)


needs_cuda = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_compiled_caller_gets_the_same_cuda_time_grid():
    """torch.compile over a whole generation (bench_world.py's compiled rows) traces time_grid: the pinned copy is
    skipped there, where fake tensors cannot be pinned."""
    grid = torch.compile(lambda x: x + time_grid(7, "cuda", "shifted").sum())(torch.zeros((), device="cuda"))
    torch.testing.assert_close(grid.cpu(), time_grid(7, "cpu", "shifted").sum())


@pytest.mark.parametrize("n,interval", [pytest.param(n, i, marks=needs_cuda) for n, i in
                                        ((4, (0.0, 1.0)), (16, (0.0, 1.0)), (16, (0.3, 0.7)))])
def test_overlapped_batches_on_cuda_match_the_in_line_copy_and_sync_once(n, interval):
    """Side-stream decode + pinned copies give the bytes of `.cpu()` per batch; counted with torch's sync debug mode,
    the whole draw synchronises the host at most once, for 1 batch or 4, and with a limited guidance interval (its
    one-or-two-forward choice per call comes from the host's guidance plan)."""
    model, method = analyze_model("dit")
    method.cfg_interval = interval
    model = model.cuda()
    labels = (torch.arange(n) % 4).cuda()
    want = draw(method, model, labels, "cuda", post=lambda x: to_pixels(x).cpu())
    draw(method, model, labels, "cuda", post=to_pixels, to_cpu=True)  # warm-up: first-call allocations
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            got = draw(method, model, labels, "cuda", post=to_pixels, to_cpu=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # only the per-operation warnings count; the mode's own "prototype feature" notice comes once per process
    syncs = [w for w in caught if "called a synchronizing" in str(w.message)]
    assert got.device.type == "cpu" and torch.equal(got, want)
    assert len(syncs) <= 1, [str(w.message) for w in syncs]
