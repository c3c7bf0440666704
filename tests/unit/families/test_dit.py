"""DiT backbone: patchify, adaLN-Zero init, bidirectional attention, analytic FLOPs."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from genlab.config.tree import ModelConfig
from genlab.families.image_flow.dit import DIT_SIZES, DiT, DiTBlock, DiTSpec, build_dit, depatchify, patchify


@pytest.mark.parametrize("p,C,H", [(1, 3, 4), (2, 1, 8), (2, 4, 32), (4, 3, 16)])
def test_patchify_depatchify_identity(p, C, H):
    x = torch.randn(3, C, H, H)
    tokens = patchify(x, p)
    assert tokens.shape == (3, (H // p) ** 2, p * p * C)
    assert torch.equal(depatchify(tokens, p, C, H, H), x)


def test_patchify_token_is_one_spatial_patch():
    x = torch.arange(2 * 4 * 4, dtype=torch.float).reshape(1, 2, 4, 4)
    tok = patchify(x, 2)
    # token 1 is the top-right 2x2 patch: rows 0-1, cols 2-3, channels last within a pixel
    expect = x[0, :, 0:2, 2:4].permute(1, 2, 0).reshape(-1)
    assert torch.equal(tok[0, 1], expect)


def test_adaln_zero_block_is_identity_at_init():
    torch.manual_seed(0)
    block = DiTBlock(64, 4)
    x, c = torch.randn(2, 10, 64), torch.randn(2, 64)
    assert torch.equal(block(x, c), x)


def test_dit_output_is_zero_at_init_and_shapes():
    spec = DiTSpec(image_size=8, channels=1, num_classes=10, dim=32, depth=2, heads=2)
    model = DiT(spec)
    x = torch.randn(4, 1, 8, 8)
    out = model(x, torch.rand(4), torch.tensor([0, 3, 9, 10]))  # 10 = null class
    assert out.shape == x.shape
    assert torch.count_nonzero(out) == 0  # final layer zero-initialised: adaLN-Zero DiT starts at v=0


def test_attention_is_bidirectional():
    torch.manual_seed(0)
    spec = DiTSpec(image_size=8, channels=1, num_classes=10, dim=32, depth=2, heads=2)
    model = DiT(spec)
    for p in model.parameters():  # leave the zero init so information can flow
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(1, 1, 8, 8)
    x2 = x.clone()
    x2[..., 6:, 6:] += 1.0  # change only the last patch
    t, y = torch.tensor([0.5]), torch.tensor([1])
    a, b = patchify(model(x, t, y), 2), patchify(model(x2, t, y), 2)
    assert not torch.allclose(a[:, 0], b[:, 0]), "the first token must see the last one (no causal mask)"


@pytest.mark.parametrize("size,patch,image,channels", [("tiny", 2, 8, 1), ("small", 4, 32, 3), ("S", 2, 16, 4)])
def test_flops_match_flop_counter(size, patch, image, channels):
    # the "math" backend spells attention as matmuls; the counter does not see CPU's fused SDPA kernel
    model = build_dit(ModelConfig(size=size, patch_size=patch, attention="math"),
                      {"image_size": image, "channels": channels, "num_classes": 10})
    B = 2
    x, t, y = torch.randn(B, channels, image, image), torch.rand(B), torch.randint(0, 10, (B,))
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        model(x, t, y)
    assert fc.get_total_flops() == B * model.flops_per_sample()


def test_named_sizes_match_the_paper():
    assert DIT_SIZES["B"] == (768, 12, 12) and DIT_SIZES["XL"] == (1152, 28, 16)
    with torch.device("meta"):  # shapes only: the count is the same, without allocating and initialising 675M weights
        model = build_dit(ModelConfig(size="XL", patch_size=2), {"image_size": 32, "channels": 4, "num_classes": 1000})
    n = sum(p.numel() for p in model.parameters())
    assert 670e6 < n < 680e6  # DiT-XL/2: 675M parameters
