"""Attention kernels (registry `attention`): `(q, k, v, causal, mask, dropout_p) -> out` on [B, H, N, D] tensors, or
a module class built per layer when the kernel owns parameters (differential); `Attention` is the layer around
them (fused QKV projection, qk-norm, RoPE, output projection), `attention_flops` their analytic FLOP count."""
from __future__ import annotations

import contextlib
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.core.errors import GenlabError
from genlab.core.registry import Registry
from genlab.nn.attention_spec import attention_registry
from genlab.nn.kernels import KernelSpec
from genlab.nn.positions import apply_rope

qkv_kernel_registry = Registry("qkv_kernel", KernelSpec)


@attention_registry.register("math", "naive softmax attention in plain torch ops (reference)")
def math_attention(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
    scale = q.shape[-1] ** -0.5
    att = (q @ k.transpose(-2, -1)) * scale
    if causal:
        n, m = q.shape[-2], k.shape[-2]
        keep = torch.ones(n, m, dtype=torch.bool, device=q.device).tril(m - n)
        att = att.masked_fill(~keep, float("-inf"))
    if mask is not None:
        att = att.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else att + mask
    att = att.softmax(-1)
    return (F.dropout(att, dropout_p) if dropout_p > 0 else att) @ v


@attention_registry.register("sdpa", "softmax attention via F.scaled_dot_product_attention (flash/cuDNN/efficient kernels)",
                             forward_ad=False, vmap_fallback=math_attention)
def sdpa_attention(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal and mask is None, dropout_p=dropout_p)


_NOTED: set[str] = set()


def _sdpa_with(backend_name, half_only: bool = False):
    """SDPA restricted to one kernel on CUDA (same function; for ablating flash vs cuDNN vs efficient). A kernel
    that takes fp16/bf16 only (half_only) would abort on float32 inputs (sampling runs outside the training
    autocast, as does train.precision=fp32): those run plain SDPA, with one note per process."""
    def attend(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
        plain = not q.is_cuda or half_only and q.dtype not in (torch.float16, torch.bfloat16)
        if plain and q.is_cuda and backend_name not in _NOTED:
            _NOTED.add(backend_name)
            print(f"genlab: note: SDPA's {backend_name.lower()} kernel takes fp16/bf16 only; {q.dtype} inputs "
                  f"(sampling, or train.precision=fp32) run plain SDPA", file=sys.stderr)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with contextlib.nullcontext() if plain else sdpa_kernel(getattr(SDPBackend, backend_name)):
            return sdpa_attention(q, k, v, causal=causal, mask=mask, dropout_p=dropout_p)
    return attend


# a JVP runs them as plain sdpa (their own sdpa_kernel context would override the math kernel's)
for _name, _kernel, _what, _half in (("sdpa_flash", "FLASH_ATTENTION", "the flash kernel", True),
                                     ("sdpa_cudnn", "CUDNN_ATTENTION", "cuDNN attention", True),
                                     ("sdpa_efficient", "EFFICIENT_ATTENTION", "the memory-efficient kernel", False)):
    attention_registry.register(_name, f"SDPA forced to {_what} on CUDA (plain sdpa on CPU)", forward_ad=False,
                                jvp_fallback=sdpa_attention, vmap_fallback=math_attention)(_sdpa_with(_kernel, _half))


@attention_registry.register("sdpa_contiguous", "SDPA on contiguous copies of q/k/v instead of strided views of the fused QKV output",
                             forward_ad=False, vmap_fallback=math_attention)
def sdpa_contiguous_attention(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
    # A standalone H100 test timed cuDNN SDPA fwd+bwd at 1.35 ms on contiguous q/k/v against 2.46 ms on the
    # packed views (docs/benchmarks.md); whether the copies pay for themselves end to end is what this ablates.
    return sdpa_attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=causal, mask=mask, dropout_p=dropout_p)


@attention_registry.register("flex", "FlexAttention (torch.nn.attention.flex_attention; compiled on CUDA, forward-only on CPU)",
                             cpu_backward=False,  # torch implements FlexAttention's backward for CUDA only
                             forward_ad=False, jvp_fallback=sdpa_attention)
def flex_attention(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
    from torch.nn.attention.flex_attention import flex_attention as flex
    if mask is not None or dropout_p > 0:
        raise GenlabError("model.attention=flex supports neither explicit masks nor attention dropout; use sdpa or math")
    block_mask = _causal_block_mask(q.shape[-2], k.shape[-2], q.device) if causal else None
    run = _compiled_flex() if q.is_cuda else flex  # eager flex is a slow reference; its kernels come from compile
    return run(q, k, v, block_mask=block_mask)


_BLOCK_MASKS = {}
_FLEX = []


def _causal_block_mask(n: int, m: int, device):
    """FlexAttention block mask for causal attention of n queries over m keys (queries are the last n positions)."""
    from torch.nn.attention.flex_attention import create_block_mask
    key = (n, m, str(device))
    if key not in _BLOCK_MASKS:  # built once per shape: creating a block mask costs more than the attention
        _BLOCK_MASKS[key] = create_block_mask(lambda b, h, qi, ki: qi + (m - n) >= ki, None, None, n, m, device=device)
    return _BLOCK_MASKS[key]


def _compiled_flex():
    if not _FLEX:
        from torch.nn.attention.flex_attention import flex_attention as flex
        _FLEX.append(torch.compile(flex, dynamic=False))
    return _FLEX[0]


def sigmoid_attention_plain(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
    """sigmoid(q k^T / sqrt(d) - log n) v in plain torch ops (reference; runs anywhere, with gradients)."""
    m = k.shape[-2]
    logits = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5 - math.log(m)
    if mask is not None and mask.dtype != torch.bool:  # float: added to the logits, like sdpa's additive mask
        logits = logits + mask
    att = torch.sigmoid(logits)
    if mask is not None and mask.dtype == torch.bool:  # False drops the key
        att = att.masked_fill(~mask, 0.0)
    if causal:  # sigmoid weights are not normalised, so a masked key must be zeroed, not sent to -inf
        n = q.shape[-2]
        att = att * torch.ones(n, m, dtype=att.dtype, device=q.device).tril(m - n)
    return (F.dropout(att, dropout_p) if dropout_p > 0 else att) @ v


def sigmoid_attention_flex(q, k, v, causal: bool = False):
    """The same through FlexAttention: a score_mod of logsigmoid(s - log n) makes flex's exp() the sigmoid weight;
    flex then divides by their sum, which its log-sum-exp returns, so multiplying by exp(lse) undoes it."""
    from torch.nn.attention.flex_attention import AuxRequest
    from torch.nn.attention.flex_attention import flex_attention as flex
    n, m = q.shape[-2], k.shape[-2]
    bias = -math.log(m)

    def score_mod(score, b, h, qi, ki):
        return F.logsigmoid(score + bias)

    block_mask = _causal_block_mask(n, m, q.device) if causal else None
    run = _compiled_flex() if q.is_cuda else flex
    out, aux = run(q, k, v, score_mod=score_mod, block_mask=block_mask, return_aux=AuxRequest(lse=True))
    return out * aux.lse.exp().unsqueeze(-1).to(out.dtype)


@attention_registry.register("sigmoid", "sigmoid attention with the -log(n) bias (Ramapuram et al. 2024); genlab's "
                                        "Triton kernel on CUDA (head dims 32/64/128), else FlexAttention; plain torch "
                                        "on CPU or with masks/dropout", forward_ad=False,
                             jvp_fallback=sigmoid_attention_plain)
def sigmoid_attention(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
    if q.is_cuda and mask is None and dropout_p == 0:
        from genlab.nn import triton_sigmoid  # triton itself is imported on first use
        if triton_sigmoid.supports(q, k, v):  # 1.03x SDPA's fwd+bwd at 256 tokens on an H100, flex 3.3x
            return triton_sigmoid.sigmoid_attention_triton(q, k, v, causal=causal)
    return sigmoid_attention_flex_entry(q, k, v, causal=causal, mask=mask, dropout_p=dropout_p)


@attention_registry.register("sigmoid_flex", "sigmoid attention through FlexAttention (a logsigmoid score_mod) on "
                                             "CUDA, plain torch on CPU or with masks/dropout", forward_ad=False,
                             jvp_fallback=sigmoid_attention_plain)
def sigmoid_attention_flex_entry(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
    if q.is_cuda and mask is None and dropout_p == 0:
        return sigmoid_attention_flex(q, k, v, causal=causal)
    return sigmoid_attention_plain(q, k, v, causal=causal, mask=mask, dropout_p=dropout_p)


# linear attention: K^T V (2 m d^2), Q (K^T V) (2 n d^2) and the normaliser Q sum_j k_j (2 n d): linear in tokens;
# causal: q_i against the prefix sums S_i = sum_{j<=i} k_j v_j^T (2 n d^2); the prefix sums and the normaliser
# are element-wise work (about 2 n d^2 more), which the matmul convention of MFU does not count
@attention_registry.register("linear", "SANA's ReLU linear attention (Xie et al. 2024), O(n) in fp32; causal via "
                                       "running sums (O(n d^2) memory); no masks or attention dropout",
                             flops=lambda n, m, d: 2 * m * d * d + 2 * n * d * d + 2 * n * d,
                             causal_flops=lambda n, m, d: 2 * n * d * d)
def linear_attention(q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0, eps: float = 1e-6):
    if mask is not None or dropout_p > 0:
        raise GenlabError("model.attention=linear supports neither explicit masks nor attention dropout "
                          "(it never forms the attention matrix); use sdpa or math")
    dtype, work = q.dtype, torch.promote_types(q.dtype, torch.float32)  # at least fp32: sums over all keys lose bf16's bits
    q, k, v = F.relu(q.to(work)), F.relu(k.to(work)), v.to(work)
    if not causal:
        kv = k.transpose(-2, -1) @ v                            # [B, H, d, dv]: K^T V first, so no n x n matrix
        num = q @ kv
        den = q @ k.sum(-2).unsqueeze(-1)                       # [B, H, n, 1]
    else:  # query i sees keys j <= i + (m - n): prefix sums of k_j v_j^T and of k_j
        off = k.shape[-2] - q.shape[-2]
        kv = torch.cumsum(k.unsqueeze(-1) * v.unsqueeze(-2), dim=-3)[..., off:, :, :]
        num = torch.einsum("bhnd,bhnde->bhne", q, kv)
        den = (q * k.cumsum(-2)[..., off:, :]).sum(-1, keepdim=True)
    return (num / (den + eps)).to(dtype)


class DifferentialAttention(nn.Module):
    """Differential attention (Ye et al. 2024): (softmax(q1 k1^T) - lambda softmax(q2 k2^T)) v with q, k split in
    halves per head, lambda = exp(lq1.lk1) - exp(lq2.lk2) + lambda_init, then a per-head RMSNorm times (1 - lambda_init)."""

    def __init__(self, head_dim: int, heads: int, layer: int = 0):
        super().__init__()
        self.check(head_dim)
        half = head_dim // 2
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer)  # the paper's 0.8 - 0.6 exp(-0.3 (l - 1)), l = layer + 1
        # forward reads it from a buffer: a float attribute differs per block, and torch.compile guards on it, so
        # compile=blocks would recompile every block (past dynamo's limit: silently eager)
        self.register_buffer("lambda_init_t", torch.tensor(self.lambda_init, dtype=torch.float64),
                             persistent=False)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(half) * 0.1) for _ in range(4))
        self.norm = nn.RMSNorm(head_dim, eps=1e-5)

    @staticmethod
    def check(head_dim: int, device=None):
        if head_dim % 2:
            raise GenlabError(f"model.attention=differential splits each head's q and k in halves; head dim {head_dim} is odd")

    def lam(self) -> torch.Tensor:
        return (torch.exp(self.lambda_q1 @ self.lambda_k1) - torch.exp(self.lambda_q2 @ self.lambda_k2)
                + self.lambda_init_t.to(self.lambda_q1.dtype))

    def forward(self, q, k, v, causal: bool = False, mask=None, dropout_p: float = 0.0):
        q1, q2 = q.chunk(2, dim=-1)
        k1, k2 = k.chunk(2, dim=-1)
        # A1 v - lambda A2 v: two SDPA calls keep the fused kernels (scale 1/sqrt(head_dim / 2), as in the paper)
        a1 = sdpa_attention(q1, k1, v, causal=causal, mask=mask, dropout_p=dropout_p)
        a2 = sdpa_attention(q2, k2, v, causal=causal, mask=mask, dropout_p=dropout_p)
        out = a1 - self.lam().to(a1.dtype) * a2
        return self.norm(out) * (1 - self.lambda_init_t.to(out.dtype))


# two maps over half-width q/k (2 n m d/2 each) and two weighted sums over full-width v (2 n m d each)
attention_registry.register("differential", "Differential Transformer attention (Ye et al. 2024): two softmax "
                                            "maps subtracted with a learned lambda, per-head RMSNorm",
                            flops=lambda n, m, d: 2 * (2 * n * m * (d // 2) + 2 * n * m * d),
                            head_multiple=2,  # each head splits in halves
                            forward_ad=False)(DifferentialAttention)  # its two SDPA calls: the math kernel in a JVP


@qkv_kernel_registry.register("plain", "view and permute into heads, then RMSNorm (model.qk_norm) and RoPE of q and k "
                                      "as separate ops (fused by inductor under torch.compile)")
def split_plain(h, heads: int, q_norm, k_norm, rope=None):
    """The QKV projection's output h [B, N, 3 * D] -> q, k, v [B, heads, N, D / heads] (normalised and rotated)."""
    B, N, C = h.shape
    q, k, v = h.view(B, N, 3, heads, C // (3 * heads)).permute(2, 0, 3, 1, 4)
    q, k = q_norm(q), k_norm(k)
    if rope is not None:
        q, k = apply_rope(q, rope), apply_rope(k, rope)
    return q, k, v


class Attention(nn.Module):
    """Multi-head self-attention with one fused QKV projection; causality is a call argument, never a default.
    `layer` (0-based) goes to entries that own parameters (differential). kernel=False builds only the projections:
    a stream of a joint (MMDiT) block attended by another stream's kernel, so differential's lambda exists once."""

    def __init__(self, dim: int, heads: int, backend: str = "sdpa", qk_norm: bool = False, bias: bool = True,
                 attn_dropout: float = 0.0, layer: int = 0, kernel: bool = True, qkv_kernel: str = "plain"):
        super().__init__()
        self.attn_dropout = attn_dropout  # on the attention probabilities (nanoGPT's attn_dropout)
        self.backend = backend
        assert dim % heads == 0, f"dim {dim} not divisible by heads {heads}"
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.q_norm = nn.RMSNorm(dim // heads) if qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(dim // heads) if qk_norm else nn.Identity()
        entry = attention_registry.get(backend)
        spec = attention_registry.spec(backend)
        check = spec.check
        if check is not None:  # e.g. triton: GenlabError before training
            check(dim // heads)
        # an entry that is a module class owns parameters (differential's lambda): one instance per layer
        is_module = isinstance(entry, type) and issubclass(entry, nn.Module)
        self.attend = None if not kernel else entry(dim // heads, heads, layer) if is_module else entry
        self.split = qkv_kernel_registry.get(qkv_kernel)  # the projection's output -> q, k, v (model.qkv_kernel)
        # the entry's packed path (q, k, v read from the projection's output): only where the plain split would run
        self.packed = spec.packed if kernel and not qk_norm and qkv_kernel == "plain" else None
        # forward_ad_attention / plain_softmax_attention swap attend for a fallback: then the fallback runs, unpacked
        self.entry = self.attend if self.packed is not None else None  # (a module entry would register twice)

    def heads_qkv(self, x, rope=None):
        """x [B, N, D] -> q, k, v [B, H, N, D/H] (normalised and rotated)."""
        return self.split(self.qkv(x), self.heads, self.q_norm, self.k_norm, rope)

    def kernel(self, q, k, v, causal: bool = False, mask=None):
        extra = {"dropout_p": self.attn_dropout} if self.attn_dropout > 0 and self.training else {}
        return self.attend(q, k, v, causal=causal, mask=mask, **extra)

    def out(self, o):
        """Attention output [B, H, N, D/H] -> the output projection [B, N, D]."""
        B, H, N, hd = o.shape
        return self.proj(o.transpose(1, 2).reshape(B, N, H * hd))

    def attend_tokens(self, x, causal: bool = False, rope=None, mask=None):
        """x [B, N, D] -> the attention output [B, H, N, D/H]: the entry's packed path (AttentionSpec.packed) where
        this call allows it (no RoPE, mask or attention dropout), else heads_qkv then kernel."""
        dropout = self.attn_dropout > 0 and self.training
        if self.packed is not None and self.attend is self.entry and rope is None and mask is None and not dropout:
            return self.packed(self.qkv(x), self.heads, causal)
        return self.kernel(*self.heads_qkv(x, rope), causal=causal, mask=mask)

    def forward(self, x, causal: bool = False, rope=None, mask=None):
        return self.out(self.attend_tokens(x, causal=causal, rope=rope, mask=mask))


def softmax_flops(n: int, m: int, head_dim: int) -> int:
    """q k^T and (weights) v of one head: 2 n m d each (what the counter sees in math/plain attention)."""
    return 2 * 2 * n * m * head_dim


def attention_flops(name: str, n: int, m: int, heads: int, head_dim: int, causal: bool = False) -> int:
    """Forward matmul FLOPs of one sample's attention kernel, n queries over m keys. Causal softmax counts the
    full score matrix, as torch.utils.flop_counter and nanoGPT's MFU do; an entry whose causal form runs
    different matmuls declares `causal_flops`."""
    spec = attention_registry.spec(name)
    fn = spec.causal_flops if causal else None
    return heads * (fn or spec.flops or softmax_flops)(n, m, head_dim)


def _layers(model: nn.Module):
    """(layer, its entry's spec) of every attention layer of `model` that runs a kernel."""
    return [(m, attention_registry.spec(m.backend)) for m in model.modules() if isinstance(m, Attention) and m.attend is not None]


@contextlib.contextmanager
def _swapped(model: nn.Module, fallback_of):
    """Inside, each attention layer runs fallback_of(its spec) where that is not None; yields how many do."""
    swapped = [(m, m.attend, fallback_of(spec)) for m, spec in _layers(model) if fallback_of(spec) is not None]
    for m, _, fallback in swapped:
        m.attend = fallback
    try:
        yield len(swapped)
    finally:
        for m, attend, _ in swapped:
            m.attend = attend


@contextlib.contextmanager
def forward_ad_attention(model: nn.Module):
    """Inside, every attention layer of `model` computes the same function in ops that have forward-mode AD (a JVP:
    MeanFlow's target): an entry without it runs its spec's `jvp_fallback` instead, and SDPA is held to its math
    kernel. Yields the sorted names of the entries that fell back (empty: all ran as they are)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    fell_back = sorted({m.backend for m, spec in _layers(model) if not spec.forward_ad})
    with _swapped(model, lambda spec: None if spec.forward_ad else spec.jvp_fallback), sdpa_kernel(SDPBackend.MATH):
        yield fell_back


def plain_softmax_attention(model: nn.Module):
    """Inside, every attention layer of `model` whose entry declares a `vmap_fallback` runs it (softmax entries:
    `math_attention`, float32 softmax under autocast), e.g. for torch.vmap of a bf16 model on CUDA; yields how many."""
    return _swapped(model, lambda spec: spec.vmap_fallback)


def attention_choices(device: torch.device) -> list:
    """(name, model -> context) for the attention kernels a batched-seeds step (training/seeds.py) may use, in order
    of preference; why no SDPA kernel may run under vmap: docs/performance.md ("Batched seeds")."""
    default = [("default", lambda model: contextlib.nullcontext())]
    if device.type != "cuda":
        return default
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return default + [("flash", lambda model: sdpa_kernel([SDPBackend.FLASH_ATTENTION])),
            ("math", lambda model: sdpa_kernel([SDPBackend.MATH])),
            ("plain-ops", plain_softmax_attention)]
