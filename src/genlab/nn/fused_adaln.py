"""adaLN in Triton (`model.adaln=triton`, docs/performance.md): LayerNorm (no affine) + modulation, and the gated
residuals around it. A DiT block (adaLN-Zero) runs, per token row of width D and per-sample vectors:

    h1 = LN(x) * (1 + scale1) + shift1                  -> attention
    x  = x + gate1 * attn;  h2 = LN(x) * (1 + scale2) + shift2   -> MLP     (one kernel: `add_norm_modulate`)
    x  = x + gate2 * mlp                                                    (one kernel: `gated_add`)

Backward, per row with xhat = (x - mean) * rstd and dxhat = dh * (1 + scale):
dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) + dr, dy = dx * gate. CPU tensors (and inputs the
kernel does not take) run `norm_modulate_fused` and `x + gate * y`; triton is imported on the first CUDA call.
"""
from __future__ import annotations

import functools

import torch

from genlab.nn.kernels import compute_dtype
from genlab.nn.norm import adaln_registry, add_norm_modulate, norm_modulate_fused
from genlab.nn.norm import gated_add as gated_add_plain
from genlab.nn.triton_attention import HAS_TRITON, _cdiv, interpreting, require_kernels  # no triton import

MAX_D = 8192   # one row in registers
ROWS = 16      # rows per program: the per-sample vectors are loaded once per 16 rows
_kernels = functools.partial(require_kernels, "fused_adaln_kernels", "model.adaln=triton", "fused, unfused")


def supports(x: torch.Tensor) -> bool:
    """Whether the kernels run on x [B, N, D] (CUDA or the interpreter, a float dtype, D <= MAX_D)."""
    return (HAS_TRITON and (x.is_cuda or interpreting()) and x.dim() == 3 and 0 < x.shape[-1] <= MAX_D
            and x.dtype in (torch.float32, torch.bfloat16, torch.float16))


def _launch_meta(D: int) -> dict:
    block = 1 << (D - 1).bit_length()
    return {"BLOCK_D": block, "ROWS": ROWS, **({} if interpreting() else {"num_warps": 8 if block >= 2048 else 4})}


