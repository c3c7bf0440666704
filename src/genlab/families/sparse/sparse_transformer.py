"""Sparse Transformer (Child et al. 2019) over image bytes or text tokens; docs/sparse.md. Position t reads byte t-1
(START at t = 0) and predicts byte t; the section 6 initialisation makes a fresh model uniform (8 bits/dim).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from genlab.config import fields as cf
from genlab.config.check import _trains_on_cpu
from genlab.core.errors import GenlabError
from genlab.data.datasets import dataset_registry
from genlab.families.models import ModelExample, model_registry, model_size
from genlab.nn.sparse_attention import MaskCache, attend, layer_groups
from genlab.runtime.switches import ac_registry

START = 256           # id of the start token (after the 256 byte values)
RASTER_ORDERS = ("channel", "pixel")
# name -> (dim, depth, heads)
SPARSE_SIZES = {"tiny": (64, 2, 2), "small": (256, 8, 4), "base": (512, 16, 8), "cifar": (256, 128, 2)}


def raster_coords(H: int, W: int, C: int, order: str) -> torch.Tensor:
    """long [n, 3]: (row, column, channel) of every sequence position."""
    r, w, c = torch.meshgrid(torch.arange(H), torch.arange(W), torch.arange(C), indexing="ij")  # [H, W, C]
    grid = torch.stack([r, w, c], -1)
    if order == "pixel":
        return grid.reshape(-1, 3)
    if order == "channel":
        return grid.permute(2, 0, 1, 3).reshape(-1, 3)
    raise GenlabError(f"unknown raster order {order!r}; valid: {', '.join(RASTER_ORDERS)}")


def shift_in(seq: torch.Tensor) -> torch.Tensor:
    """Inputs of the targets `seq`: START, then seq without its last byte."""
    return torch.cat([torch.full_like(seq[:, :1], START), seq[:, :-1]], 1)


def image_to_seq(img: torch.Tensor, order: str) -> torch.Tensor:
    """uint8/long [B, H, W, C] -> [B, n] in raster order."""
    if order == "pixel":
        return img.reshape(img.shape[0], -1)
    return img.permute(0, 3, 1, 2).reshape(img.shape[0], -1)


def seq_to_image(seq: torch.Tensor, H: int, W: int, C: int, order: str) -> torch.Tensor:
    if order == "pixel":
        return seq.reshape(-1, H, W, C)
    return seq.reshape(-1, C, H, W).permute(0, 2, 3, 1)


@dataclass
class SparseSpec:
    image_size: int               # images; 0 for text
    channels: int
    dim: int
    depth: int
    heads: int
    vocab: int = 0                # > 0: a text model over this many token ids (seq_len given by `text_len`)
    text_len: int = 0
    embed: str = "auto"           # data (row/col/channel) | attention (row/col of the stride matrix); auto by data
    order: str = "channel"
    pattern: str = "strided"
    mode: str = "split"
    stride: int = 0               # l; 0 = the length of one image row in the raster order (~sqrt(n))
    summary: int = 0              # c of the fixed pattern; 0 = max(1, l // 8)
    summary_groups: int = 1       # fixed: the summary heads attend to this many distinct sub-blocks of c
    mlp_ratio: float = 4.0
    qk_ratio: float = 1.0
    dropout: float = 0.0
    backend: str = "auto"
    block: int = 128              # FlexAttention block size: the unit of skipped work

    @property
    def is_text(self) -> bool:
        return self.vocab > 0

    @property
    def seq_len(self) -> int:
        return self.text_len if self.is_text else self.image_size ** 2 * self.channels

    @property
    def l(self) -> int:
        if self.stride:
            return self.stride
        if self.is_text:
            return max(1, math.isqrt(self.text_len))
        return self.image_size if self.order == "channel" else self.image_size * self.channels

    @property
    def embedding(self) -> str:
        return ("attention" if self.is_text else "data") if self.embed == "auto" else self.embed

    @property
    def c(self) -> int:
        return self.summary or max(1, self.l // 8)


class SparseAttention(nn.Module):
    def __init__(self, s: SparseSpec, groups):
        super().__init__()
        self.heads, self.groups = s.heads, groups
        self.qk_dim = int(s.dim * s.qk_ratio)
        if self.qk_dim % s.heads or s.dim % s.heads:
            raise GenlabError(f"model.dim {s.dim} (queries/keys {self.qk_dim}) must split into {s.heads} heads")
        self.q = nn.Linear(s.dim, self.qk_dim)
        self.k = nn.Linear(s.dim, self.qk_dim)
        self.v = nn.Linear(s.dim, s.dim)
        self.proj = nn.Linear(s.dim, s.dim)
        self.scale = 1.0 / math.sqrt(self.qk_dim // s.heads)

    def qkv(self, x):
        B, T, _ = x.shape
        split = lambda t: t.view(B, T, self.heads, -1).transpose(1, 2)  # noqa: E731
        return split(self.q(x)), split(self.k(x)), split(self.v(x))

    def forward(self, x, cache: MaskCache, backend: str):
        q, k, v = self.qkv(x)
        outs, h0 = [], 0
        for nh, part in self.groups:
            sl = slice(h0, h0 + nh)
            outs.append(attend(q[:, sl], k[:, sl], v[:, sl], part, cache, backend, self.scale))
            h0 += nh
        out = torch.cat(outs, 1) if len(outs) > 1 else outs[0]
        return self.proj(out.transpose(1, 2).reshape(x.shape))

    def probs_row(self, x, pos: int):
        """Attention probabilities of query `pos` over keys [0..pos], per head: [B, heads, pos + 1]."""
        q, k, _ = self.qkv(x[:, :pos + 1])
        scores = (q[:, :, -1:] @ k.transpose(-1, -2))[:, :, 0] * self.scale
        masks = [p.allowed(torch.tensor(pos), torch.arange(pos + 1)).to(x.device) for nh, p in self.groups for _ in range(nh)]
        return scores.masked_fill(~torch.stack(masks)[None], float("-inf")).softmax(-1)


class SparseBlock(nn.Module):
    def __init__(self, s: SparseSpec, groups):
        super().__init__()
        self.norm1 = nn.LayerNorm(s.dim)
        self.attn = SparseAttention(s, groups)
        self.norm2 = nn.LayerNorm(s.dim)
        hidden = int(s.dim * s.mlp_ratio)
        self.fc1, self.fc2 = nn.Linear(s.dim, hidden), nn.Linear(hidden, s.dim)
        self.drop = nn.Dropout(s.dropout) if s.dropout > 0 else nn.Identity()

    def forward(self, x, cache: MaskCache, backend: str):
        x = x + self.drop(self.attn(self.norm1(x), cache, backend))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.norm2(x)))))


def attention_coords(n: int, l: int) -> torch.Tensor:
    """long [n, 2]: (row, column) of every position in a matrix of width l (the paper's attention embedding)."""
    t = torch.arange(n)
    return torch.stack([t // l, t % l], -1)


class SparseTransformer(nn.Module):
    causal = True

    def __init__(self, spec: SparseSpec):
        super().__init__()
        s = self.spec = spec
        # raster, sparse_backend, sparse_embed and sparse_block are checked by their fields' choices
        if s.is_text and s.embedding == "data":
            raise GenlabError("model.sparse_embed=data needs image data (rows, columns, channels); text: attention or auto")
        self.groups = layer_groups(s.pattern, s.mode, s.l, s.c, s.depth, s.heads, s.summary_groups)
        self.parts = list({p.name: p for g in self.groups for _, p in g}.values())
        self.masks = MaskCache(block=s.block)
        self.vocab_size = s.vocab or 256         # real output classes (bytes, or the text vocabulary)
        self.n_vocab = s.vocab or 257            # input ids: images add the start token
        self.tok_emb = nn.Embedding(self.n_vocab, s.dim)
        if s.embedding == "data":
            coords = raster_coords(s.image_size, s.image_size, s.channels, s.order)
            tables = {"row_emb": s.image_size, "col_emb": s.image_size, "chan_emb": s.channels}
        else:
            coords = attention_coords(s.seq_len, s.l)
            tables = {"attn_row_emb": -(-s.seq_len // s.l), "attn_col_emb": s.l}
        self.pos_tables = tuple(tables)
        for name, rows in tables.items():
            setattr(self, name, nn.Embedding(rows, s.dim))
        self.register_buffer("coords", coords, persistent=False)
        self.blocks = nn.ModuleList(SparseBlock(s, g) for g in self.groups)
        self.norm = nn.LayerNorm(s.dim)
        self.head = nn.Linear(s.dim, self.vocab_size)
        self.ac_segments = 0  # > 0: recompute the blocks in this many segments (activation checkpointing "segments")
        self._init_weights()

    def _init_weights(self):
        s, n_emb = self.spec, len(self.pos_tables)
        for name, p in self.named_parameters():
            if name.startswith("tok_emb"):
                nn.init.normal_(p, std=0.125 / math.sqrt(s.dim))
            elif name.startswith(self.pos_tables):
                nn.init.normal_(p, std=0.125 / math.sqrt(s.dim * n_emb))
            elif name.startswith("head"):
                nn.init.zeros_(p)  # output logits start at zero: the uniform distribution
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            elif "norm" in name:
                continue  # LayerNorm gains stay 1
            else:
                std = 0.125 / math.sqrt(p.shape[1])
                if name.endswith(("attn.proj.weight", "fc2.weight")):
                    std /= math.sqrt(2 * s.depth)
                nn.init.normal_(p, std=std)

    def resolve_backend(self, device, backend=None) -> str:
        b = backend or self.spec.backend
        if b == "auto":  # FlexAttention has no CPU backward: the segment forms there (masked SDPA for the rest)
            return "flex" if device.type == "cuda" else "blocked"
        return b

    def embed(self, idx, start: int = 0):
        T = idx.shape[1]
        rc = self.coords[start:start + T]
        h = self.tok_emb(idx)
        for k, name in enumerate(self.pos_tables):
            h = h + getattr(self, name)(rc[:, k])
        return h

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, backend: str | None = None):
        """idx long [B, T] (images: ids 0..256, START first; text: token ids) -> logits [B, T, vocab_size];
        with targets [B, T] the mean cross-entropy in nats instead."""
        T = idx.shape[1]
        if T > self.spec.seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than the model's {self.spec.seq_len}")
        backend = self.resolve_backend(idx.device, backend)
        self.masks.build(self.parts, T, idx.device, backend)
        h = self.embed(idx)
        if self.ac_segments > 0 and torch.is_grad_enabled():
            k = len(self.blocks)
            bounds = [round(i * k / self.ac_segments) for i in range(self.ac_segments + 1)]
            for a, z in zip(bounds[:-1], bounds[1:]):
                if z > a:
                    h = checkpoint(self._run, h, a, z, backend, use_reentrant=False)
        else:
            h = self._run(h, 0, len(self.blocks), backend)
        logits = self.head(self.norm(h))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.reshape(-1))

    def _run(self, h, a, z, backend):
        for b in self.blocks[a:z]:
            h = b(h, self.masks, backend)
        return h

    @torch.no_grad()
    def decode(self, idx: torch.Tensor, cache: list) -> torch.Tensor:
        """Logits [B, vocab_size] of the last of new tokens idx [B, t], with a key/value cache (one (k, v) per block,
        extended in place)."""
        pos = cache[0][0].shape[2] if cache else 0
        t = idx.shape[1]
        h = self.embed(idx, start=pos)
        queries = torch.arange(pos, pos + t, device=idx.device)[:, None]
        keys = torch.arange(pos + t, device=idx.device)[None, :]
        for i, blk in enumerate(self.blocks):
            a = blk.attn
            q, k, v = a.qkv(blk.norm1(h))
            if i < len(cache):
                k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
                cache[i] = (k, v)
            else:
                cache.append((k, v))
            outs, h0 = [], 0
            for nh, part in a.groups:
                m = part.allowed(queries, keys)[None]
                outs.append(F.scaled_dot_product_attention(q[:, h0:h0 + nh], k[:, h0:h0 + nh], v[:, h0:h0 + nh],
                                                           attn_mask=m, scale=a.scale))
                h0 += nh
            h = h + a.proj(torch.cat(outs, 1).transpose(1, 2).reshape(h.shape))
            h = h + blk.fc2(F.gelu(blk.fc1(blk.norm2(h))))
        return self.head(self.norm(h))[:, -1]

    @torch.no_grad()
    def attention_rows(self, idx: torch.Tensor, pos: int) -> torch.Tensor:
        """Attention probabilities of query `pos` in every layer and head: [depth, B, heads, pos + 1]."""
        h = self.embed(idx[:, :pos + 1])
        backend = "dense"
        self.masks.build(self.parts, pos + 1, idx.device, backend)
        rows = []
        for b in self.blocks:
            rows.append(b.attn.probs_row(b.norm1(h), pos))
            h = b(h, self.masks, backend)
        return torch.stack(rows)

    def flops_per_sample(self, seq_len: int | None = None) -> int:
        """Forward matmul FLOPs of one sequence, attention over the full T x T scores (gpt.py's, for comparable MFU)."""
        s, T, D = self.spec, seq_len or self.spec.seq_len, self.spec.dim
        qk, H = int(D * s.qk_ratio), int(D * s.mlp_ratio)
        per_block = 2 * T * D * (2 * qk + 2 * D) + 2 * T * T * (qk + D) + 2 * 2 * T * D * H
        return s.depth * per_block + 2 * T * D * self.vocab_size


class SparseKeys(cf.Keys, section="model"):
    raster: str = cf.F("channel", "sparse_transformer: byte order, channel-major or pixel-major", choices=("channel", "pixel"))
    sparse_pattern: str = cf.F("strided", "sparse_transformer: attention pattern", registry="sparse_pattern")
    sparse_mode: str = cf.F("split", "sparse_transformer: factorization (parts across layers | union in one head | across heads)", registry="sparse_mode")
    sparse_stride: int = cf.F(0, "sparse_transformer: stride / block length l (0 = one image row in the raster order)", ge=0)
    sparse_summary: int = cf.F(0, "sparse_transformer: fixed pattern's summary cells c per block (0 = max(1, l // 8))", ge=0)
    sparse_summary_groups: int = cf.F(1, "sparse_transformer: fixed pattern: the summary heads attend to this many distinct "
                                             "sub-blocks of c cells (the paper's section 4.2; groups * c <= l)", ge=1)
    sparse_backend: str = cf.F("auto", "sparse_transformer: auto = flex on CUDA, blocked on CPU; flex = FlexAttention block "
                                   "masks; blocked = unmasked SDPA on segments (runs, columns) where a part has them; dense = "
                                   "masked SDPA (the reference)", choices=("auto", "blocked", "flex", "dense"))
    sparse_block: int = cf.F(128, "sparse_transformer: FlexAttention block size, the unit of skipped work (32 | 64 | 128; "
                                      "smaller blocks skip more of a thin pattern with smaller tiles and compile with max-autotune)", choices=(32, 64, 128))
    sparse_embed: str = cf.F("auto", "sparse_transformer: position embedding: data (row+column+channel, images) | attention "
                                 "(row+column of the stride-wide matrix, the paper's text embedding) | auto (by data)", choices=("auto", "data", "attention"))
    qk_ratio: float = cf.F(1.0, "sparse_transformer: query/key width relative to model.dim (0.5 = the paper's halved q/k)", gt=0, le=1)


SPARSE_EXAMPLE = ModelExample(  # tiny image bytes; its attention comes from model.sparse_*, not the layer registries
    spec={"kind": "image", "image_size": 4, "channels": 1, "num_classes": 1},
    inputs=lambda spec, B, g: (torch.randint(0, 257, (B, spec["image_size"] ** 2 * spec["channels"]), generator=g),),
    output_shape=lambda spec, B: (B, spec["image_size"] ** 2 * spec["channels"], 256))


def _check_sparse(cfg, dim: int, heads: int, depth: int):
    keys = SparseKeys.of(cfg.model)
    if keys.sparse_embed == "data" and dataset_registry.spec(cfg.data.name).kind == "token":
        raise GenlabError("model.sparse_embed=data needs image data (row, column, channel); on text use attention or auto")
    length = _sequence_length(cfg)
    if keys.sparse_stride and length is not None and keys.sparse_stride >= length:
        raise GenlabError(f"model.sparse_stride ({keys.sparse_stride}) must be shorter than the sequence ({length} "
                          f"tokens): one stride would cover it all and the pattern would be dense")
    if keys.sparse_backend == "flex" and _trains_on_cpu(cfg.train.device):
        raise GenlabError("model.sparse_backend=flex has no backward pass on the CPU (torch's FlexAttention backward "
                          "is CUDA-only); train with auto or blocked there (sampling runs the forward anywhere)")


def _sequence_length(cfg) -> int | None:
    """Tokens per sequence when known without loading the data: image bytes H*W*C, else data.seq_len of token data."""
    spec = dataset_registry.spec(cfg.data.name)
    if spec.kind == "token":
        return cfg.data.seq_len
    shape = spec.shape(cfg.data) if spec.shape is not None else None
    return shape["image_size"] ** 2 * shape["channels"] if shape else None


@model_registry.register("sparse_transformer", "Sparse Transformer (Child et al. 2019) over image bytes or text: "
                                               "strided/fixed factorized attention (FlexAttention), data or attention embeddings",
                         family="sparse_transformer", keys=SparseKeys, reads=("model.dropout", "model.vocab_size"),
                         sizes=SPARSE_SIZES, check=_check_sparse, example=SPARSE_EXAMPLE)
def build_sparse_transformer(cfg_model, data_spec) -> SparseTransformer:
    keys = SparseKeys.of(cfg_model)
    kind = data_spec.get("kind")
    if kind not in ("image", "tokens"):
        raise GenlabError(f"model sparse_transformer needs image or token data, got data of kind {kind!r}")
    dim, depth, heads = model_size(cfg_model, SPARSE_SIZES, "sparse_transformer")
    text = kind == "tokens"
    spec = SparseSpec(image_size=0 if text else data_spec["image_size"], channels=0 if text else data_spec["channels"],
                      vocab=(cfg_model.vocab_size or data_spec["vocab_size"]) if text else 0,
                      text_len=data_spec["seq_len"] if text else 0, embed=keys.sparse_embed, dim=dim, depth=depth,
                      heads=heads, order=keys.raster, pattern=keys.sparse_pattern, mode=keys.sparse_mode,
                      stride=keys.sparse_stride, summary=keys.sparse_summary, summary_groups=keys.sparse_summary_groups,
                      mlp_ratio=cfg_model.mlp_ratio, qk_ratio=keys.qk_ratio, dropout=cfg_model.dropout,
                      backend=keys.sparse_backend, block=keys.sparse_block)
    return SparseTransformer(spec)


@ac_registry.register("segments", "recompute the blocks in train.ac_every segments (sparse_transformer: only the "
                                  "segment boundaries are stored)",
                 reads=("train.ac_every",))
def ac_segments(model, tcfg):
    if not hasattr(model, "ac_segments"):
        raise GenlabError("train.activation_checkpointing=segments needs model.name=sparse_transformer; "
                          "other models: full | every_k | selective")
    model.ac_segments = max(1, tcfg.ac_every)
    return model
