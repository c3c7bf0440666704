"""Helpers both language-model methods share: validation windows, prompts, decoding, reading the samples file."""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import torch

from genlab.config import fields as cf
from genlab.core.errors import GenlabError
from genlab.data.tokenizers import from_meta
from genlab.families import baselines
from genlab.families.base import Method
from genlab.families.lm import render
from genlab.runtime.parallel import unwrap

LN2 = math.log(2.0)
INFILL = re.compile(r"\[\[(\d+)\]\]")  # "[[N]]" in a prompt: N tokens for masked diffusion to fill in


class TextSamplingKeys(cf.Keys, section="method"):
    temperature: float = cf.F(1.0, "language models: sampling temperature (0 = greedy)", ge=0)
    sample_len: int = cf.F(0, "tokens per text sample (0 = data.seq_len)", ge=0)
    prompt: str = cf.F("", "text prompt for previews; mdlm: \"[[N]]\" marks N tokens to infill", free="any text")


class TokenMethod(Method):
    """What both language-model methods share: token data, random-id batches, the unigram baseline, text output."""

    data_kinds = ("token",)
    render = render  # the samples file (lm/render.py)
    name = ""  # the registry name, in error messages

    def __init__(self, cfg, data_spec):
        if data_spec.get("kind") != "tokens":
            raise GenlabError(f"method {self.name} needs token data (data.name=text|tokens|synthetic_tokens), got kind {data_spec.get('kind')!r}")
        self.cfg, self.mcfg, self.spec = cfg, cfg.method, data_spec
        self.V, self.T = data_spec["vocab_size"], data_spec["seq_len"]
        self._checked = False  # the backbone is checked in the first loss call only

    def backbone(self, model):
        """The unwrapped model, refused unless a token backbone with this method's attention (causal or not)."""
        return check_backbone(model, self.causal, self.name)

    def synthetic_batch(self, batch_size, device, generator):
        ids = torch.randint(0, self.V, (batch_size, self.T + 1), generator=generator, device=device)
        return {"x": ids[:, :-1], "y": ids[:, 1:]}

    def trivial_baselines(self, data, generator):
        # a context-blind model predicts the unigram distribution (not the bigram level: learning runs sit above it);
        # MDLM's NELBO of it is the same for either schedule, up to the eps cut
        h = baselines.unigram_entropy(data.train)
        what = "unigram entropy of the training tokens"
        return [baselines.Baseline("loss", h, what), baselines.Baseline(self.best_metric, h, what)]

    def decode(self, samples) -> list[str]:
        return [decode(self.spec, row.tolist()) for row in samples]


def check_backbone(model, causal: bool, method: str):
    base = unwrap(model)
    if not hasattr(base, "causal") or not hasattr(base, "vocab_size"):
        raise GenlabError(f"method {method} needs a token backbone (model.name=gpt or sparse_transformer)")
    if bool(base.causal) != causal:
        raise GenlabError(f"method {method} needs a {'causal' if causal else 'bidirectional'} backbone: "
                          f"set model.causal={str(causal).lower()}")
    return base


def val_windows(data, seq_len: int, max_seqs: int) -> torch.Tensor:
    """Non-overlapping windows of seq_len+1 tokens from the validation split, in order (deterministic)."""
    val = np.asarray(data.val)
    n = min(max_seqs, (len(val) - 1) // seq_len)
    if n < 1:
        raise GenlabError(f"the validation split ({len(val)} tokens) is shorter than one sequence of {seq_len + 1}")
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None]
    return torch.from_numpy(val[idx].astype(np.int64))


def eval_batch_size(ecfg, seq_len: int, n_vocab: int) -> int:
    """Keep the logits of one eval batch under ~2^27 elements."""
    return max(1, min(ecfg.batch_size, (1 << 27) // (seq_len * n_vocab)))


def per_token_metrics(prefix: str, nats: float, spec: dict) -> dict:
    out = {f"{prefix}_loss": nats, f"{prefix}_bits_per_token": nats / LN2, f"{prefix}_ppl": math.exp(min(nats, 50.0))}
    unit = {"char": "bpc", "byte": "bits_per_byte"}.get(spec.get("tokenizer"))  # one token is one character / byte
    return {**out, f"{prefix}_{unit}": nats / LN2} if unit else out


def encode_prompt(spec: dict, text: str) -> list[int]:
    tok = from_meta(spec)
    if tok is None:
        raise GenlabError("this dataset has no tokenizer (synthetic tokens): prompts are not available")
    return tok.encode(text)


def decode(spec: dict, ids) -> str:
    tok = from_meta(spec)
    ids = [int(i) for i in ids]
    return tok.decode(ids) if tok is not None else " ".join(map(str, ids))


SAMPLE_HEAD = re.compile(r"^===== sample \d+ =====\n", re.M)


def read_samples(path) -> list[str]:
    """The texts lm/render.py's write_samples wrote (`genlab sample` prints the first few)."""
    parts = SAMPLE_HEAD.split(Path(path).read_text(encoding="utf-8"))[1:]
    return [t[:-1] if t.endswith("\n") else t for t in parts]


def unigram_entropy(ids: torch.Tensor) -> float:
    """Entropy (nats) of the token histogram of generated text: low values flag degenerate repetition."""
    counts = torch.bincount(ids.flatten().cpu()).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum())
