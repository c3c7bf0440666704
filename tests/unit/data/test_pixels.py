"""genlab.data.pixels: the one uint8 <-> [-1, 1] mapping every loader, sampler and metric uses."""
import torch

from genlab.data.pixels import quantize, to_model, to_pixels


def test_every_level_round_trips_and_matches_the_formula():
    levels = torch.arange(256, dtype=torch.uint8)
    x = to_model(levels.view(1, 16, 16, 1))
    assert x.shape == (1, 1, 16, 16) and x.dtype == torch.float32
    assert torch.equal(x.flatten(), levels.float() / 127.5 - 1)  # the formula, in float32 as before
    assert x.min() == -1 and x.max() == 1
    assert torch.equal(to_pixels(x).flatten(), levels)


def test_layouts_move_only_the_channel_axis():
    u8 = torch.randint(0, 256, (2, 3, 5, 7, 4), dtype=torch.uint8)  # [..., H, W, C] with two leading dims
    x = to_model(u8)
    assert x.shape == (2, 3, 4, 5, 7)
    assert torch.equal(x[1, 2, 3], u8[1, 2, ..., 3].float() / 127.5 - 1)
    assert torch.equal(to_pixels(x), u8)


def test_out_of_range_values_clamp_and_quantize_lands_on_the_grid():
    x = torch.tensor([-1.7, -1.0, -0.0039, 0.0, 0.5, 1.0, 2.0]).view(1, 7, 1)  # [C=1, H=7, W=1]
    assert to_pixels(x).flatten().tolist() == [0, 0, 127, 128, 191, 255, 255]  # 127.5 rounds half to even
    q = quantize(torch.linspace(-1.2, 1.2, 101))
    assert q.min() == -1 and q.max() == 1
    assert torch.equal(quantize(q), q)  # idempotent: already on the grid
    assert torch.allclose((q + 1) * 127.5, ((q + 1) * 127.5).round(), atol=1e-4)
    assert quantize(torch.zeros(3, dtype=torch.bfloat16)).dtype == torch.bfloat16  # frames keep their dtype
