"""Softmax attention on the packed QKV layout (`model.attention=cudnn_packed`, docs/performance.md): q, k, v are read as
strided views of the fused QKV projection's output h [B, N, 3C] (C = heads * hd), and the backward writes dq, dk, dv
into one new [B, N, 3C] buffer, the gradient of h as it stands: no assembly of the three gradients afterwards (DiT-B/2
on an H100 profiled that assembly at ~3.7 ms of a ~96 ms step, issue 54). The output o is a [B, heads, N, hd] view of
a [B, N, heads, hd] buffer, so the output projection's reshape is free.

Kernels: the SDPA forward and backward nodes of NVIDIA's cuDNN frontend (PyPI nvidia-cudnn-frontend==1.32.0, import
name `cudnn`, its `pygraph` API), one graph per shape. It loads the cuDNN 9 library of torch's own nvidia-cudnn wheel
(cuDNN >= 9 is needed) and takes bf16/fp16 with head dims that are multiples of 8, up to 128 (256 on sm90+). The two
steps are custom ops (one graph under torch.compile). Where cuDNN does not run, the same ops run a plain composition of
the same contract (CPU tensors: the tests check the layouts and the backward's math with it); float32 on CUDA
(sampling, train.precision=fp32) runs SDPA on the views. A layer with qk-norm, RoPE, a mask, attention dropout or a
qkv_kernel other than plain, and every caller of heads_qkv + kernel (MMDiT's joint blocks), runs the entry's ordinary
(q, k, v) callable: SDPA forced to cuDNN on CUDA (plain SDPA on CPU), as `sdpa_cudnn`.
"""
from __future__ import annotations

import importlib.util
import threading

import torch

from genlab.core.errors import GenlabError
from genlab.nn.attention import _sdpa_with, math_attention, sdpa_attention
from genlab.nn.attention_spec import attention_registry

HAS_CUDNN = importlib.util.find_spec("cudnn") is not None  # the frontend, found without importing it
MAX_HEAD_DIM, MAX_HEAD_DIM_SM90 = 128, 256
UID = {"q": 1, "k": 2, "v": 3, "o": 4, "stats": 5, "do": 6, "dq": 7, "dk": 8, "dv": 9}
_GRAPHS: dict = {}
_TLS = threading.local()  # one handle per thread and device (autograd runs the backward on its own thread)


def supports(h: torch.Tensor, heads: int) -> bool:
    """Whether the cuDNN graphs take this h [B, N, 3C]: CUDA, bf16/fp16, a head dim that is a multiple of 8."""
    hd = h.shape[-1] // (3 * heads)
    return HAS_CUDNN and h.is_cuda and h.dtype in (torch.bfloat16, torch.float16) and hd % 8 == 0 \
        and hd <= MAX_HEAD_DIM_SM90


def check(head_dim: int, device=None) -> None:
    """Build-time refusal of head dims cuDNN's SDPA does not take (one line, with the other choices)."""
    limit = MAX_HEAD_DIM
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9:
        limit = MAX_HEAD_DIM_SM90
    if head_dim % 8 or head_dim > limit:
        others = ", ".join(n for n in attention_registry.names() if n != "cudnn_packed")
        raise GenlabError(f"model.attention=cudnn_packed needs a head dim that is a multiple of 8 and at most {limit}, "
                          f"got {head_dim}; valid choices for this model: {others}")


def views(h: torch.Tensor, heads: int):
    """h [B, N, 3C] -> q, k, v [B, heads, N, hd]: views, strides (N 3C, hd, 3C, 1), offsets 0, C, 2C."""
    B, N, C3 = h.shape
    return h.view(B, N, 3, heads, C3 // (3 * heads)).permute(2, 0, 3, 1, 4).unbind(0)


def _new_bnhd(B, H, N, hd, dtype, device):
    """[B, H, N, hd] view of a new [B, N, H, hd] buffer."""
    return torch.empty(B, N, H, hd, dtype=dtype, device=device).permute(0, 2, 1, 3)


def _as_bnhd(t: torch.Tensor) -> torch.Tensor:
    """t [B, H, N, hd] in the [B, N, H, hd] layout the graphs declare (a copy only where it is not)."""
    return t if t.transpose(1, 2).is_contiguous() else t.transpose(1, 2).contiguous().transpose(1, 2)


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)  # cuDNN's stats are float32; float64 inputs keep float64