def _forward(x, y, g, sh, sc, eps: float, out_dtype: torch.dtype, res_dtype: torch.dtype):
    K = _kernels()
    B, N, D = x.shape
    has_res, has_norm = y is not None, sh is not None
    x, (y, g, sh, sc) = x.contiguous(), (v.contiguous() if v is not None else None for v in (y, g, sh, sc))
    r = torch.empty(x.shape, dtype=res_dtype, device=x.device) if has_res else x.new_empty(0)
    h = torch.empty(x.shape, dtype=out_dtype, device=x.device) if has_norm else x.new_empty(0)
    mean = torch.empty(B * N if has_norm else 0, dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    if B * N:
        K._fused_fwd[(_cdiv(N, ROWS), B)](x, y if has_res else x, g if has_res else x, sh if has_norm else x,
                                                sc if has_norm else x, r if has_res else x, h if has_norm else x,
                                                mean, rstd, N, D, eps, HAS_RES=has_res, HAS_NORM=has_norm,
                                                **_launch_meta(D))
    return r, h, mean, rstd


def _backward(xn, y, g, sc, mean, rstd, dr, dh, dx_dtype: torch.dtype):
    K = _kernels()
    B, N, D = xn.shape
    has_res, has_norm, has_dr = y is not None, dh is not None, dr is not None
    tiles = _cdiv(N, ROWS)
    dx = torch.empty(xn.shape, dtype=dx_dtype, device=xn.device)
    dy = torch.empty_like(y) if has_res else dx.new_empty(0)
    parts = {k: torch.empty((B, tiles, D) if on else (0,), dtype=torch.float32, device=xn.device)
             for k, on in (("g", has_res), ("sh", has_norm), ("sc", has_norm))}
    dr = dr.contiguous() if has_dr else None
    dh = dh.contiguous() if has_norm else None
    if B * N:
        K._fused_bwd[(tiles, B)](xn.contiguous(), y if has_res else xn, g if has_res else xn, sc if has_norm else xn,
                                 mean, rstd, dr if has_dr else xn, dh if has_norm else xn, dx,
                                 dy if has_res else dx, parts["g"], parts["sh"], parts["sc"], N, D, tiles,
                                 HAS_RES=has_res, HAS_NORM=has_norm, HAS_DR=has_dr, **_launch_meta(D))
    sums = {k: v.sum(1) if v.numel() else v.new_zeros(B, D) for k, v in parts.items()}
    return dx, dy, sums["g"], sums["sh"], sums["sc"]


# -- custom ops (one graph under torch.compile) --------------------------------------------------------------
@torch.library.custom_op("genlab::adaln_fused_fwd", mutates_args=())
def _fwd_op(x: torch.Tensor, y: torch.Tensor | None, g: torch.Tensor | None, sh: torch.Tensor | None,
            sc: torch.Tensor | None, eps: float, out_dtype: torch.dtype,
            res_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward(x, y, g, sh, sc, eps, out_dtype, res_dtype)


@_fwd_op.register_fake
def _(x, y, g, sh, sc, eps, out_dtype, res_dtype):
    B, N, D = x.shape
    r = x.new_empty(x.shape, dtype=res_dtype) if y is not None else x.new_empty(0)
    h = x.new_empty(x.shape, dtype=out_dtype) if sh is not None else x.new_empty(0)
    stats = x.new_empty(B * N if sh is not None else 0, dtype=torch.float32)
    return r, h, stats, torch.empty_like(stats)


@torch.library.custom_op("genlab::adaln_fused_bwd", mutates_args=())
def _bwd_op(xn: torch.Tensor, y: torch.Tensor | None, g: torch.Tensor | None, sc: torch.Tensor | None,
            mean: torch.Tensor, rstd: torch.Tensor, dr: torch.Tensor | None, dh: torch.Tensor | None,
            dx_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(xn, y, g, sc, mean, rstd, dr, dh, dx_dtype)


@_bwd_op.register_fake
def _(xn, y, g, sc, mean, rstd, dr, dh, dx_dtype):
    B, _, D = xn.shape
    vec = xn.new_empty((B, D), dtype=torch.float32)
    return (xn.new_empty(xn.shape, dtype=dx_dtype), torch.empty_like(y) if y is not None else xn.new_empty(0),
            vec, torch.empty_like(vec), torch.empty_like(vec))


def _setup(ctx, inputs, output):
    x, y, g, sh, sc, *_ = inputs
    # the normalised tensor is the residual output when there is one (saved instead of x: same bytes)
    ctx.save_for_backward(output[0] if y is not None else x, y, g, sc, output[2], output[3])
    ctx.dtypes = [None if t is None else t.dtype for t in (x, g, sh, sc)]


def _backward_rule(ctx, dr, dh, _dmean, _drstd):
    xn, y, g, sc, mean, rstd = ctx.saved_tensors
    x_dtype, g_dtype, sh_dtype, sc_dtype = ctx.dtypes
    has_res, has_norm = y is not None, sc is not None
    dh, dr = dh if has_norm else None, dr if has_res else None
    if has_res and not has_norm and dr is None:
        return (None,) * 8
    dx, dy, dg, dsh, dsc = _bwd_op(xn, y, g, sc, mean, rstd, dr, dh, x_dtype)
    return (dx, dy if has_res else None, dg.to(g_dtype) if has_res else None,
            dsh.to(sh_dtype) if has_norm else None, dsc.to(sc_dtype) if has_norm else None, None, None, None)


_fwd_op.register_autograd(_backward_rule, setup_context=_setup)


# -- the functions the DiT block calls ----------------------------------------------------------------------
def _res_dtype(x, y, g):
    return torch.promote_types(x.dtype, torch.promote_types(y.dtype, g.dtype))


add_norm_modulate_plain = add_norm_modulate(norm_modulate_fused)


def norm_modulate_triton(x, shift, scale, eps):
    if not supports(x):
        return norm_modulate_fused(x, shift, scale, eps)
    return _fwd_op(x, None, None, shift, scale, eps, compute_dtype(x), x.dtype)[1]


def add_norm_modulate_triton(x, y, gate, shift, scale, eps):
    """(x + gate[:, None] * y, LN(that) * (1 + scale[:, None]) + shift[:, None]) in one pass."""
    if not (supports(x) and y.shape == x.shape):
        return add_norm_modulate_plain(x, y, gate, shift, scale, eps)
    r, h, _, _ = _fwd_op(x, y, gate, shift, scale, eps, compute_dtype(x), _res_dtype(x, y, gate))
    return r, h


def gated_add_triton(x, y, gate):
    """x + gate[:, None] * y in one pass (the product in float32, unlike eager's rounded bf16 product)."""
    if not (supports(x) and y.shape == x.shape):
        return gated_add_plain(x, y, gate)
    return _fwd_op(x, y, gate, None, None, 0.0, x.dtype, _res_dtype(x, y, gate))[0]


adaln_registry.register(
    "triton", "Triton kernels (CUDA): LayerNorm + modulation, and each gated residual fused with the norm after it "
              "(plain `fused` path on CPU)",
    cuda_only=True, package="triton", add_norm=add_norm_modulate_triton, gated_add=gated_add_triton,
)(norm_modulate_triton)
