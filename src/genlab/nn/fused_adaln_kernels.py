"""Triton kernels of the fused adaLN ops (see ``fused_adaln.py``); imported lazily, on the first CUDA use.

Token rows of ``[B, N, D]`` tensors, contiguous, D <= BLOCK_D (one row in registers); per-sample vectors (gate, shift,
scale) ``[B, D]``. Program (tile of ROWS rows, sample): the vectors are loaded once; the backward writes partial sums
over its rows to ``[B, tiles, D]`` float32 buffers that the host sums. Float32 arithmetic; the residual is rounded to
its storage dtype before the statistics, as the plain path normalises the stored residual.
"""
import triton
import triton.language as tl


@triton.jit
def _fused_fwd(X, Y, G, SH, SC, R, H, MEAN, RSTD, N, D, eps,
               HAS_RES: tl.constexpr, HAS_NORM: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    tile, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    if HAS_RES:
        g = tl.load(G + b * D + cols, mask=cmask, other=0.0).to(tl.float32)
    if HAS_NORM:
        sh = tl.load(SH + b * D + cols, mask=cmask, other=0.0).to(tl.float32)
        sc1 = 1.0 + tl.load(SC + b * D + cols, mask=cmask, other=0.0).to(tl.float32)
    for i in range(ROWS):
        n = tile * ROWS + i
        if n < N:
            row = b * N + n
            x = tl.load(X + row * D + cols, mask=cmask, other=0.0)
            if HAS_RES:
                y = tl.load(Y + row * D + cols, mask=cmask, other=0.0).to(tl.float32)
                r = (x.to(tl.float32) + g * y).to(R.dtype.element_ty)
                tl.store(R + row * D + cols, r, mask=cmask)
                xf = r.to(tl.float32)
            else:
                xf = x.to(tl.float32)
            if HAS_NORM:
                mean = tl.sum(xf, 0) / D
                xc = tl.where(cmask, xf - mean, 0.0)
                rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, 0) / D + eps)
                tl.store(MEAN + row, mean)
                tl.store(RSTD + row, rstd)
                h = xc * rstd * sc1 + sh
                tl.store(H + row * D + cols, h.to(H.dtype.element_ty), mask=cmask)


@triton.jit
def _fused_bwd(XN, Y, G, SC, MEAN, RSTD, DR, DH, DX, DY, PG, PSH, PSC, N, D, TILES,
               HAS_RES: tl.constexpr, HAS_NORM: tl.constexpr, HAS_DR: tl.constexpr,
               ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """XN: the normalised input (the residual output when HAS_RES, else x). DR: the gradient of the residual output
    (HAS_DR), DH: of the modulated output. Writes DX (and DY with HAS_RES) and the partial sums PG, PSH, PSC."""
    tile, b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    if HAS_RES:
        g = tl.load(G + b * D + cols, mask=cmask, other=0.0).to(tl.float32)
        acc_g = tl.zeros([BLOCK_D], dtype=tl.float32)
    if HAS_NORM:
        sc1 = 1.0 + tl.load(SC + b * D + cols, mask=cmask, other=0.0).to(tl.float32)
        acc_sh = tl.zeros([BLOCK_D], dtype=tl.float32)
        acc_sc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for i in range(ROWS):
        n = tile * ROWS + i
        if n < N:
            row = b * N + n
            if HAS_DR:
                dx = tl.load(DR + row * D + cols, mask=cmask, other=0.0).to(tl.float32)
            else:
                dx = tl.zeros([BLOCK_D], dtype=tl.float32)
            if HAS_NORM:
                xf = tl.load(XN + row * D + cols, mask=cmask, other=0.0).to(tl.float32)
                mean, rstd = tl.load(MEAN + row), tl.load(RSTD + row)
                xhat = tl.where(cmask, (xf - mean) * rstd, 0.0)
                dh = tl.load(DH + row * D + cols, mask=cmask, other=0.0).to(tl.float32)
                acc_sh += dh
                acc_sc += dh * xhat
                dxhat = dh * sc1
                c1 = tl.sum(dxhat * xhat, 0) / D
                c2 = tl.sum(dxhat, 0) / D
                dx += rstd * (dxhat - c2 - xhat * c1)
            tl.store(DX + row * D + cols, dx.to(DX.dtype.element_ty), mask=cmask)
            if HAS_RES:
                y = tl.load(Y + row * D + cols, mask=cmask, other=0.0).to(tl.float32)
                tl.store(DY + row * D + cols, (dx * g).to(DY.dtype.element_ty), mask=cmask)
                acc_g += dx * y
    out = (b * TILES + tile) * D + cols
    if HAS_RES:
        tl.store(PG + out, acc_g, mask=cmask)
    if HAS_NORM:
        tl.store(PSH + out, acc_sh, mask=cmask)
        tl.store(PSC + out, acc_sc, mask=cmask)
