"""Factorized sparse attention patterns (Child et al. 2019, "Generating Long Sequences with Sparse
Transformers", section 4) as FlexAttention block masks, with a dense masked reference.

A pattern is a list of *parts* (the paper's A^(1), A^(2)), each a causal predicate `allowed(i, j)` on original
positions (query i, key j):

  dense    A_i      = {j <= i}
  strided  A^(1)_i  = {t, ..., i}, t = max(0, i - l)          (the previous l positions)
           A^(2)_i  = {j <= i : (i - j) mod l = 0}              (every l-th position: "the column")
  fixed    A^(1)_i  = {j <= i : floor(j / l) = floor(i / l)}    (the own block of l)
           A^(2)_i  = {j <= i : j mod l in {l - c, ..., l - 1}} (the last c "summary" cells of every block)
                      and i itself, so no head that holds only this part has an empty softmax
  fixed with g summary groups (section 4.2): A^(2) becomes g parts, part s with the cells {l - (s+1)c, ..., l - sc - 1}.

A *factorization mode* (section 4.3: `interleaved`, `merged`, `split`) assigns the factors to layers and heads; the
modes, the layouts (section 5.3) and the dense / flex / blocked backends: docs/sparse.md.
"""
from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from genlab.core.errors import GenlabError
from genlab.core.registry import Registry

sparse_pattern_registry = Registry("sparse_pattern")
sparse_mode_registry = Registry("sparse_mode")

FLEX_BLOCK = 128  # FlexAttention's default block size: the unit of skipped work
FLEX_BLOCKS = (32, 64, 128)  # smaller blocks skip more of a thin pattern but run smaller tiles


@dataclass(frozen=True)
class Part:
    """One factor of a pattern: a causal predicate on original positions, the layouts that make it block-sparse
    (`q_order(n)` / `kv_order(n)`: permutations of range(n), None = identity) and, where it has one, its `blocked`
    form `segments(q, k, v, scale)` (SDPA on reshaped segments)."""
    name: str
    allowed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    q_order: Callable[[int], torch.Tensor] | None = None
    kv_order: Callable[[int], torch.Tensor] | None = None
    segments: Callable | None = None
    factor: int = 0  # the pattern's factor (A^(1) = 0, A^(2) = 1) this part is, or is a sub-block of

    def dense_mask(self, n: int, device=None, q_start: int = 0) -> torch.Tensor:
        """bool [n - q_start, n]: row i says which keys query i may see (original order)."""
        i = torch.arange(q_start, n, device=device)[:, None]
        j = torch.arange(n, device=device)[None, :]
        return self.allowed(i, j)


def column_major(l: int):
    """Order positions by (p mod l, p): position p = r*l + k goes to column k, row r."""
    def order(n):
        p = torch.arange(n)
        return torch.argsort((p % l) * n + p)
    return order


def summaries_first(l: int, c: int, offset: int = 0):
    """Summary positions (l - c - offset <= p mod l < l - offset) first, then the rest, each in position order."""
    def order(n):
        p = torch.arange(n) % l
        rest = (p < l - c - offset) | (p >= l - offset)
        return torch.argsort(rest.long() * n + torch.arange(n))
    return order


def causal(i, j):
    return j <= i


# -- segment forms (the `blocked` backend): [B, h, n, e] in original order -> [B, h, n, ev] ----------
def _pad_to(x, m: int):
    """Pad the sequence (dim 2) at the end to a multiple of m: padded keys come after every real query of
    their segment, so a causal segment never lets a real query see them."""
    pad = (-x.shape[2]) % m
    return F.pad(x, (0, 0, 0, pad)) if pad else x


def _runs(x, l: int):
    """[B, h, n, e] -> [B * n/l, h, l, e]: each run of l consecutive positions a batch entry."""
    B, h, _, e = x.shape
    x = _pad_to(x, l)
    return x.reshape(B, h, -1, l, e).transpose(1, 2).reshape(-1, h, l, e)


def _unruns(out, B: int, n: int):
    _, h, l, e = out.shape
    return out.reshape(B, -1, h, l, e).transpose(1, 2).reshape(B, h, -1, e)[:, :, :n]


def block_causal_segments(l: int):
    """fixed/block: causal attention inside each run of l positions."""
    def run(q, k, v, scale):
        out = F.scaled_dot_product_attention(_runs(q, l), _runs(k, l), _runs(v, l), is_causal=True, scale=scale)
        return _unruns(out, q.shape[0], q.shape[2])
    return run


