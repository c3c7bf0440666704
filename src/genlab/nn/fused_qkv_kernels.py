"""Triton kernels of the fused QKV split (see ``fused_qkv.py``); imported lazily, on the first CUDA use.

X ``[B, N, 3, H, HD]`` contiguous, Q, K, V ``[B, H, N, HD]`` contiguous. One program per token: q and k heads as
``[H, HD / 2]`` tiles of even and odd channels (RoPE turns the pairs (2j, 2j+1)), RMSNorm in float32, rotate, store;
v is copied. The backward reads the saved X again and writes dX and per-token partial d weight (``[2, B * N, HD]``).
"""
import triton
import triton.language as tl


@triton.jit
def _load_pairs(P, h, j, m, HALF: tl.constexpr):
    """Even and odd channels [BLOCK_H, BLOCK_J] of heads h at pair index j, from rows of 2 * HALF."""
    offs = h[:, None] * (2 * HALF) + 2 * j[None, :]
    return tl.load(P + offs, mask=m, other=0.0).to(tl.float32), tl.load(P + offs + 1, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _qk_fwd(X, W, COS, SIN, OUT, n, N, H, eps, h, j, m, jm,
            HAS_NORM: tl.constexpr, HAS_ROPE: tl.constexpr, HALF: tl.constexpr):
    xe, xo = _load_pairs(X, h, j, m, HALF)
    if HAS_NORM:
        rstd = 1.0 / tl.sqrt((tl.sum(xe * xe, 1) + tl.sum(xo * xo, 1)) / (2 * HALF) + eps)
        xe = xe * rstd[:, None] * tl.load(W + 2 * j, mask=jm, other=0.0).to(tl.float32)[None, :]
        xo = xo * rstd[:, None] * tl.load(W + 2 * j + 1, mask=jm, other=0.0).to(tl.float32)[None, :]
    if HAS_ROPE:
        c = tl.load(COS + n * HALF + j, mask=jm, other=0.0)[None, :]
        s = tl.load(SIN + n * HALF + j, mask=jm, other=0.0)[None, :]
        xe, xo = xe * c - xo * s, xe * s + xo * c
    offs = (h[:, None] * N + n) * (2 * HALF) + 2 * j[None, :]
    tl.store(OUT + offs, xe.to(OUT.dtype.element_ty), mask=m)
    tl.store(OUT + offs + 1, xo.to(OUT.dtype.element_ty), mask=m)


@triton.jit
def _split_fwd(X, WQ, WK, COS, SIN, Q, K, V, N, H, eps,
               HAS_QN: tl.constexpr, HAS_KN: tl.constexpr, HAS_ROPE: tl.constexpr,
               HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_J: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)   # b * N + n
    b, n = row // N, row % N
    h = tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_J)
    jm = j < HALF
    m = (h[:, None] < H) & jm[None, :]
    HD = 2 * HALF
    x = X + row * 3 * H * HD
    base = b * H * N * HD
    _qk_fwd(x, WQ, COS, SIN, Q + base, n, N, H, eps, h, j, m, jm, HAS_QN, HAS_ROPE, HALF)
    _qk_fwd(x + H * HD, WK, COS, SIN, K + base, n, N, H, eps, h, j, m, jm, HAS_KN, HAS_ROPE, HALF)
    ve, vo = _load_pairs(x + 2 * H * HD, h, j, m, HALF)
    offs = (h[:, None] * N + n) * HD + 2 * j[None, :]
    tl.store(V + base + offs, ve.to(V.dtype.element_ty), mask=m)
    tl.store(V + base + offs + 1, vo.to(V.dtype.element_ty), mask=m)


@triton.jit
def _qk_bwd(X, W, COS, SIN, DOUT, DX, PW, n, N, H, eps, h, j, m, jm,
            HAS_NORM: tl.constexpr, HAS_ROPE: tl.constexpr, HALF: tl.constexpr):
    """dX of one of q, k for one token; with HAS_NORM also this token's d weight (summed over heads) into PW."""
    offs = (h[:, None] * N + n) * (2 * HALF) + 2 * j[None, :]
    de = tl.load(DOUT + offs, mask=m, other=0.0).to(tl.float32)
    do = tl.load(DOUT + offs + 1, mask=m, other=0.0).to(tl.float32)
    if HAS_ROPE:  # the rotation's transpose
        c = tl.load(COS + n * HALF + j, mask=jm, other=0.0)[None, :]
        s = tl.load(SIN + n * HALF + j, mask=jm, other=0.0)[None, :]
        de, do = de * c + do * s, do * c - de * s
    if HAS_NORM:
        xe, xo = _load_pairs(X, h, j, m, HALF)
        rstd = 1.0 / tl.sqrt((tl.sum(xe * xe, 1) + tl.sum(xo * xo, 1)) / (2 * HALF) + eps)
        xe, xo = xe * rstd[:, None], xo * rstd[:, None]                    # x hat
        tl.store(PW + 2 * j, tl.sum(de * xe, 0), mask=jm)
        tl.store(PW + 2 * j + 1, tl.sum(do * xo, 0), mask=jm)
        de = de * tl.load(W + 2 * j, mask=jm, other=0.0).to(tl.float32)[None, :]   # d x hat
        do = do * tl.load(W + 2 * j + 1, mask=jm, other=0.0).to(tl.float32)[None, :]
        c1 = (tl.sum(de * xe, 1) + tl.sum(do * xo, 1)) / (2 * HALF)
        de = rstd[:, None] * (de - xe * c1[:, None])
        do = rstd[:, None] * (do - xo * c1[:, None])
    xoffs = h[:, None] * (2 * HALF) + 2 * j[None, :]
    tl.store(DX + xoffs, de.to(DX.dtype.element_ty), mask=m)
    tl.store(DX + xoffs + 1, do.to(DX.dtype.element_ty), mask=m)


@triton.jit
def _split_bwd(X, WQ, WK, COS, SIN, DQ, DK, DV, DX, PW, N, H, eps,
               HAS_QN: tl.constexpr, HAS_KN: tl.constexpr, HAS_ROPE: tl.constexpr,
               HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_J: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    b, n = row // N, row % N
    h = tl.arange(0, BLOCK_H)
    j = tl.arange(0, BLOCK_J)
    jm = j < HALF
    m = (h[:, None] < H) & jm[None, :]
    HD = 2 * HALF
    x = X + row * 3 * H * HD
    dx = DX + row * 3 * H * HD
    base = b * H * N * HD
    rows = tl.num_programs(0).to(tl.int64)
    _qk_bwd(x, WQ, COS, SIN, DQ + base, dx, PW + row * HD, n, N, H, eps, h, j, m, jm, HAS_QN, HAS_ROPE, HALF)
    _qk_bwd(x + H * HD, WK, COS, SIN, DK + base, dx + H * HD, PW + (rows + row) * HD, n, N, H, eps, h, j, m, jm,
            HAS_KN, HAS_ROPE, HALF)
    offs = (h[:, None] * N + n) * HD + 2 * j[None, :]
    ve = tl.load(DV + base + offs, mask=m, other=0.0)
    vo = tl.load(DV + base + offs + 1, mask=m, other=0.0)
    xoffs = 2 * H * HD + h[:, None] * HD + 2 * j[None, :]
    tl.store(dx + xoffs, ve.to(DX.dtype.element_ty), mask=m)
    tl.store(dx + xoffs + 1, vo.to(DX.dtype.element_ty), mask=m)
