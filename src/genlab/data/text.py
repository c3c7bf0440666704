"""Token datasets: `genlab data prepare text` (nanoGPT-style train.bin/val.bin + meta.json), the reader,
and the registered datasets "tokens" (a prepared folder), "text" (the embedded corpus, char level) and
"synthetic_tokens" (uniform random tokens for benchmarks).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

import numpy as np

from genlab.config.fields import F, Keys
from genlab.core.errors import GenlabError
from genlab.data import text_stream as ts
from genlab.data.datasets import PathKeys, dataset_registry
from genlab.data.token_loader import TokenLoader
from genlab.data.tokenizers import TOKENIZERS, CharTokenizer, build_tokenizer, from_meta


@dataclass
class TokenData:
    train: np.ndarray             # flat token ids (memmap or array)
    val: np.ndarray
    seq_len: int
    meta: dict = field(default_factory=dict)   # tokenizer meta (name, vocab_size, itos ...) and source

    @property
    def spec(self) -> dict:
        tok = {k: self.meta[k] for k in ("tokenizer", "itos", "eot") if k in self.meta}
        return {"kind": "tokens", "vocab_size": int(self.meta["vocab_size"]), "seq_len": self.seq_len,
                "train_tokens": int(len(self.train)), "val_tokens": int(len(self.val)), "batch_keys": ("x", "y"), **tok}

    def check(self, where: str):
        for name, arr in (("train", self.train), ("val", self.val)):
            if len(arr) < self.seq_len + 2:
                raise GenlabError(f"{where}: the {name} split has {len(arr)} tokens, fewer than data.seq_len+2 = "
                                  f"{self.seq_len + 2}; use a smaller data.seq_len")
        return self

    def make_loader(self, cfg_data, batch_size, device, seed, rank=0, world=1):
        tokens = self.val if cfg_data.split == "val" else self.train
        return TokenLoader(tokens, self.seq_len, batch_size, device, seed=seed, rank=rank, world=world,
                           on_device=cfg_data.on_device, pin_memory=cfg_data.pin_memory, prefetch=cfg_data.prefetch)

    def tokenizer(self):
        return from_meta(self.meta)


def split_tokens(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The split rule (also text_stream's): the first 90 % of the token stream train, the rest val."""
    n = int(len(ids) * (1 - ts.VAL_FRACTION))
    return ids[:n], ids[n:]


def _read_hf(name: str) -> tuple[list[str], str]:
    try:
        import datasets
    except ImportError:
        raise GenlabError("--hf needs the `datasets` package (pip install datasets) and internet access") from None
    try:
        ds = datasets.load_dataset(name, split="train")
    except Exception as e:  # noqa: BLE001  (hub, network and format errors)
        raise GenlabError(f"could not load Hugging Face dataset '{name}': {e}") from None
    if "text" not in ds.column_names:
        raise GenlabError(f"Hugging Face dataset '{name}' has no 'text' column (columns: {ds.column_names})")
    return ds["text"], f"huggingface:{name}"


