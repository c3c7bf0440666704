"""Autoregressive language modelling: next-token cross-entropy on a causal GPT (nanoGPT's objective; docs/lm.md); the
loss runs inside the model call (fused under compile), evaluation normalises over the real vocabulary only.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from genlab.config import fields as cf
from genlab.core import progress
from genlab.core.errors import GenlabError
from genlab.families.base import method_registry
from genlab.families.lm import common as lm


@torch.no_grad()
def generate(model, idx: torch.Tensor, new_tokens: int, vocab_size: int, seq_len: int, temperature: float = 1.0,
             top_k: int = 0, generator=None, kv_cache: bool = True) -> torch.Tensor:
    """Append `new_tokens` sampled tokens to idx [B, t0]. A full key/value cache restarts from the last seq_len // 2
    tokens; without one every step re-runs the last seq_len tokens (nanoGPT)."""
    base = lm.unwrap(model)
    cache = [] if kv_cache and hasattr(base, "decode") else None
    for _ in progress.track(range(new_tokens), f"sampling {idx.shape[0]} x {new_tokens} tokens", unit="tok"):
        if cache is None:
            logits = model(idx[:, -seq_len:])[:, -1]
        elif cache and cache[0][0].shape[2] < seq_len:
            logits = base.decode(idx[:, -1:], cache)
        else:  # start (the prompt), or the cache is full: refill it from the recent context
            keep = max(1, seq_len // 2) if cache else seq_len
            cache.clear()
            logits = base.decode(idx[:, -keep:], cache)
        idx = torch.cat([idx, next_token(logits[:, :vocab_size].float(), temperature, top_k, generator)], dim=1)
    return idx


def next_token(logits: torch.Tensor, temperature: float, top_k: int = 0, generator=None) -> torch.Tensor:
    """Ids [B, 1] from float logits [B, V]: the argmax at temperature 0, else a draw from softmax(logits / temperature)
    over the top_k most likely (0 = all)."""
    if temperature <= 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)


@torch.no_grad()
def score_nats(model, ids: torch.Tensor, vocab_size: int, batch: int = 64) -> torch.Tensor:
    """Per-sequence mean NLL (nats/token) of ids[:, 1:] given the preceding tokens, over the real vocabulary."""
    out = []
    for i in progress.track(range(0, len(ids), batch), f"scoring {len(ids)} sequences", unit="batch"):
        x = ids[i:i + batch]
        logits = model(x[:, :-1])[..., :vocab_size].float()
        nll = F.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
        out.append(nll.mean(1))
    return torch.cat(out)


class Autoregressive(lm.TokenMethod):
    sample_options = ("prompt", "temperature", "length", "top_k")
    sample_header = "autoregressive samples: {length} tokens, temperature {temperature}, top_k {top_k}, prompt {prompt!r}"
    batch_keys = ("x", "y")
    model_families, causal = ("gpt", "sparse_transformer"), True
    sampling_keys = ("method.temperature", "method.top_k", "method.sample_len", "method.prompt")
    best_metric = "val_loss"  # log.keep_best keeps the checkpoint with the lowest value
    name = "autoregressive"

    def loss(self, model, batch, ctx):
        if not self._checked:
            self.backbone(model)
            self._checked = True
        # the model computes the loss itself: under torch.compile the head and the cross-entropy fuse
        return model(batch["x"], targets=batch["y"]), {}

    @torch.no_grad()
    def evaluate(self, model, data, ctx) -> dict:
        ecfg, device = ctx["eval"], ctx["device"]
        if ecfg.num_samples <= 0:
            return {}
        base = self.backbone(model)
        wins = lm.val_windows(data, self.T, ecfg.num_samples)
        bs = lm.eval_batch_size(ecfg, self.T, base.n_vocab)
        nats = score_nats(model, wins.to(device), self.V, batch=bs).mean().item()
        out = lm.per_token_metrics("val", nats, self.spec)
        out["val_tokens_scored"] = int(wins.shape[0] * self.T)
        return out

    def draw(self, model, n, *, steps=None, generator=None, device=None, prompt="", temperature=None, length=None,
             top_k=None, stats=None):
        """Token ids [n, L]: `length` (or `steps`) new tokens; `stats` (a dict) gets the settings for sample_header."""
        keys = ArKeys.of(self.mcfg)
        base = self.backbone(model)
        length = length or steps or self.mcfg.sample_len or self.T
        temperature = self.mcfg.temperature if temperature is None else temperature
        top_k = keys.top_k if top_k is None else top_k
        if lm.INFILL.search(prompt or ""):
            raise GenlabError("[[N]] infilling needs a bidirectional model (method mdlm); autoregressive takes a prefix prompt")
        if stats is not None:
            stats.update(length=length, temperature=temperature, top_k=top_k, prompt=prompt)
        start = lm.encode_prompt(self.spec, prompt) if prompt else [self._start_token()]
        idx = torch.tensor([start] * n, dtype=torch.long, device=device)
        out = generate(model, idx, length, self.V, base.spec.seq_len, temperature, top_k, generator)
        return out if prompt else out[:, 1:]

    def _start_token(self) -> int:
        if self.spec.get("tokenizer") == "gpt2":
            return self.spec.get("eot", 50256)
        try:
            return lm.encode_prompt(self.spec, "\n")[0]
        except GenlabError:
            return 0


class ArKeys(cf.Keys, section="method"):
    top_k: int = cf.F(0, "autoregressive sampling: keep the k most likely tokens (0 = all)", ge=0)


method_registry.register("autoregressive", "next-token cross-entropy on a causal GPT or Sparse Transformer; val loss/bpc/ppl; top-k sampling",
                         keys=(ArKeys, lm.TextSamplingKeys))(Autoregressive)
