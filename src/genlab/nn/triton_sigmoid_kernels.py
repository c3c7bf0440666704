"""Triton kernels of sigmoid attention (see ``triton_sigmoid.py``); imported lazily, on first use.

q ``[B, H, N, D]``, k, v ``[B, H, M, D]``, unit stride over D. Program ids: axis 0 = the block of rows a program owns
(query rows for the forward and dQ, key rows for dK/dV), axis 1 = batch * heads. Sigmoid weights need no running max
and no row sum, so each key block is independent. Rows past N or M load as zeros and zero v / dO rows make their
terms vanish, so only the causal mask (query i sees keys j <= i + M - N) needs ``p = 0``; blocks wholly below the
diagonal run without it (``MASK=False``).
"""
import triton
import triton.language as tl

from genlab.nn.triton_attention_kernels import _key_blocks, _load_rows, _load_rows_t, _store_rows


@triton.jit
def _sigmoid(s, scale2, bias2, RCP_ITERS: tl.constexpr):
    """sigmoid(s * scale + bias) = 1 / (1 + 2^-(s * scale2 + bias2)), scale2 and bias2 times log2(e).

    The exp2 takes the MUFU unit (16 ops/clk/SM on H100, as slow as the head-dim-64 matmuls per score), so the
    reciprocal is not a second MUFU op: RCP_ITERS > 0 computes it on the FMA pipe from a bit-trick first
    guess (within 5%) and Newton steps y += y (1 - d y) that square the relative error (2 steps: 7e-6,
    3 steps: 1e-7); RCP_ITERS = 0 divides. The exponent is capped at 100 so d and its guess stay normal."""
    d = 1.0 + tl.math.exp2(tl.minimum(-(s * scale2 + bias2), 100.0))
    if RCP_ITERS == 0:
        p = 1.0 / d
    else:
        p = (0x7EF311C7 - d.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
        for _ in tl.static_range(RCP_ITERS):
            p = p + p * (1.0 - d * p)
    return p


# -- forward: O = sigmoid(Q K^T scale + bias) V, one program per (query block, batch*head) -------------------------
@triton.jit
def _fwd_inner(acc, q, k_base, v_base, stride_kn, stride_vn, offs_m, lo, hi, M_KV, causal_off, scale2, bias2,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, EVEN_N: tl.constexpr,
               PRECISION: tl.constexpr, RCP_ITERS: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt = _load_rows_t(k_base, offs_n, stride_kn, offs_d, M_KV, EVEN_N)
        v = _load_rows(v_base, offs_n, stride_vn, offs_d, M_KV, EVEN_N)
        p = _sigmoid(tl.dot(q, kt, input_precision=PRECISION), scale2, bias2, RCP_ITERS)
        if MASK:  # causal: query i sees key j iff j <= i + M - N
            p = tl.where(offs_n[None, :] <= offs_m[:, None] + causal_off, p, 0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
    return acc


@triton.jit
def _sigmoid_fwd(Q, K, V, O, scale2, bias2,
                 stride_qz, stride_qh, stride_qn, stride_kz, stride_kh, stride_kn,
                 stride_vz, stride_vh, stride_vn, stride_oz, stride_oh, stride_on,
                 H, N_Q, M_KV,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                 EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, PRECISION: tl.constexpr, RCP_ITERS: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = _load_rows(Q + off_z * stride_qz + off_h * stride_qh, offs_m, stride_qn, offs_d, N_Q, EVEN_M)
    k_base = K + off_z * stride_kz + off_h * stride_kh
    v_base = V + off_z * stride_vz + off_h * stride_vh
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    causal_off = M_KV - N_Q
    mid, hi = _key_blocks(start_m, M_KV, causal_off, BLOCK_M, BLOCK_N, CAUSAL)
    acc = _fwd_inner(acc, q, k_base, v_base, stride_kn, stride_vn, offs_m, 0, mid, M_KV, causal_off,
                     scale2, bias2, HEAD_DIM, BLOCK_N, False, True, PRECISION, RCP_ITERS)
    acc = _fwd_inner(acc, q, k_base, v_base, stride_kn, stride_vn, offs_m, mid, hi, M_KV, causal_off,
                     scale2, bias2, HEAD_DIM, BLOCK_N, CAUSAL, EVEN_N and CAUSAL, PRECISION, RCP_ITERS)
    _store_rows(O + off_z * stride_oz + off_h * stride_oh, offs_m, stride_on, offs_d, N_Q, acc, EVEN_M)


# -- backward, dK and dV: one program per (key block, batch*head), looping over query blocks. ----------------------
# Transposed tiles (keys on rows): sT = K Q^T, dV += pT dO, dpT = V dO^T, dsT = dpT pT (1 - pT), dK += dsT Q.
@triton.jit
def _dkdv_inner(dk, dv, k, v, q_base, do_base, stride_qn, stride_dn, offs_n, lo, hi, N_Q, causal_off, scale2, bias2,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, MASK: tl.constexpr, EVEN_M: tl.constexpr,
                PRECISION: tl.constexpr, RCP_ITERS: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        qt = _load_rows_t(q_base, offs_m, stride_qn, offs_d, N_Q, EVEN_M)
        do = _load_rows(do_base, offs_m, stride_dn, offs_d, N_Q, EVEN_M)
        pt = _sigmoid(tl.dot(k, qt, input_precision=PRECISION), scale2, bias2, RCP_ITERS)
        if MASK:
            pt = tl.where(offs_n[:, None] <= offs_m[None, :] + causal_off, pt, 0.0)
        dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=PRECISION)
        dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        dst = dpt * pt * (1.0 - pt)
        dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk, input_precision=PRECISION)
    return dk, dv


@triton.jit
def _sigmoid_bwd_dkdv(Q, K, V, DO, DK, DV, scale, scale2, bias2,
                      stride_qz, stride_qh, stride_qn, stride_kz, stride_kh, stride_kn,
                      stride_vz, stride_vh, stride_vn, stride_dz, stride_dh, stride_dn,
                      stride_gz, stride_gh, stride_gn,
                      H, N_Q, M_KV,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                      EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, PRECISION: tl.constexpr, RCP_ITERS: tl.constexpr):
    start_n = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k = _load_rows(K + off_z * stride_kz + off_h * stride_kh, offs_n, stride_kn, offs_d, M_KV, EVEN_N)
    v = _load_rows(V + off_z * stride_vz + off_h * stride_vh, offs_n, stride_vn, offs_d, M_KV, EVEN_N)
    q_base = Q + off_z * stride_qz + off_h * stride_qh
    do_base = DO + off_z * stride_dz + off_h * stride_dh
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    causal_off = M_KV - N_Q
    if CAUSAL:
        # rows i >= j - off see key j: start at the block of the first row that sees this key block, and
        # from the first row that sees all of it (i >= last_key - off) on, no mask is needed
        lo = tl.maximum(start_n * BLOCK_N - causal_off, 0) // BLOCK_M * BLOCK_M
        mid = tl.minimum(tl.cdiv(tl.maximum(start_n * BLOCK_N + BLOCK_N - 1 - causal_off, 0), BLOCK_M) * BLOCK_M, N_Q)
        mid = tl.maximum(mid, lo)
        dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, stride_qn, stride_dn, offs_n, lo, mid, N_Q, causal_off,
                             scale2, bias2, HEAD_DIM, BLOCK_M, True, EVEN_M, PRECISION, RCP_ITERS)
    else:
        mid = 0
    dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, stride_qn, stride_dn, offs_n, mid, N_Q, N_Q, causal_off,
                         scale2, bias2, HEAD_DIM, BLOCK_M, False, EVEN_M, PRECISION, RCP_ITERS)
    _store_rows(DK + off_z * stride_gz + off_h * stride_gh, offs_n, stride_gn, offs_d, M_KV, dk * scale, EVEN_N)
    _store_rows(DV + off_z * stride_gz + off_h * stride_gh, offs_n, stride_gn, offs_d, M_KV, dv, EVEN_N)


# -- backward, dQ: one program per (query block, batch*head), looping over key blocks (same ranges as the forward). ---
# dp = dO V^T, ds = dp p (1 - p), dQ += ds K.
@triton.jit
def _dq_inner(dq, q, do, k_base, v_base, stride_kn, stride_vn, offs_m, lo, hi, M_KV, causal_off, scale2, bias2,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr, EVEN_N: tl.constexpr,
              PRECISION: tl.constexpr, RCP_ITERS: tl.constexpr):
    offs_d = tl.arange(0, HEAD_DIM)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kt = _load_rows_t(k_base, offs_n, stride_kn, offs_d, M_KV, EVEN_N)
        vt = _load_rows_t(v_base, offs_n, stride_vn, offs_d, M_KV, EVEN_N)
        p = _sigmoid(tl.dot(q, kt, input_precision=PRECISION), scale2, bias2, RCP_ITERS)
        if MASK:
            p = tl.where(offs_n[None, :] <= offs_m[:, None] + causal_off, p, 0.0)
        dp = tl.dot(do, vt, input_precision=PRECISION)
        ds = dp * p * (1.0 - p)
        dq = tl.dot(ds.to(kt.dtype), tl.trans(kt), dq, input_precision=PRECISION)
    return dq


@triton.jit
def _sigmoid_bwd_dq(Q, K, V, DO, DQ, scale, scale2, bias2,
                    stride_qz, stride_qh, stride_qn, stride_kz, stride_kh, stride_kn,
                    stride_vz, stride_vh, stride_vn, stride_dz, stride_dh, stride_dn,
                    stride_gz, stride_gh, stride_gn,
                    H, N_Q, M_KV,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                    EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, PRECISION: tl.constexpr, RCP_ITERS: tl.constexpr):
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = (off_hz // H).to(tl.int64)
    off_h = (off_hz % H).to(tl.int64)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q = _load_rows(Q + off_z * stride_qz + off_h * stride_qh, offs_m, stride_qn, offs_d, N_Q, EVEN_M)
    do = _load_rows(DO + off_z * stride_dz + off_h * stride_dh, offs_m, stride_dn, offs_d, N_Q, EVEN_M)
    k_base = K + off_z * stride_kz + off_h * stride_kh
    v_base = V + off_z * stride_vz + off_h * stride_vh
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    causal_off = M_KV - N_Q
    mid, hi = _key_blocks(start_m, M_KV, causal_off, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _dq_inner(dq, q, do, k_base, v_base, stride_kn, stride_vn, offs_m, 0, mid, M_KV, causal_off,
                   scale2, bias2, HEAD_DIM, BLOCK_N, False, True, PRECISION, RCP_ITERS)
    dq = _dq_inner(dq, q, do, k_base, v_base, stride_kn, stride_vn, offs_m, mid, hi, M_KV, causal_off,
                   scale2, bias2, HEAD_DIM, BLOCK_N, CAUSAL, EVEN_N and CAUSAL, PRECISION, RCP_ITERS)
    _store_rows(DQ + off_z * stride_gz + off_h * stride_gh, offs_m, stride_gn, offs_d, N_Q, dq * scale, EVEN_M)