def prepare_text(src=None, out=None, tokenizer: str = "char", hf=None, workers: int = 1,
                 chunk_chars: int = ts.CHUNK_CHARS, force: bool = False) -> Path:
    """Text files / folders / globs, .jsonl documents or a Hugging Face dataset's text column -> a token dataset,
    streaming (text_stream.py); workers=0: one per core for gpt2, else 1."""
    if tokenizer not in TOKENIZERS:
        raise GenlabError(f"unknown tokenizer '{tokenizer}'; valid: {', '.join(TOKENIZERS)}")
    if out is None:
        raise GenlabError("`data prepare text` needs --out DIR")
    if bool(src) == bool(hf):
        raise GenlabError("`data prepare text` needs exactly one of --src FILE_OR_DIR or --hf DATASET")
    ts.check_out(Path(out), force)
    if hf:
        docs, source = _read_hf(hf)
        items, total = (lambda: ts.doc_items(docs)), None
    else:
        files, kind = ts.list_sources(src)
        items, total = (lambda: ts.source_items(files, kind)), sum(f.stat().st_size for f in files)
        one_dir = isinstance(src, (str, os.PathLike)) and Path(src).is_dir()
        source = (f"{len(files)} file(s) under {src}" if one_dir else str(files[0]) if len(files) == 1
                  else f"{len(files)} file(s): {files[0]} ... {files[-1]}")
    if tokenizer == "char":  # the alphabet needs a first pass over the text
        tok = CharTokenizer(ts.fit_chars(items()))
        if not tok.itos:
            raise GenlabError("the source holds no text")
    else:
        tok = build_tokenizer(tokenizer)
    if not workers:  # byte and char encode at numpy speed: worker processes cost more than they save (docs/lm.md)
        workers = (os.cpu_count() or 1) if tokenizer == "gpt2" else 1
    if total is not None:  # no more processes than work items
        workers = max(1, min(workers, -(-total // chunk_chars)))
    return ts.write_stream(out, items(), tok.meta(), source, workers=workers, chunk_chars=chunk_chars,
                           total_bytes=total, force=force)


def read_token_dataset(path, seq_len: int, verify: bool | None = None) -> TokenData:
    p = Path(path)
    if not (p / "meta.json").exists():
        raise GenlabError(f"no token dataset at '{p}' (meta.json missing); create one with `genlab data prepare text`")
    try:
        meta = json.loads((p / "meta.json").read_text())
        dtype = np.dtype(meta["dtype"])
        arrs = {n: np.memmap(p / f"{n}.bin", dtype=dtype, mode="r") for n in ("train", "val")}
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        raise GenlabError(f"token dataset at '{p}' is corrupt: {e}") from None
    if meta.get("format") != "genlab-tokens-v1":
        raise GenlabError(f"'{p}' is not a token dataset (format {meta.get('format')!r})")
    for n, a in arrs.items():
        if len(a) != meta[f"{n}_tokens"]:
            raise GenlabError(f"token dataset at '{p}' is corrupt: {n}.bin holds {len(a)} tokens, meta.json says {meta[f'{n}_tokens']}")
    if verify is None:
        verify = sum(a.nbytes for a in arrs.values()) < (1 << 30)
    if verify:
        for n in arrs:
            h = hashlib.sha256()
            with open(p / f"{n}.bin", "rb") as f:
                for chunk in iter(lambda: f.read(1 << 24), b""):
                    h.update(chunk)
            if h.hexdigest() != meta["sha256"][n]:
                raise GenlabError(f"token dataset at '{p}' is corrupt: {n}.bin checksum differs from meta.json")
    return TokenData(arrs["train"], arrs["val"], seq_len, meta).check(str(p))


def read_corpus() -> str:
    """The embedded default corpus: the opening ~40 KB of Tiny Shakespeare (Karpathy's char-rnn compilation, public
    domain), shipped as package data and read as UTF-8 bytes so no newline translation applies."""
    return files("genlab.data").joinpath("shakespeare_excerpt.txt").read_bytes().decode("utf-8")


def embedded_corpus(seq_len: int) -> TokenData:
    corpus = read_corpus()
    tok = build_tokenizer("char", corpus)
    train, val = split_tokens(np.asarray(tok.encode(corpus), dtype=np.uint16))
    return TokenData(train, val, seq_len, {**tok.meta(), "source": "genlab.data.text (Tiny Shakespeare excerpt)"})


class TokenKeys(Keys, section="data"):
    split: str = F("train", "token data: the split the loader streams (val: the held-out tokens)", choices=("train", "val"))
    seq_len: int = F(256, "token data: sequence length per sample", ge=1)


class VocabKeys(Keys, section="data"):
    vocab_size: int = F(0, "synthetic tokens: vocabulary size (>= 2 for data.name=synthetic_tokens)", ge=0)


def _check_synthetic_tokens(d):
    if d.vocab_size < 2:
        raise GenlabError("data.vocab_size must be >= 2 for data.name=synthetic_tokens")


@dataset_registry.register("tokens", "train.bin/val.bin written by `genlab data prepare text` (data.path, data.seq_len)",
                           kind="token", keys=(PathKeys, TokenKeys), needs_path=True)
def tokens(cfg_data):
    return read_token_dataset(cfg_data.path, cfg_data.seq_len)


@dataset_registry.register("text", "embedded char-level corpus (a 40 KB Tiny Shakespeare excerpt): needs no files",
                           kind="token", keys=TokenKeys)
def text(cfg_data):
    return embedded_corpus(cfg_data.seq_len).check("embedded corpus")


@dataset_registry.register("synthetic_tokens", "uniform random tokens of data.vocab_size, data.size sequences (benchmarks)",
                           kind="token", keys=(TokenKeys, VocabKeys), reads=("data.size",), check=_check_synthetic_tokens)
def synthetic_tokens(cfg_data):  # data.vocab_size >= 2: _check_synthetic_tokens
    rng = np.random.default_rng(0)
    n = cfg_data.size * (cfg_data.seq_len + 1)
    ids = rng.integers(0, cfg_data.vocab_size, size=n + n // 9 + cfg_data.seq_len + 2).astype(ts.token_dtype(cfg_data.vocab_size))
    train, val = split_tokens(ids)
    return TokenData(train, val, cfg_data.seq_len, {"vocab_size": cfg_data.vocab_size, "source": "synthetic"}).check("synthetic_tokens")
