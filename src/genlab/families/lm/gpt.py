"""GPT: a decoder-style transformer over token ids (nanoGPT; docs/lm.md). The first spare id `mask_id == vocab_size` is
masked diffusion's [MASK]; with targets the model returns the loss, so compile fuses head and cross-entropy.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.families.models import ModelExample, model_registry, model_size
from genlab.nn.attention import Attention, attention_flops
from genlab.nn.fused_ce import ce_kernel_registry
from genlab.nn.mlp import mlp_registry
from genlab.nn.norm import norm_registry
from genlab.nn.positions import apply_rope, build_position, fitting_positions

# name -> (dim, depth, heads). small = nanoGPT's shakespeare-char model; gpt2* = the GPT-2 family.
GPT_SIZES = {
    "tiny": (128, 4, 4),
    "small": (384, 6, 6),
    "gpt2": (768, 12, 12),
    "gpt2-medium": (1024, 24, 16),
    "gpt2-large": (1280, 36, 20),
    "gpt2-xl": (1600, 48, 25),
}


def padded_vocab(vocab_size: int, multiple: int = 64) -> int:
    """Rows of the embedding: vocab + one spare id ([MASK]), rounded up to `multiple`."""
    return -(-(vocab_size + 1) // multiple) * multiple


@dataclass
class GPTSpec:
    vocab_size: int               # real tokens of the data
    seq_len: int                  # maximum sequence length (positions)
    dim: int
    depth: int
    heads: int
    mlp_ratio: float = 4.0
    pos_emb: str = "learned"      # registry `position` (1-D entries): learned | rope
    norm: str = "layernorm"       # registry `norm`
    mlp: str = "gelu"             # registry `mlp`
    tie_weights: bool = True
    causal: bool = True
    bias: bool = False
    dropout: float = 0.0
    attention: str = "sdpa"
    ce_chunk: int = 0             # > 0: fused linear + cross-entropy over chunks of this many tokens
    ce_kernel: str = "plain"      # registry `ce_kernel`: head + loss kernel (nn/fused_ce.py)
    qkv_kernel: str = "plain"     # registry `qkv_kernel`: the QKV split into heads (+ RoPE; nn/fused_qkv.py)

    @property
    def n_vocab(self) -> int:
        return padded_vocab(self.vocab_size)


class Block(nn.Module):
    def __init__(self, s: GPTSpec, layer: int = 0):
        super().__init__()
        self.causal = s.causal
        self.norm1 = norm_registry.get(s.norm)(s.dim, bias=s.bias)
        self.attn = Attention(s.dim, s.heads, backend=s.attention, bias=s.bias, attn_dropout=s.dropout,
                              layer=layer, qkv_kernel=s.qkv_kernel)
        self.norm2 = norm_registry.get(s.norm)(s.dim, bias=s.bias)
        self.mlp = mlp_registry.get(s.mlp)(s.dim, int(s.dim * s.mlp_ratio), bias=s.bias)
        self.drop = nn.Dropout(s.dropout) if s.dropout > 0 else nn.Identity()

    def forward(self, x, rope=None):
        x = x + self.drop(self.attn(self.norm1(x), causal=self.causal, rope=rope))
        return x + self.drop(self.mlp(self.norm2(x)))


class GPT(nn.Module):
    def __init__(self, spec: GPTSpec):
        super().__init__()
        s = self.spec = spec
        self.causal = s.causal
        self.vocab_size, self.n_vocab, self.mask_id = s.vocab_size, s.n_vocab, s.vocab_size
        self.tok_emb = nn.Embedding(s.n_vocab, s.dim)
        self.pos_emb = build_position(s.pos_emb, s.dim, s.heads, (s.seq_len,), "gpt")
        self.drop = nn.Dropout(s.dropout) if s.dropout > 0 else nn.Identity()
        self.blocks = nn.ModuleList(Block(s, layer=i) for i in range(s.depth))
        self.norm = norm_registry.get(s.norm)(s.dim, bias=s.bias)
        self.head = nn.Linear(s.dim, s.n_vocab, bias=False)
        self._init_weights()
        if s.tie_weights:
            self.head.weight = self.tok_emb.weight

    def _init_weights(self):
        # GPT-2: N(0, 0.02), residual output projections scaled by 1/sqrt(2 * depth)
        for name, p in self.named_parameters():
            if p.dim() < 2:
                nn.init.zeros_(p) if name.endswith("bias") else None
                continue
            std = 0.02 / (2 * self.spec.depth) ** 0.5 if name.endswith(("attn.proj.weight", "mlp.fc2.weight")) else 0.02
            nn.init.normal_(p, std=std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, weights: torch.Tensor | None = None,
                vocab: int | None = None) -> torch.Tensor:
        """idx: long [B, T] -> logits [B, T, n_vocab]; with targets [B, T]: the float32 sum(weights * CE) over the
        first `vocab` logits (default all; weights default 1 / (B * T), the mean)."""
        T = idx.shape[1]
        if T > self.spec.seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than the model's {self.spec.seq_len} positions")
        h = self.drop(self.pos_emb(self.tok_emb(idx)))
        rope = self.pos_emb.rope()
        for block in self.blocks:
            h = block(h, rope=rope)
        h = self.norm(h)
        if targets is None:
            return self.head(h)
        vocab, y = vocab or self.n_vocab, targets.reshape(-1)
        if self.spec.ce_chunk > 0 and torch.is_grad_enabled():
            w = torch.full(y.shape, 1 / y.numel(), device=y.device) if weights is None else weights.reshape(-1).float()
            return LinearCrossEntropy.apply(h.flatten(0, 1), self.head.weight, y, w, vocab, self.spec.ce_chunk)
        return ce_kernel_registry.get(self.spec.ce_kernel)(self.head, h.flatten(0, 1), y, weights, vocab)

    @torch.no_grad()
    def decode(self, idx: torch.Tensor, cache: list) -> torch.Tensor:
        """Causal forward with a key/value cache (a list, one (k, v) per block, extended in place): idx [B, t] (a
        prompt when the cache is empty, else t == 1) -> the last position's logits [B, n_vocab]."""
        if not self.causal:
            raise GenlabError("a key/value cache needs a causal model")
        B, t = idx.shape
        pos = cache[0][0].shape[2] if cache else 0
        if (pos and t != 1) or pos + t > self.spec.seq_len:
            raise ValueError(f"decode: {t} new tokens after {pos} cached ones (one at a time; <= {self.spec.seq_len} in all)")
        h = self.pos_emb(self.tok_emb(idx), offset=pos)
        rope = self.pos_emb.rope(offset=pos)
        for i, block in enumerate(self.blocks):
            a = block.attn
            q, k, v = a.qkv(block.norm1(h)).view(B, t, 3, a.heads, -1).permute(2, 0, 3, 1, 4)
            q, k = a.q_norm(q), a.k_norm(k)
            if rope is not None:
                q, k = apply_rope(q, rope), apply_rope(k, rope)
            if i < len(cache):
                k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
                cache[i] = (k, v)
            else:
                cache.append((k, v))
            out = F.scaled_dot_product_attention(q, k, v, is_causal=pos == 0)  # one new query sees every key
            h = h + a.proj(out.transpose(1, 2).reshape(B, t, -1))
            h = h + block.mlp(block.norm2(h))
        return self.head(self.norm(h[:, -1]))

    def flops_per_sample(self, seq_len: int | None = None) -> int:
        """Forward matmul FLOPs of one sequence, attention over the full T x T scores (as nanoGPT's MFU counts)."""
        s, T, D = self.spec, seq_len or self.spec.seq_len, self.spec.dim
        H = mlp_registry.spec(s.mlp).hidden_of(int(D * s.mlp_ratio))
        mlp = 2 * T * D * H * mlp_registry.spec(s.mlp).matrices
        attn = attention_flops(s.attention, T, T, s.heads, D // s.heads, causal=s.causal)
        per_block = 2 * T * D * 3 * D + 2 * T * D * D + attn + mlp
        return s.depth * per_block + 2 * T * D * s.n_vocab


class LinearCrossEntropy(torch.autograd.Function):
    """sum_i w_i * CE(h_i @ W[:vocab]^T, y_i) in chunks of `chunk` rows, d/dh and d/dW formed in the forward: no
    logits outlive a chunk (Liger's fused linear cross-entropy in plain torch; autocast matmuls, float32 softmax)."""

    @staticmethod
    def forward(ctx, h, W, y, w, vocab: int, chunk: int):
        dev = h.device.type
        dt = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else h.dtype
        with torch.autocast(dev, enabled=False):
            hc, Wc = h.to(dt), W[:vocab].to(dt)
            loss = torch.zeros((), device=h.device, dtype=torch.float32)
            gh = torch.empty_like(hc)
            gW = torch.zeros(Wc.shape, device=W.device, dtype=torch.float32)
            for a in range(0, hc.shape[0], chunk):
                b = min(a + chunk, hc.shape[0])
                logits = (hc[a:b] @ Wc.T).float()
                lse = torch.logsumexp(logits, -1)
                loss = loss + (w[a:b] * (lse - logits.gather(1, y[a:b, None])[:, 0])).sum()
                g = (logits - lse[:, None]).exp()                        # softmax
                g = g.scatter_add(1, y[a:b, None], -torch.ones_like(lse)[:, None])  # - one-hot(target)
                g = (g * w[a:b, None]).to(dt)
                gh[a:b] = g @ Wc
                gW += (g.T @ hc[a:b]).float()
        ctx.save_for_backward(gh, gW)
        ctx.shapes = (h.dtype, W.shape, W.dtype)
        return loss

    @staticmethod
    def backward(ctx, grad):
        gh, gW = ctx.saved_tensors
        h_dtype, W_shape, W_dtype = ctx.shapes
        gW_full = torch.zeros(W_shape, device=gW.device, dtype=W_dtype)
        gW_full[:gW.shape[0]] = gW * grad
        return (gh * grad).to(h_dtype), gW_full, None, None, None, None


class GptKeys(cf.Keys, section="model"):
    dropout: float = cf.F(0.0, "gpt: dropout after attention, MLP and embedding", ge=0, lt=1)
    vocab_size: int = cf.F(0, "gpt: embedding rows (0 = from the dataset)", ge=0)
    tie_weights: bool = cf.F(True, "gpt: share the embedding with the output head")
    causal: bool = cf.F(True, "gpt: causal attention (autoregressive: true; mdlm: false)")
    bias: bool = cf.F(False, "gpt: biases in linears and norms")
    ce_chunk: int = cf.F(0, "gpt: > 0 = fused linear + cross-entropy over chunks of this many tokens (no logits kept)", ge=0)
    ce_kernel: str = cf.F("plain", "gpt: head + cross-entropy kernel of the training loss (cce/liger: CUDA libraries that "
                                   "never materialise the logits; auto: the fastest installed, plain on CPU)", registry="ce_kernel")


GPT_EXAMPLE = ModelExample(
    spec={"kind": "tokens", "vocab_size": 11, "seq_len": 12},
    inputs=lambda spec, B, g: (torch.randint(0, spec["vocab_size"], (B, spec["seq_len"]), generator=g),),
    output_shape=lambda spec, B: (B, spec["seq_len"], padded_vocab(spec["vocab_size"])))


def check_gpt_loss(cfg_model):
    keys = GptKeys.of(cfg_model)
    if keys.ce_chunk and keys.ce_kernel not in ("plain", "auto"):
        raise GenlabError(f"model.ce_chunk={keys.ce_chunk} is the plain-torch fused loss; model.ce_kernel="
                          f"{keys.ce_kernel} is another: set one of them (ce_chunk=0 or ce_kernel=plain)")


@model_registry.register("gpt", "GPT (nanoGPT-style): learned/RoPE positions, LayerNorm/RMSNorm, GELU/SwiGLU, tied head; "
                                "sizes tiny/small/gpt2/gpt2-medium/gpt2-large/gpt2-xl",
                         family="gpt", keys=GptKeys, reads=("model.pos_emb", "model.norm", "model.mlp", "model.qkv_kernel"), sizes=GPT_SIZES,
                         grid_rank=1, layer_keys=("attention", "mlp", "norm", "pos_emb"), default_position="learned",
                         example=GPT_EXAMPLE, check=lambda cfg, dim, heads, depth: check_gpt_loss(cfg.model))
def build_gpt(cfg_model, data_spec) -> GPT:
    keys = GptKeys.of(cfg_model)
    if data_spec.get("kind") != "tokens":
        raise GenlabError(f"model gpt needs token data (a text/tokens dataset), got data of kind {data_spec.get('kind')!r}")
    dim, depth, heads = model_size(cfg_model, GPT_SIZES, "GPT")
    pos = "learned" if cfg_model.pos_emb == "auto" else cfg_model.pos_emb
    if dim % heads or (pos == "rope" and (dim // heads) % 2):
        raise GenlabError(f"model.dim {dim} must split into {heads} heads (of even width for RoPE)")
    if mlp_registry.spec(cfg_model.mlp).needs_grid:
        raise GenlabError(f"model.mlp={cfg_model.mlp} convolves over a patch grid; model gpt has none: choose gelu or swiglu")
    if pos not in fitting_positions(1):
        raise GenlabError(f"model.pos_emb={pos} does not fit model gpt; valid choices: auto, {', '.join(fitting_positions(1))}")
    check_gpt_loss(cfg_model)
    vocab = keys.vocab_size or data_spec["vocab_size"]
    if vocab < data_spec["vocab_size"]:
        raise GenlabError(f"model.vocab_size {vocab} is smaller than the data's vocabulary {data_spec['vocab_size']}")
    return GPT(GPTSpec(vocab_size=vocab, seq_len=data_spec["seq_len"], dim=dim, depth=depth, heads=heads,
                       mlp_ratio=cfg_model.mlp_ratio, pos_emb=pos, norm=cfg_model.norm, mlp=cfg_model.mlp,
                       tie_weights=keys.tie_weights, causal=keys.causal, bias=keys.bias,
                       dropout=keys.dropout, attention=cfg_model.attention, ce_chunk=keys.ce_chunk,
                       ce_kernel=keys.ce_kernel, qkv_kernel=cfg_model.qkv_kernel))
