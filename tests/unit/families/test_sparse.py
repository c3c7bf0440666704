"""Sparse Transformer (Child et al. 2019): patterns against the paper's set definitions, kernels against
the dense reference, data embeddings, section-6 initialisation, bits/dim, completion, training."""
import json
import math

import numpy as np
import pytest
import torch

from genlab.core.errors import GenlabError
from genlab.families.sparse.sparse_transformer import SparseSpec, SparseTransformer, image_to_seq, raster_coords, seq_to_image
from genlab.nn.sparse_attention import (
    MaskCache,
    Part,
    attend,
    block_density,
    density_report,
    layer_groups,
    make_block_mask,
    sparse_pattern_registry,
)

PATTERNS = ("dense", "strided", "fixed")


# -- brute force from the paper's set definitions (genlab.nn.sparse_attention's docstring) --------------------
def reference_sets(pattern: str, part: int | None, n: int, l: int, c: int, groups: int = 1) -> list[set]:
    """A_i for every i, built literally from the definitions above with Python sets and loops.
    part None = the union of the parts (merged); dense has one part; fixed has 1 + groups."""
    def strided(i):
        a1 = set(range(max(0, i - l), i + 1))
        a2 = {j for j in range(i + 1) if (i - j) % l == 0}
        return [a1, a2]

    def fixed(i):
        a1 = {j for j in range(i + 1) if j // l == i // l}
        subs = [set(range(l - (g + 1) * c, l - g * c)) for g in range(groups)]
        return [a1] + [{j for j in range(i + 1) if j % l in sub} | {i} for sub in subs]

    def dense(i):
        return [set(range(i + 1))]
    fn = {"strided": strided, "fixed": fixed, "dense": dense}[pattern]
    out = []
    for i in range(n):
        sets = fn(i)
        out.append(set().union(*sets) if part is None else sets[part])
    return out


def reference_mask(pattern: str, part: int | None, n: int, l: int, c: int, groups: int = 1) -> torch.Tensor:
    m = torch.zeros(n, n, dtype=torch.bool)
    for i, s in enumerate(reference_sets(pattern, part, n, l, c, groups)):
        m[i, sorted(s)] = True
    return m


def tiny(pattern="strided", mode="split", size=4, channels=2, dim=32, depth=2, heads=2, **kw):
    torch.manual_seed(0)
    return SparseTransformer(SparseSpec(image_size=size, channels=channels, dim=dim, depth=depth, heads=heads,
                                        pattern=pattern, mode=mode, **kw))


def randomize_head(model):
    torch.nn.init.normal_(model.head.weight, std=0.5)  # zero-init logits would hide most differences
    return model


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("n,l,c", [(17, 4, 1), (64, 8, 2), (100, 7, 3), (50, 10, 10)])
def test_every_part_equals_brute_force_paper_definition(pattern, n, l, c):
    parts = sparse_pattern_registry.get(pattern)(l, c)
    for k, part in enumerate(parts):
        assert torch.equal(part.dense_mask(n), reference_mask(pattern, k, n, l, c)), part.name


@pytest.mark.parametrize("n,l,c,groups", [(64, 8, 2, 2), (100, 12, 3, 4), (50, 10, 3, 3)])
def test_summary_groups_equal_the_definition_and_split_their_heads(n, l, c, groups):
    """fixed with g summary groups: part s sees the cells l-(s+1)c .. l-sc-1 of every block (brute force), the
    summary heads are divided among the groups in every mode, and all parts together cover the merged union."""
    parts = sparse_pattern_registry.get("fixed")(l, c, groups)
    assert len(parts) == 1 + groups and [p.factor for p in parts] == [0] + [1] * groups
    for k, part in enumerate(parts):
        assert torch.equal(part.dense_mask(n), reference_mask("fixed", k, n, l, c, groups)), part.name
    heads = 2 * groups
    split = layer_groups("fixed", "split", l, c, depth=1, heads=heads, groups=groups)[0]
    assert [(h, p.name) for h, p in split] == [(groups, "fixed/block")] + [(1, p.name) for p in parts[1:]]
    inter = layer_groups("fixed", "interleaved", l, c, depth=2, heads=heads, groups=groups)
    assert [(h, p.name) for h, p in inter[1]] == [(2, p.name) for p in parts[1:]]
    (h, merged), = layer_groups("fixed", "merged", l, c, depth=1, heads=heads, groups=groups)[0]
    assert torch.equal(merged.dense_mask(n), reference_mask("fixed", None, n, l, c, groups))
    seen = torch.zeros(n, n, dtype=torch.bool)
    for _, part in split:
        seen |= part.dense_mask(n)
    assert torch.equal(seen, merged.dense_mask(n))


def test_summary_groups_flex_and_blocked_equal_dense_and_bad_settings_are_refused():
    n, l, c, groups = 200, 16, 3, 3
    cache = MaskCache()
    q, k, v = torch.randn(2, 2, n, 8), torch.randn(2, 2, n, 8), torch.randn(2, 2, n, 8)
    for part in sparse_pattern_registry.get("fixed")(l, c, groups):
        for b in ("dense", "flex", "blocked"):
            cache.build([part], n, "cpu", b)
        ref = attend(q, k, v, part, cache, "dense", 0.3)
        for b in ("flex", "blocked"):
            torch.testing.assert_close(attend(q, k, v, part, cache, b, 0.3), ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(GenlabError, match="groups \\* c <= l"):
        layer_groups("fixed", "split", 8, 3, depth=1, heads=6, groups=3)
    with pytest.raises(GenlabError, match="sparse_pattern=fixed"):
        layer_groups("strided", "split", 8, 2, depth=1, heads=4, groups=2)
    with pytest.raises(GenlabError, match="summary factor gets 1 of 2 heads"):
        layer_groups("fixed", "split", 8, 2, depth=1, heads=2, groups=2)
    model = randomize_head(tiny("fixed", "split", size=6, channels=2, heads=4, stride=12, summary=3, summary_groups=2)).eval()
    idx = torch.randint(0, 257, (2, model.spec.seq_len))
    with torch.no_grad():
        torch.testing.assert_close(model(idx, backend="blocked"), model(idx, backend="dense"), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("mode", ("interleaved", "merged", "split"))
def test_modes_assign_parts_to_layers_and_heads(pattern, mode):
    n, l, c = 48, 6, 2
    groups = layer_groups(pattern, mode, l, c, depth=3, heads=4)
    for r, g in enumerate(groups):
        assert sum(h for h, _ in g) == 4
        seen = torch.zeros(n, n, dtype=torch.bool)
        for _, part in g:
            seen |= part.dense_mask(n)
        n_parts = 1 if pattern == "dense" else 2
        if mode == "interleaved" and n_parts == 2:
            want = reference_mask(pattern, r % 2, n, l, c)
        else:  # merged and split both cover the union of the parts in every layer
            want = reference_mask(pattern, None if n_parts == 2 else 0, n, l, c)
        assert torch.equal(seen, want)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_no_position_sees_its_future(pattern):
    for part in sparse_pattern_registry.get(pattern)(5, 2):
        m = part.dense_mask(40)
        assert not m.triu(1).any() and m.diagonal().all()
    model = randomize_head(tiny(pattern, mode="merged"))
    idx = torch.randint(0, 256, (2, model.spec.seq_len))
    base = model(idx)
    for t in (1, 9, 20):
        changed = idx.clone()
        changed[:, t] = (changed[:, t] + 1) % 256
        out = model(changed)
        assert torch.equal(out[:, :t], base[:, :t])
        assert not torch.allclose(out[:, t:], base[:, t:])


@pytest.mark.parametrize("pattern,mode", [("dense", "split"), ("strided", "split"), ("strided", "interleaved"),
                                          ("strided", "merged"), ("fixed", "split"), ("fixed", "merged")])
def test_flex_forward_equals_dense_masked_reference(pattern, mode):
    n, l, c = 300, 16, 3
    cache = MaskCache()
    q, k = torch.randn(2, 2, n, 8), torch.randn(2, 2, n, 8)
    v = torch.randn(2, 2, n, 16)  # values wider than queries/keys (halved q/k)
    for groups in layer_groups(pattern, mode, l, c, depth=2, heads=2):
        for _, part in groups:
            cache.build([part], n, "cpu", "dense")
            cache.build([part], n, "cpu", "flex")
            ref = attend(q, k, v, part, cache, "dense", 0.3)
            out = attend(q, k, v, part, cache, "flex", 0.3)
            torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block", [32, 64])
def test_smaller_flex_blocks_give_the_reference_output_and_skip_more(block):
    """model.sparse_block: masks at 32/64 still equal the dense masked reference, and a thin pattern's layout
    visits a smaller fraction of the (smaller) tiles than at 128."""
    n, l, c = 300, 16, 3
    cache = MaskCache(block=block)
    q, k, v = torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8)
    for pattern in ("strided", "fixed"):
        for _, part in layer_groups(pattern, "split", l, c, depth=1, heads=2)[0]:
            cache.build([part], n, "cpu", "dense")
            cache.build([part], n, "cpu", "flex")
            assert cache.get(part, n, "cpu", "flex")[0].BLOCK_SIZE == (block, block)
            torch.testing.assert_close(attend(q, k, v, part, cache, "flex", 0.3),
                                       attend(q, k, v, part, cache, "dense", 0.3), atol=1e-5, rtol=1e-5)
    col = sparse_pattern_registry.get("strided")(32, 4)[1]
    assert block_density(make_block_mask(col, 2048, "cpu", block)) < block_density(make_block_mask(col, 2048, "cpu"))
    model = SparseTransformer(SparseSpec(image_size=4, channels=1, dim=16, depth=1, heads=2, block=block))
    assert model.masks.block == block


@pytest.mark.parametrize("n,l,c", [(300, 16, 3), (17, 4, 1), (64, 8, 2), (100, 7, 3), (5, 8, 2)])
def test_blocked_segments_equal_the_dense_reference_forward_and_backward(n, l, c):
    """The `blocked` backend's segment forms (flash on runs, columns, run pairs) against masked SDPA in float64,
    values and gradients, with n a multiple of l and not (padding), and n shorter than one run."""
    torch.manual_seed(0)
    q, k = (torch.randn(2, 3, n, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(2, 3, n, 16, dtype=torch.float64, requires_grad=True)
    seen = 0
    for pattern in ("strided", "fixed"):
        for part in sparse_pattern_registry.get(pattern)(l, c):
            cache = MaskCache()
            cache.build([part], n, "cpu", "dense")
            cache.build([part], n, "cpu", "blocked")
            ref, out = (attend(q, k, v, part, cache, b, 0.3) for b in ("dense", "blocked"))
            torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
            w = torch.randn_like(ref)
            for a, b in zip(torch.autograd.grad((ref * w).sum(), (q, k, v)), torch.autograd.grad((out * w).sum(), (q, k, v))):
                torch.testing.assert_close(b, a, atol=1e-12, rtol=1e-12)
            seen += part.segments is not None
    assert seen == 3  # local, column, block; fixed/summary has no segment form and fell back to dense


def test_permutation_backward_is_the_inverse_gather():
    from genlab.nn.sparse_attention import _permute
    order = torch.randperm(50)
    x = torch.randn(2, 3, 50, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 3, 50, 4, dtype=torch.float64)
    got = torch.autograd.grad((_permute(x, order, torch.argsort(order)) * w).sum(), x)[0]
    want = torch.autograd.grad((x.index_select(2, order) * w).sum(), x)[0]
    assert torch.equal(got, want)


def test_auto_backend_is_blocked_on_cpu_and_flex_on_cuda():
    model = tiny()
    assert model.resolve_backend(torch.device("cpu")) == "blocked"
    assert model.resolve_backend(torch.device("cuda")) == "flex"
    assert model.resolve_backend(torch.device("cpu"), "dense") == "dense"


def test_model_blocked_backend_equals_dense_backend_with_gradients():
    for pattern, mode in (("strided", "split"), ("fixed", "interleaved"), ("fixed", "merged")):
        model = randomize_head(tiny(pattern, mode, size=6, channels=3, stride=9, summary=2)).double()
        idx = torch.randint(0, 257, (2, model.spec.seq_len))
        outs, grads = [], []
        for backend in ("dense", "blocked"):
            model.zero_grad()
            out = model(idx, backend=backend)
            out.square().mean().backward()
            outs.append(out)
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        torch.testing.assert_close(outs[1], outs[0], atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(grads[1], grads[0], atol=1e-10, rtol=1e-10)


def test_model_flex_forward_equals_dense_backend():
    model = randomize_head(tiny("fixed", "split", size=6, channels=3, stride=9, summary=2)).eval()
    idx = torch.randint(0, 257, (2, model.spec.seq_len))
    with torch.no_grad():  # FlexAttention has no CPU backward
        torch.testing.assert_close(model(idx, backend="flex"), model(idx, backend="dense"), atol=1e-5, rtol=1e-5)


def test_compiled_forward_and_deep_copy_give_the_reference_output():
    """The mask cache's builder is wrapped by torch.compiler.disable on first use (not at import, which would import
    dynamo into every CLI start): a compiled forward still gives the eager output, and a deep-copied model (EMA)
    builds into its own cache."""
    import copy
    model = randomize_head(tiny("fixed", "split", size=6, channels=3, stride=9, summary=2)).eval()
    idx = torch.randint(0, 257, (2, model.spec.seq_len))
    with torch.no_grad():
        ref = model(idx, backend="dense")
        torch.testing.assert_close(torch.compile(model, backend="eager")(idx, backend="dense"), ref)
        twin = copy.deepcopy(model)
        torch.testing.assert_close(twin(idx, backend="flex"), ref, atol=1e-5, rtol=1e-5)


def test_layouts_make_strided_and_fixed_block_sparse():
    n = 2048
    col = sparse_pattern_registry.get("strided")(32, 4)[1]
    assert block_density(make_block_mask(col, n, "cpu")) < 0.2
    plain = Part(col.name, col.allowed)  # position-wise: the trap, every causal block touched
    assert block_density(make_block_mask(plain, n, "cpu")) == pytest.approx((16 * 17 / 2) / 256)
    summ = sparse_pattern_registry.get("fixed")(128, 8)[1]
    # one block of summaries + the own diagonal (1-2 blocks) per query block, vs 8.5 of 16 causal-dense
    assert block_density(make_block_mask(summ, n, "cpu")) <= 3 / 16
    assert len(density_report("fixed", "merged", 128, 8, n)) == 1


@pytest.mark.parametrize("order", ("channel", "pixel"))
def test_row_column_channel_decomposition(order):
    H, C = 5, 3
    img = torch.zeros(1, H, H, C, dtype=torch.long)
    for r in range(H):
        for w in range(H):
            for ch in range(C):
                img[0, r, w, ch] = 100 * r + 10 * w + ch
    seq = image_to_seq(img, order)[0]
    coords = raster_coords(H, H, C, order)
    assert torch.equal(seq, 100 * coords[:, 0] + 10 * coords[:, 1] + coords[:, 2])
    assert torch.equal(seq_to_image(seq[None], H, H, C, order), img)
    if order == "channel":  # all of channel 0 row by row, then channel 1
        assert coords[H * H].tolist() == [0, 0, 1] and coords[H].tolist() == [1, 0, 0]
    else:  # pixel by pixel, channels interleaved
        assert coords[1].tolist() == [0, 0, 1] and coords[C].tolist() == [0, 1, 0]


def test_initialisation_matches_section_6():
    d, depth = 256, 4
    m = tiny(dim=d, depth=depth, heads=4, size=16, channels=3)
    assert m.tok_emb.weight.std().item() == pytest.approx(0.125 / math.sqrt(d), rel=0.05)
    pos = torch.cat([m.row_emb.weight, m.col_emb.weight, m.chan_emb.weight]).std().item()
    assert pos == pytest.approx(0.125 / math.sqrt(d * 3), rel=0.1)
    b = m.blocks[1]
    for w in (b.attn.q.weight, b.attn.k.weight, b.attn.v.weight, b.fc1.weight):
        assert w.std().item() == pytest.approx(0.125 / math.sqrt(w.shape[1]), rel=0.05)
    for w in (b.attn.proj.weight, b.fc2.weight):  # residual outputs scaled by 1 / sqrt(2N)
        assert w.std().item() == pytest.approx(0.125 / math.sqrt(w.shape[1]) / math.sqrt(2 * depth), rel=0.05)
    assert all(p.abs().max() == 0 for n, p in m.named_parameters() if n.endswith("bias"))
    assert m.head.weight.abs().max() == 0


def _method(cfg_over=(), data="digits"):
    from genlab.config.tree import load_config
    from genlab.data import build_dataset
    from genlab.families.sparse.image_ar import ImageAR
    cfg = load_config("sparse_tiny_cpu", list(cfg_over))
    data = build_dataset(cfg.data)
    from genlab.families.sparse.sparse_transformer import build_sparse_transformer
    torch.manual_seed(0)
    return ImageAR(cfg, data.spec), build_sparse_transformer(cfg.model, data.spec), data


def test_uniform_model_scores_exactly_8_bits_per_dim():
    method, model, data = _method()
    u8 = torch.from_numpy(np.asarray(data.images[:20]))
    assert method.bits_per_dim(model, u8) == pytest.approx(8.0, abs=1e-9)


def test_cached_decode_equals_full_forward():
    model = randomize_head(tiny("strided", "split", size=4, channels=2, stride=3)).eval()
    idx = torch.randint(0, 257, (2, model.spec.seq_len))
    full, cache = model(idx), []
    steps = torch.stack([model.decode(idx[:, t:t + 1], cache) for t in range(idx.shape[1])], 1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_completion_keeps_the_given_top_half():
    method, model, data = _method(["model.raster=pixel"])
    randomize_head(model)
    u8 = torch.from_numpy(np.asarray(data.images[:3]))
    out, given = method.complete(model, u8, k=2, generator=torch.Generator().manual_seed(0), device="cpu")
    assert given[:, :4].all() and not given[:, 4:].any()
    assert torch.equal(out[:, :, :4], u8.long()[:, None, :4].expand(-1, 2, -1, -1, -1))
    assert not torch.equal(out[:, :, 4:], u8.long()[:, None, 4:].expand(-1, 2, -1, -1, -1))


def test_bad_names_fail_with_the_valid_choices():
    with pytest.raises(GenlabError, match="dense, fixed, strided"):
        layer_groups("diagonal", "split", 4, 1, 2, 2)
    with pytest.raises(GenlabError, match="interleaved, merged, split"):
        layer_groups("strided", "zigzag", 4, 1, 2, 2)
    with pytest.raises(GenlabError, match="channel, pixel"):
        tiny(order="rgb")


def test_tiny_model_trains_through_cli_and_bits_per_dim_drops(tmp_path):
    from genlab.cli import main
    rc = main(["train", "sparse_tiny_cpu", "train.steps=15", f"train.out_dir={tmp_path}", "train.name=r",
               "eval.num_samples=32", "train.activation_checkpointing=segments", "train.ac_every=2"])
    assert rc == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["val_bits_per_dim"] < 6.0  # from exactly 8 at initialisation
    assert (tmp_path / "r" / "samples_completion.png").exists()
    assert main(["sample", str(tmp_path / "r"), "--attention", "3,4", "--out", str(tmp_path / "a.png")]) == 0
    assert (tmp_path / "a_attention.png").exists() and (tmp_path / "a_pattern.png").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pattern", ("strided", "fixed"))
@pytest.mark.parametrize("backend", ("flex", "blocked"))
def test_flex_backward_matches_dense_reference_bf16(pattern, backend):
    n, dev = 3072, torch.device("cuda")
    groups = layer_groups(pattern, "split", 32, 4, depth=1, heads=2)[0]
    cache = MaskCache()
    for _, part in groups:
        cache.build([part], n, dev, "dense")
        cache.build([part], n, dev, backend)
        q, k, v = (torch.randn(2, 4, n, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        grads = []
        for backend in ("dense", backend):
            out = attend(q, k, v, part, cache, backend, 0.125)
            g = torch.autograd.grad(out.float().square().sum(), (q, k, v))
            grads.append((out.float(), *[x.float() for x in g]))
        for ref, got in zip(*grads):
            torch.testing.assert_close(got, ref, atol=5e-2, rtol=5e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("block", (64, 32))
def test_small_flex_blocks_compile_and_match_dense_reference_bf16(block):
    """model.sparse_block=64|32 on the GPU: the compiled kernel needs tiles that divide the block mask
    (forward: flex_kernel_options; backward: the max-autotune list); forward and backward against masked SDPA."""
    n, dev = 1024, torch.device("cuda")
    cache = MaskCache(block=block)
    for _, part in layer_groups("strided", "split", 32, 4, depth=1, heads=2)[0]:
        cache.build([part], n, dev, "dense")
        cache.build([part], n, dev, "flex")
        q, k, v = (torch.randn(2, 4, n, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        res = []
        for backend in ("dense", "flex"):
            out = attend(q, k, v, part, cache, backend, 0.125)
            res.append((out.float(), *[g.float() for g in torch.autograd.grad(out.float().square().sum(), (q, k, v))]))
        for ref, got in zip(*res):
            torch.testing.assert_close(got, ref, atol=5e-2, rtol=5e-2)


def test_flex_kernel_options_divide_every_block_size():
    from genlab.nn.sparse_attention import FLEX_BLOCKS, flex_kernel_options
    for block in FLEX_BLOCKS:
        opts = flex_kernel_options(block) or {}
        assert all(block % t == 0 for t in opts.values()) and (block == 128) == (not opts), (block, opts)
    assert flex_kernel_options(128) is None  # the compiled kernel's own tiles


def test_prepare_frames_resizes_episodes_into_the_images_format(tmp_path):
    from genlab.data.convert import prepare
    from genlab.data.formats import read_image_dataset
    for e in range(3):
        (tmp_path / "eps" / f"ep{e}").mkdir(parents=True)
        frames = np.full((4, 21, 16, 3), 10 * e, dtype=np.uint8)  # constant frames stay constant under a box filter
        np.save(tmp_path / "eps" / f"ep{e}" / "frames.npy", frames)
    train = read_image_dataset(prepare("frames", src=tmp_path / "eps", out=tmp_path / "tr", size=8, split="train"))
    test = read_image_dataset(prepare("frames", src=tmp_path / "eps", out=tmp_path / "te", size=8, split="test"))
    assert train.images.shape == (8, 8, 8, 3) and test.images.shape == (4, 8, 8, 3)
    assert (np.asarray(test.images) == 20).all() and sorted(set(np.asarray(train.labels).tolist())) == [0, 1]
    with pytest.raises(GenlabError, match="train, test, all"):
        prepare("frames", src=tmp_path / "eps", out=tmp_path / "x", size=8, split="val")


def test_sample_returns_images_in_the_image_method_contract():
    method, model, data = _method()
    x = method.sample(model, torch.zeros(3, dtype=torch.long), generator=torch.Generator().manual_seed(0), device="cpu")
    assert x.shape == (3, 1, 8, 8) and x.min() >= -1 and x.max() <= 1
    u8 = (x + 1) * 127.5
    assert (u8 - u8.round()).abs().max() < 1e-4  # whole bytes (as the loader normalises them)


# --- text: the paper's attention embeddings, trained by the autoregressive method ---

def tiny_text_model(pattern="fixed", embed="attention", T=24, V=11, l=4, c=1):
    spec = SparseSpec(image_size=0, channels=0, dim=32, depth=2, heads=2, vocab=V, text_len=T, embed=embed,
                      pattern=pattern, mode="split", stride=l, summary=c)
    torch.manual_seed(0)
    return SparseTransformer(spec)


def test_attention_embedding_is_row_and_column_of_the_stride_matrix():
    from genlab.families.sparse.sparse_transformer import attention_coords
    m = tiny_text_model(T=22, l=5)
    assert m.pos_tables == ("attn_row_emb", "attn_col_emb")
    assert m.attn_row_emb.num_embeddings == 5 and m.attn_col_emb.num_embeddings == 5  # ceil(22 / 5) rows
    for t in range(22):  # brute force: position t of a width-5 matrix
        assert attention_coords(22, 5)[t].tolist() == [t // 5, t % 5]
    idx = torch.randint(0, 11, (2, 22))
    want = m.tok_emb(idx) + m.attn_row_emb.weight[torch.arange(22) // 5] + m.attn_col_emb.weight[torch.arange(22) % 5]
    torch.testing.assert_close(m.embed(idx), want)
    # section 6 with n_emb = 2 position tables
    big = SparseTransformer(SparseSpec(image_size=0, channels=0, dim=256, depth=2, heads=2, vocab=50, text_len=4096,
                                       stride=64))
    assert big.spec.embedding == "attention"
    std = big.attn_col_emb.weight.std().item()
    assert abs(std - 0.125 / math.sqrt(256 * 2)) < 0.05 * 0.125 / math.sqrt(256 * 2)


def test_text_model_outputs_the_vocabulary_and_prompt_decode_equals_forward():
    m = tiny_text_model().eval()
    idx = torch.randint(0, 11, (3, 24))
    full = m(idx)
    assert full.shape == (3, 24, 11) and m.vocab_size == 11 and m.n_vocab == 11
    cache = []
    torch.testing.assert_close(m.decode(idx[:, :10], cache), full[:, 9], atol=1e-5, rtol=1e-5)  # a prompt at once
    for t in range(10, 24):
        torch.testing.assert_close(m.decode(idx[:, t:t + 1], cache), full[:, t], atol=1e-5, rtol=1e-5)


def test_data_embedding_on_text_is_refused_in_one_line():
    from genlab.config.tree import load_config
    with pytest.raises(GenlabError, match="sparse_embed=data needs image data"):
        load_config("text_sparse", ["model.sparse_embed=data"])
    with pytest.raises(GenlabError, match="needs model.name=gpt"):
        load_config("text_sparse", ["method.name=mdlm"])


def test_text_sparse_preset_trains_and_samples_through_cli(tmp_path):
    from genlab.cli import main
    rc = main(["train", "text_sparse", "train.steps=30", f"train.out_dir={tmp_path}", "train.name=t", "log.every=10",
               "log.tensorboard=false", "eval.num_samples=8", "method.sample_len=20"])
    assert rc == 0
    rows = [json.loads(x) for x in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert losses[-1] < losses[0] - 0.5  # from ~ln(vocab) down
    s = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert s["status"] == "finished" and s["val_loss"] < losses[0], s
    out = tmp_path / "s.txt"
    assert main(["sample", str(tmp_path / "t"), "--n", "2", "--steps", "16", "--prompt", "ROMEO:", "--out", str(out)]) == 0
    assert "ROMEO:" in out.read_text()
