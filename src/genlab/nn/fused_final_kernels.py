"""Triton kernel of the fused final layer + flow loss (see ``fused_final.py``); imported lazily, on the first CUDA use.

H ``[B * N, D]``, W ``[P, D]``, bias ``[P]``, target T ``[B * N, P]``, contiguous. One program per tile of BLOCK_N rows
of one sample (pid = sample * TILES + tile): out = H W^T + bias in float32 (P padded to BLOCK_P >= 16), diff = out - T
written, the tile's sum of diff^2 to PART[sample, tile] (summed on the host).
"""
import triton
import triton.language as tl


@triton.jit
def _final_sse_fwd(H, W, BIAS, T, DIFF, PART, N, D, P, TILES,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr, IEEE: tl.constexpr):
    pid = tl.program_id(0)
    b = (pid // TILES).to(tl.int64)
    tile = pid % TILES
    rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)          # token index inside sample b
    rmask = rows < N
    grow = b * N + rows                                     # int64 row of [B * N, .]
    cols = tl.arange(0, BLOCK_P)
    pmask = cols < P
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_P], dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        k = k0 + ks
        kmask = k < D
        a = tl.load(H + grow[:, None] * D + k[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        w = tl.load(W + cols[None, :] * D + k[:, None], mask=kmask[:, None] & pmask[None, :], other=0.0)  # W^T slice
        if IEEE:
            acc = tl.dot(a, w, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, w, acc)
    bias = tl.load(BIAS + cols, mask=pmask, other=0.0).to(tl.float32)
    m2 = rmask[:, None] & pmask[None, :]
    off = grow[:, None] * P + cols[None, :]
    tgt = tl.load(T + off, mask=m2, other=0.0).to(tl.float32)
    diff = tl.where(m2, acc + bias[None, :] - tgt, 0.0)
    tl.store(DIFF + off, diff, mask=m2)
    tl.store(PART + b * TILES + tile, tl.sum(tl.sum(diff * diff, 1), 0))