# -- the plain composition (CPU, and the contract the cuDNN graphs implement) ---------------------------------------
def _scores(q, k, causal: bool, scale: float):
    s = (q @ k.transpose(-2, -1)) * scale
    if causal:
        n = q.shape[-2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s


def _plain_fwd(h, heads, causal, scale):
    acc = _stats_dtype(h.dtype)  # softmax in at least float32, as cuDNN's
    q, k, v = (t.to(acc) for t in views(h, heads))
    s = _scores(q, k, causal, scale)
    lse = s.logsumexp(-1, keepdim=True)
    o = _new_bnhd(*q.shape, h.dtype, h.device)
    o.copy_(torch.exp(s - lse) @ v)
    return o, lse


def _plain_bwd(do, h, o, stats, heads, causal, scale):
    """The softmax-attention gradients from the saved log-sum-exp: P = exp(S - lse), D = rowsum(dO * O),
    dV = P^T dO, dS = P (dO V^T - D), dQ = scale dS K, dK = scale dS^T Q; written into one [B, N, 3C] buffer."""
    acc = stats.dtype
    q, k, v = (t.to(acc) for t in views(h, heads))
    do, o = do.to(acc), o.to(acc)
    p = torch.exp(_scores(q, k, causal, scale) - stats)
    ds = p * (do @ v.transpose(-2, -1) - (do * o).sum(-1, keepdim=True))
    dh = torch.empty_like(h, memory_format=torch.contiguous_format)
    for part, g in zip(views(dh, heads), (scale * ds @ k, scale * ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ do)):
        part.copy_(g)
    return dh


# -- cuDNN ------------------------------------------------------------------------------------------------------------
def _handle(device: torch.device):
    """This thread's cuDNN handle for `device`, on torch's current stream."""
    import cudnn  # optional (.[kernels]); imported on the first CUDA call only
    handles = _TLS.__dict__.setdefault("handles", {})
    if device not in handles:
        with torch.cuda.device(device):  # create_handle binds the current device
            handles[device] = cudnn.create_handle()
    cudnn.set_stream(handle=handles[device], stream=torch.cuda.current_stream(device).cuda_stream)
    return handles[device]


def _graph(step: str, h: torch.Tensor, heads: int, causal: bool, scale: float, handle):
    """(built pygraph, workspace bytes) of the forward or backward (`step`) at h's shape; built once per key."""
    B, N, C3 = h.shape
    hd = C3 // (3 * heads)
    key = (step, h.dtype, B, heads, N, hd, causal, scale, h.device)
    if key not in _GRAPHS:
        _GRAPHS[key] = _build(step, h.dtype, B, heads, N, hd, causal, scale, handle)
    return _GRAPHS[key]


def _build(step, dtype, B, H, N, hd, causal, scale, handle):
    import cudnn  # optional (.[kernels]); imported on the first CUDA call only
    io = cudnn.data_type.BFLOAT16 if dtype == torch.bfloat16 else cudnn.data_type.HALF
    g = cudnn.pygraph(handle=handle, io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT)
    C = H * hd
    dims, stats_dims = [B, H, N, hd], [B, H, N, 1]
    packed = [N * 3 * C, hd, 3 * C, 1]     # q, k, v (and dq, dk, dv): views of one [B, N, 3C] buffer
    bnhd = [N * C, hd, C, 1]               # o and dO: views of a [B, N, H, hd] buffer
    stats_stride = [H * N, N, 1, 1]
    q, k, v = (g.tensor(name=n, dim=dims, stride=packed, data_type=io, uid=UID[n]) for n in ("q", "k", "v"))
    # causal: no key to the right of the diagonal, counted from the top left (queries and keys are the same tokens)
    band = dict(diagonal_alignment=cudnn.diagonal_alignment.TOP_LEFT, diagonal_band_right_bound=0 if causal else None)
    if step == "fwd":
        o, stats = g.sdpa(name="fwd", q=q, k=k, v=v, generate_stats=True, attn_scale=scale, **band)
        o.set_uid(UID["o"]).set_output(True).set_dim(dims).set_stride(bnhd).set_data_type(io)
        stats.set_uid(UID["stats"]).set_output(True).set_dim(stats_dims).set_stride(stats_stride) \
            .set_data_type(cudnn.data_type.FLOAT)
    else:
        o = g.tensor(name="o", dim=dims, stride=bnhd, data_type=io, uid=UID["o"])
        do = g.tensor(name="dO", dim=dims, stride=bnhd, data_type=io, uid=UID["do"])
        stats = g.tensor(name="stats", dim=stats_dims, stride=stats_stride, data_type=cudnn.data_type.FLOAT,
                         uid=UID["stats"])
        grads = g.sdpa_backward(name="bwd", q=q, k=k, v=v, o=o, dO=do, stats=stats, attn_scale=scale, **band)
        for t, n in zip(grads, ("dq", "dk", "dv")):
            t.set_uid(UID[n]).set_output(True).set_dim(dims).set_stride(packed).set_data_type(io)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g, g.get_workspace_size()


def _run(step, h, heads, causal, scale, named: dict) -> None:
    handle = _handle(h.device)
    g, ws = _graph(step, h, heads, causal, scale, handle)
    workspace = torch.empty(max(ws, 1), dtype=torch.uint8, device=h.device)  # torch's caching allocator
    g.execute(list(named.values()), workspace, handle=handle, tensor_uids=[UID[n] for n in named])


def _cudnn_fwd(h, heads, causal, scale):
    q, k, v = views(h, heads)
    B, H, N, hd = q.shape
    o = _new_bnhd(B, H, N, hd, h.dtype, h.device)
    stats = torch.empty(B, H, N, 1, dtype=torch.float32, device=h.device)
    _run("fwd", h, heads, causal, scale, {"q": q, "k": k, "v": v, "o": o, "stats": stats})
    return o, stats


def _cudnn_bwd(do, h, o, stats, heads, causal, scale):
    dh = torch.empty_like(h, memory_format=torch.contiguous_format)
    q, k, v = views(h, heads)
    dq, dk, dv = views(dh, heads)
    _run("bwd", h, heads, causal, scale, {"q": q, "k": k, "v": v, "o": _as_bnhd(o), "do": _as_bnhd(do),
                                          "stats": stats.contiguous(), "dq": dq, "dk": dk, "dv": dv})
    return dh


# -- the custom ops -------------------------------------------------------------------------------------------------
@torch.library.custom_op("genlab::packed_attention_fwd", mutates_args=())
def _fwd(h: torch.Tensor, heads: int, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """h [B, N, 3C] -> (o [B, heads, N, hd] in a [B, N, heads, hd] buffer, stats: log-sum-exp of the scaled scores)."""
    h = h.contiguous()
    return (_cudnn_fwd if supports(h, heads) else _plain_fwd)(h, heads, causal, scale)


@_fwd.register_fake
def _(h, heads, causal, scale):
    B, N, C3 = h.shape
    return _new_bnhd(B, heads, N, C3 // (3 * heads), h.dtype, h.device), \
        h.new_empty(B, heads, N, 1, dtype=_stats_dtype(h.dtype))


@torch.library.custom_op("genlab::packed_attention_bwd", mutates_args=())
def _bwd(do: torch.Tensor, h: torch.Tensor, o: torch.Tensor, stats: torch.Tensor, heads: int, causal: bool,
         scale: float) -> torch.Tensor:
    """The gradient of h [B, N, 3C]: dq, dk, dv written into one contiguous buffer."""
    h = h.contiguous()
    return (_cudnn_bwd if supports(h, heads) else _plain_bwd)(do, h, o, stats, heads, causal, scale)


@_bwd.register_fake
def _(do, h, o, stats, heads, causal, scale):
    return torch.empty_like(h, memory_format=torch.contiguous_format)


def _setup(ctx, inputs, output):
    h, heads, causal, scale = inputs
    ctx.save_for_backward(h, *output)
    ctx.args = (heads, causal, scale)


def _backward(ctx, do, _dstats):  # the stats feed the backward only; nothing flows back through them
    h, o, stats = ctx.saved_tensors
    return _bwd(do.to(h.dtype), h, o, stats, *ctx.args), None, None, None


_fwd.register_autograd(_backward, setup_context=_setup)


def packed_attention(h: torch.Tensor, heads: int, causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd)) v with q, k, v the thirds of h [B, N, 3C] -> [B, heads, N, hd] (a view of a
    [B, N, heads, hd] buffer)."""
    if h.is_cuda and not supports(h, heads):  # float32 on CUDA (sampling): SDPA on the views
        return sdpa_attention(*views(h, heads), causal=causal)
    return _fwd(h, heads, causal, (h.shape[-1] // (3 * heads)) ** -0.5)[0]


_cudnn_sdpa = _sdpa_with("CUDNN_ATTENTION", half_only=True)


def cudnn_packed_attention(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
    """The ordinary (q, k, v) path, where the layer cannot take the packed one: SDPA forced to cuDNN on CUDA."""
    return _cudnn_sdpa(q, k, v, causal=causal, mask=mask, dropout_p=dropout_p)


attention_registry.register(
    "cudnn_packed", "cuDNN frontend SDPA on q, k, v read from the fused QKV output, gradients written into one packed "
                    "buffer (bf16/fp16, CUDA; head dims multiples of 8); else SDPA forced to cuDNN, plain on CPU",
    check=check, package="cudnn", packed=packed_attention, forward_ad=False, jvp_fallback=sdpa_attention,
    vmap_fallback=math_attention)(cudnn_packed_attention)