def column_segments(l: int):
    """strided/column: position r*l + k is row r of column k; each column is causal attention over its rows."""
    def cols(x):
        B, h, _, e = x.shape
        x = _pad_to(x, l)
        return x.reshape(B, h, -1, l, e).transpose(2, 3).reshape(B, h * l, -1, e)

    def run(q, k, v, scale):
        B, h, n, _ = q.shape
        out = F.scaled_dot_product_attention(cols(q), cols(k), cols(v), is_causal=True, scale=scale)
        return out.reshape(B, h, l, -1, out.shape[-1]).transpose(2, 3).reshape(B, h, -1, out.shape[-1])[:, :, :n]
    return run


def local_segments(l: int):
    """strided/local (keys i-l .. i): run r of l queries attends to runs r-1 and r (2l keys) under one
    [l, 2l] band mask; run 0's previous run is padding, masked out."""
    def pairs(x):
        B, h, _, e = x.shape
        x = F.pad(_pad_to(x, l), (0, 0, l, 0)).reshape(B, h, -1, l, e)
        both = torch.cat([x[:, :, :-1], x[:, :, 1:]], 3)  # [B, h, n/l, 2l, e]
        return both.transpose(1, 2).reshape(-1, h, 2 * l, e)

    def run(q, k, v, scale):
        B, n = q.shape[0], q.shape[2]
        runs = -(-n // l)
        a = torch.arange(l, device=q.device)[:, None]
        m = torch.arange(2 * l, device=q.device)[None, :]
        band = (m >= a) & (m - l <= a)                       # key (r-1)*l + m for query r*l + a
        first = band & (m >= l)
        mask = torch.stack([first] + [band] * (runs - 1))[:, None].repeat(B, 1, 1, 1)  # [B * n/l, 1, l, 2l]
        out = F.scaled_dot_product_attention(_runs(q, l), pairs(k), pairs(v), attn_mask=mask, scale=scale)
        return _unruns(out, B, n)
    return run


@sparse_pattern_registry.register("dense", "causal dense attention (every earlier position)")
def dense_pattern(l: int, c: int, groups: int = 1) -> list[Part]:
    return [Part("dense", causal)]


@sparse_pattern_registry.register("strided", "previous l positions + every l-th position (images; stride l ~ sqrt(n))")
def strided_pattern(l: int, c: int, groups: int = 1) -> list[Part]:
    return [Part("strided/local", lambda i, j: (j <= i) & (i - j <= l), segments=local_segments(l)),
            Part("strided/column", lambda i, j: (j <= i) & ((i - j) % l == 0), column_major(l), column_major(l),
                 column_segments(l), factor=1)]


def summary_part(l: int, c: int, group: int) -> Part:
    lo, hi = l - (group + 1) * c, l - group * c  # this group's cells within every block: [lo, hi)
    return Part("fixed/summary" + (f"{group}" if group else ""),
                lambda i, j: ((j <= i) & (j % l >= lo) & (j % l < hi)) | (j == i), None,
                summaries_first(l, c, group * c), factor=1)


@sparse_pattern_registry.register("fixed", "own block of l + the last c cells of every earlier block (text); "
                                           "model.sparse_summary_groups > 1: heads on distinct sub-blocks of c")
def fixed_pattern(l: int, c: int, groups: int = 1) -> list[Part]:
    return [Part("fixed/block", lambda i, j: (j <= i) & (i // l == j // l), segments=block_causal_segments(l))] + \
        [summary_part(l, c, g) for g in range(groups)]


def union(parts: list[Part], kv_order=None) -> Part:
    if len(parts) == 1:
        return parts[0]
    fns = [p.allowed for p in parts]
    return Part("+".join(p.name for p in parts), lambda i, j: functools.reduce(operator.or_, (f(i, j) for f in fns)),
                None, kv_order)


def _share(heads: int, parts, what: str):
    """Divide `heads` evenly among `parts`: [(n_heads, part), ...]."""
    if heads % len(parts):
        raise GenlabError(f"{what} needs heads divisible by {len(parts)}, got {heads} heads")
    return [(heads // len(parts), p) for p in parts]


# A mode maps (factors, merged, layer, heads) -> [(n_heads, part), ...] covering all heads of that layer;
# factors is a list of lists of parts (a factor with several parts: the summary groups).
@sparse_mode_registry.register("interleaved", "layer r attends with factor r mod p (all heads)")
def mode_interleaved(factors, merged, layer: int, heads: int):
    return _share(heads, factors[layer % len(factors)], "sparse_mode=interleaved with summary groups")


@sparse_mode_registry.register("merged", "every head attends to the union of the parts")
def mode_merged(factors, merged, layer: int, heads: int):
    return [(heads, merged)]


@sparse_mode_registry.register("split", "the heads are divided evenly among the factors")
def mode_split(factors, merged, layer: int, heads: int):
    per = _share(heads, factors, f"sparse_mode=split of {len(factors)} factors")
    return [g for (h, parts) in per
            for g in _share(h, parts, f"sparse_mode=split (the summary factor gets {h} of {heads} heads) with {len(parts)} summary groups")]


def layer_groups(pattern: str, mode: str, l: int, c: int, depth: int, heads: int, groups: int = 1):
    """Per layer, a list of (n_heads, Part). `groups` > 1: the fixed pattern's summary sub-blocks."""
    if l < 1 or not (0 < c <= l):
        raise GenlabError(f"sparse attention needs stride/block l >= 1 and 0 < c <= l; got l={l}, c={c}")
    if groups > 1 and (pattern != "fixed" or groups * c > l):
        raise GenlabError(f"model.sparse_summary_groups={groups} needs sparse_pattern=fixed and groups * c <= l; "
                          f"got pattern {pattern}, c={c}, l={l}")
    parts = sparse_pattern_registry.get(pattern)(l, c, groups)
    factors = [[p for p in parts if p.factor == f] for f in sorted({p.factor for p in parts})]
    mode_fn = sparse_mode_registry.get(mode)
    # the union of the fixed parts is block-sparse with (all groups') summaries first; the strided union is not
    # block-sparse in any single order (its two parts want different orders)
    merged = union(parts, summaries_first(l, c * groups) if pattern == "fixed" else None)
    return [mode_fn(factors, merged, r, heads) for r in range(depth)]


# -- kernels -------------------------------------------------------------------------------------
def _orders(part: Part, n: int, device):
    return tuple(order(n).to(device) if order else None for order in (part.q_order, part.kv_order))


def make_block_mask(part: Part, n: int, device, block: int = FLEX_BLOCK):
    """FlexAttention BlockMask of `part` in its layout (queries in q_order, keys in kv_order)."""
    from torch.nn.attention.flex_attention import create_block_mask
    qp, kp = (o if o is not None else torch.arange(n, device=device) for o in _orders(part, n, device))
    allowed = part.allowed
    return create_block_mask(lambda b, h, qi, ki: allowed(qp[qi], kp[ki]), None, None, n, n, device=device,
                             BLOCK_SIZE=block)


def block_density(block_mask) -> float:
    """Fraction of (query block, key block) pairs the kernel visits (full + partial)."""
    kv = block_mask.kv_num_blocks.sum().item()
    full = block_mask.full_kv_num_blocks.sum().item() if block_mask.full_kv_num_blocks is not None else 0
    nq, nk = block_mask.kv_indices.shape[-2], block_mask.kv_indices.shape[-1]
    return (kv + full) / (nq * nk)


def causal_block_density(n: int, block: int = FLEX_BLOCK) -> float:
    nb = math.ceil(n / block)
    return nb * (nb + 1) / 2 / nb ** 2


def density_report(pattern: str, mode: str, l: int, c: int, n: int, heads: int = 2, depth: int = 2,
                   device="cpu", block: int = FLEX_BLOCK) -> list[str]:
    """One line per distinct part: block density in its layout vs position-wise, and vs causal dense."""
    lines, seen = [], set()
    for groups in layer_groups(pattern, mode, l, c, depth, heads):
        for _, part in groups:
            if part.name in seen:
                continue
            seen.add(part.name)
            d = block_density(make_block_mask(part, n, device, block))
            plain = block_density(make_block_mask(Part(part.name, part.allowed), n, device, block))
            lines.append(f"{pattern}/{mode} part {part.name}: block density {d:.3f} in layout ({plain:.3f} position-wise; "
                         f"causal dense {causal_block_density(n, block):.3f}), n={n}, l={l}, c={c}, block={block}")
    return lines


_compiled_flex: dict = {}


def flex_kernel_options(block: int) -> dict | None:
    """Forward tiles that divide a block mask of `block`: the compiled kernel's default forward tile is 128
    and below that it refuses the mask ("Q and KV block size must be divisible by BLOCK_M and BLOCK_N")."""
    return None if block >= FLEX_BLOCK else {"BLOCK_M": block, "BLOCK_N": block}


def flex(q, k, v, block_mask, scale):
    """flex_attention, compiled on CUDA (eager flex materialises the scores: tests only). Blocks under 128 compile on
    their own with max-autotune (a graph break inside a compiled model; why: docs/sparse.md, pytorch issue 176025)."""
    from torch.nn.attention.flex_attention import flex_attention
    options = flex_kernel_options(block_mask.BLOCK_SIZE[0])
    compiling = torch.compiler.is_compiling()
    if q.device.type != "cuda" or compiling and options is None:
        return flex_attention(q, k, v, block_mask=block_mask, scale=scale)
    # inside a compiled model: a graph break, so the small-block kernel gets its own autotuned compile
    run = torch.compiler.disable(_flex_outside_graph) if compiling else _flex_outside_graph
    return run(q, k, v, block_mask, scale, options)


def _flex_outside_graph(q, k, v, block_mask, scale, options):
    small = options is not None
    if small not in _compiled_flex:
        # every part's mask_mod is its own closure, so each compiles once; past dynamo's default limit of
        # 8 it would silently fall back to eager flex (full score matrices)
        import torch._dynamo.config as dcfg
        from torch.nn.attention.flex_attention import flex_attention
        for key in ("recompile_limit", "cache_size_limit"):
            if hasattr(dcfg, key):
                setattr(dcfg, key, max(64, getattr(dcfg, key)))
        _compiled_flex[small] = torch.compile(flex_attention, dynamic=False,
                                              mode="max-autotune-no-cudagraphs" if small else None)
    return _compiled_flex[small](q, k, v, block_mask=block_mask, scale=scale, kernel_options=options)


class MaskCache:
    """Per (part, n, device, backend): the dense bool mask or the BlockMask + layout permutations.
    Built outside any compiled graph (`build`), looked up inside it (`get`)."""

    def __init__(self, block: int = FLEX_BLOCK):
        global _build_eagerly
        self._store, self.block = {}, block
        # masks are built eagerly even when called from a compiled forward; wrapped on first use, not by a
        # decorator, because torch.compiler.disable imports dynamo (~2 s): every CLI start, even a config error
        if _build_eagerly is None:
            _build_eagerly = torch.compiler.disable(_build_masks)

    def build(self, parts, n: int, device, backend: str):
        _build_eagerly(self, parts, n, device, backend)

    def get(self, part, n, device, backend):
        return self._store[(part.name, n, _dev_key(device), backend)]


_build_eagerly = None


def _fallback(backend: str, device) -> str:
    """The backend that runs a part with no segment form under `blocked`."""
    return ("flex" if torch.device(device).type == "cuda" else "dense") if backend == "blocked" else backend


def _build_masks(cache: MaskCache, parts, n: int, device, backend: str):
    for part in parts:
        if backend == "blocked" and part.segments is not None:
            continue  # computed from its segments: no mask
        b = _fallback(backend, device)
        key = (part.name, n, _dev_key(device), b)
        if key in cache._store:
            continue
        if b == "dense":
            cache._store[key] = part.dense_mask(n, device)
        else:
            q, kv = _orders(part, n, device)
            inv = lambda o: torch.argsort(o) if o is not None else None  # noqa: E731
            cache._store[key] = (make_block_mask(part, n, device, cache.block), q, inv(q), kv, inv(kv))


def _dev_key(device) -> str:
    # 'cuda' and 'cuda:0' name the same device: key by the resolved index so build and get agree
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return str(d)


class _Permute(torch.autograd.Function):
    """x.index_select(2, order) whose backward is a gather with the inverse order: index_select's own
    backward is a scatter-add (atomics), the slowest part of a permuted FlexAttention layer."""

    @staticmethod
    def forward(ctx, x, order, inverse):
        ctx.save_for_backward(inverse)
        return x.index_select(2, order)

    @staticmethod
    def backward(ctx, grad):
        (inverse,) = ctx.saved_tensors
        return grad.index_select(2, inverse), None, None


def _permute(x, order, inverse):
    return _Permute.apply(x, order, inverse) if x.requires_grad else x.index_select(2, order)


def attend(q, k, v, part: Part, cache: MaskCache, backend: str, scale: float):
    """q, k [B, h, n, e], v [B, h, n, ev] in original order -> [B, h, n, ev]."""
    n = q.shape[2]
    if part.allowed is causal:  # plain causal: SDPA's flash kernel on any backend
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    if backend == "blocked" and part.segments is not None:
        return part.segments(q, k, v, scale)
    backend = _fallback(backend, q.device)
    if backend == "dense":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=cache.get(part, n, q.device, backend), scale=scale)
    bm, qo, q_inv, kvo, kv_inv = cache.get(part, n, q.device, backend)
    if qo is not None:
        q = _permute(q, qo, q_inv)
    if kvo is not None:
        k, v = _permute(k, kvo, kv_inv), _permute(v, kvo, kv_inv)
    out = flex(q, k, v, bm, scale)
    return _permute(out, q_inv, qo) if q_inv is not None else out


if __name__ == "__main__":  # python -m genlab.nn.sparse_attention [n] [l] [c]: block densities
    import sys
    n, l, c = (int(a) for a in (sys.argv[1:] + ["3072", "64", "16"][len(sys.argv) - 1:])[:3])
    for pat in ("dense", "strided", "fixed"):
        for mode in (("split",) if pat == "dense" else ("split", "merged")):
            print("\n".join(density_report(pat, mode, l, c, n)))
