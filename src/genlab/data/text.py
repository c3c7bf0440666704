"""Token datasets: `genlab data prepare text` (nanoGPT-style train.bin/val.bin + meta.json), the reader,
and the registered datasets "tokens" (a prepared folder), "text" (the embedded corpus, char level) and
"synthetic_tokens" (uniform random tokens for benchmarks).

Preparation streams datasets larger than memory: work items cut where tokenizing the pieces gives the whole text's
tokens, tokenized in worker processes in order (docs/lm.md).
"""
from __future__ import annotations

import codecs
import glob
import hashlib
import io
import json
import os
import shutil
from collections import deque
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from genlab.config.fields import F, Keys
from genlab.core.errors import GenlabError
from genlab.core.progress import Task
from genlab.data.datasets import PathKeys, dataset_registry
from genlab.data.token_loader import TokenLoader
from genlab.data.tokenizers import TOKENIZERS, CharTokenizer, build_tokenizer, from_meta

VAL_FRACTION = 0.1
TEXT_SUFFIXES = {".txt", ".md", ".text", ""}
DOC_SUFFIXES = {".jsonl"}
CHUNK_CHARS = 1 << 22            # characters per work item (~4 MB of text; a few per worker in flight)
READ_BYTES = 1 << 20             # bytes per read of a source file
HASH_CHECKPOINT_BYTES = 1 << 26  # a copy of the running hash every 64 MB: the train hash ends <= 64 MB re-read
COPY_BYTES = 1 << 24
CHAR_SLICE = 1 << 20             # characters per numpy lookup of the char tokenizer


def token_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= 65536 else np.uint32


def list_sources(src) -> tuple[list[Path], str]:
    """The files of --src (one or more files, folders or glob patterns; folders and globs in sorted order),
    and whether they are plain text ("text") or .jsonl documents ("docs"); the two do not mix."""
    entries = [src] if isinstance(src, (str, os.PathLike)) else list(src)
    files: list[Path] = []
    for e in entries:
        p = Path(e)
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in TEXT_SUFFIXES | DOC_SUFFIXES)
            if not found:
                raise GenlabError(f"no text files (.txt/.md/.jsonl) under '{p}'")
            files += found
        elif glob.has_magic(str(e)):
            found = sorted(Path(f) for f in glob.glob(str(e), recursive=True) if Path(f).is_file())
            if not found:
                raise GenlabError(f"--src pattern '{e}' matches no files")
            files += found
        else:
            raise GenlabError(f"--src '{e}' does not exist")
    kinds = {"docs" if f.suffix.lower() in DOC_SUFFIXES else "text" for f in files}
    if len(kinds) > 1:
        raise GenlabError("--src mixes .jsonl documents with plain text files; prepare them separately")
    return files, kinds.pop()


def _read_text(path: Path):
    """Blocks of UTF-8 text with universal newlines (as Path.read_text) and the bytes each consumed."""
    dec = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")(), translate=True)
    try:
        with open(path, "rb") as f:
            while block := f.read(READ_BYTES):
                yield dec.decode(block), len(block)
            yield dec.decode(b"", final=True), 0
    except UnicodeDecodeError as e:
        raise GenlabError(f"--src: {path} is not UTF-8 text ({e})") from None


def _read_jsonl(path: Path):
    with open(path, "rb") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)["text"]
            except (ValueError, KeyError, TypeError):
                raise GenlabError(f"{path}:{i}: not a JSON object with a \"text\" field") from None
            if not isinstance(text, str):
                raise GenlabError(f"{path}:{i}: \"text\" is not a string")
            yield text, len(line)


def source_items(files: list[Path], kind: str):
    """(text, ends_document, bytes_read) triples. Plain text files form one continuous text joined by "\\n";
    each document is encoded on its own and followed by the boundary."""
    for i, f in enumerate(files):
        if i and kind != "docs":
            yield "\n", False, 0
        for text, n in (_read_jsonl if kind == "docs" else _read_text)(f):
            yield text, kind == "docs", n


def doc_items(docs):
    for d in docs:
        if not isinstance(d, str):
            raise GenlabError(f"a document's text is {type(d).__name__}, not a string")
        yield d, True, 0


def safe_cut(tokenizer: str, s: str, want: int) -> int:
    """A position p in s, the first at or after `want` else the last before it (0 if none), where
    encode(s[:p]) + encode(rest) == encode(s + rest) for any continuation. char and byte encode character
    by character: anywhere. GPT-2's pre-tokenizer regex ends a pre-token before a "\\n" that is followed by
    a non-space (a whitespace run before it is one pre-token whether or not the "\\n" follows; the "\\n"
    itself is a pre-token of its own), so p = at such a newline."""
    if tokenizer != "gpt2":
        return min(want, len(s))
    q = s.find("\n", max(1, want), len(s) - 1)
    while q != -1 and s[q + 1].isspace():
        q = s.find("\n", q + 1, len(s) - 1)
    if q != -1:
        return q
    q = s.rfind("\n", 1, min(want, len(s) - 1))
    while q != -1 and s[q + 1].isspace():
        q = s.rfind("\n", 1, q)
    return max(q, 0)


def work_items(items, tokenizer: str, chunk_chars: int):
    """Lists of (text, ends_document) of about chunk_chars characters, and the source bytes they consumed."""
    parts, size, nbytes = [], 0, 0
    buf = ""  # the unfinished part of a continuous text
    for text, doc_end, n in items:
        buf += text
        nbytes += n
        if doc_end:
            parts.append((buf, True))
            size, buf = size + len(buf), ""
        while size + len(buf) >= chunk_chars and buf:
            cut = safe_cut(tokenizer, buf, chunk_chars - size)
            if not cut:
                break  # gpt2 text with no safe point yet: read on
            parts.append((buf[:cut], False))
            size, buf = size + cut, buf[cut:]
            yield parts, nbytes
            parts, size, nbytes = [], 0, 0
        if size >= chunk_chars:
            yield parts, nbytes
            parts, size, nbytes = [], 0, 0
    if buf:
        parts.append((buf, False))
    if parts:
        yield parts, nbytes


class Encoder:
    """Work item -> token array; the boundary after a document is <|endoftext|> for gpt2, else "\\n\\n"
    (nanoGPT's openwebtext prepare; the in-memory --hf converter did the same)."""

    def __init__(self, meta: dict, dtype):
        self.tok, self.dtype = from_meta(meta), np.dtype(dtype)
        if meta["tokenizer"] == "char":  # a code point -> id table: numpy instead of a Python loop per character
            cps = np.array([ord(c) for c in self.tok.itos], dtype=np.int64)
            self.table = np.full(int(cps.max()) + 2, -1, dtype=np.int32)  # the last -1 catches every larger one
            self.table[cps] = np.arange(len(cps))
        self.sep = None  # the boundary's ids, made at the first document (plain text may lack "\n" in char's alphabet)

    def encode(self, text: str) -> np.ndarray:
        name = self.tok.name
        if name == "byte":
            return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(self.dtype)
        if name == "char":  # in slices, so the temporaries stay a few MB whatever the work item's size
            return np.concatenate([self._chars(text[i:i + CHAR_SLICE]) for i in range(0, len(text), CHAR_SLICE)]
                                  or [np.empty(0, self.dtype)])
        return np.asarray(self.tok.encode(text), dtype=self.dtype)

    def _chars(self, text: str) -> np.ndarray:
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        ids = np.take(self.table, cps, mode="clip")
        if (ids < 0).any():
            c = text[int(np.argmax(ids < 0))]
            raise GenlabError(f"character {c!r} is not in this char vocabulary ({self.tok.vocab_size} symbols)")
        return ids.astype(self.dtype)

    def __call__(self, parts) -> np.ndarray:
        out = []
        for text, doc_end in parts:
            out.append(self.encode(text))
            if doc_end:
                if self.sep is None:
                    self.sep = np.asarray([self.tok.eot] if self.tok.name == "gpt2" else self.encode("\n\n"), self.dtype)
                out.append(self.sep)
        return np.concatenate(out) if out else np.empty(0, self.dtype)


_ENCODER: Encoder | None = None


def _init_worker(meta, dtype):
    global _ENCODER
    _ENCODER = Encoder(meta, dtype)


def _encode_in_worker(parts):
    return _ENCODER(parts)


def encoded_items(chunks, meta: dict, dtype, workers: int):
    """(token array, bytes) per work item, in order. At most 2 items per worker in flight, so the reader
    never runs ahead of the tokenizers by more than that (Pool.imap would queue the whole corpus)."""
    if workers <= 1:
        enc = Encoder(meta, dtype)
        for parts, n in chunks:
            yield enc(parts), n
        return
    import multiprocessing as mp
    # fork where the OS has it: workers use numpy and the tokenizer only, and spawn re-imports __main__
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(meta, dtype)) as pool:
        pending = deque()
        for parts, n in chunks:
            pending.append((pool.apply_async(_encode_in_worker, (parts,)), n))
            if len(pending) >= 2 * workers:
                r, m = pending.popleft()
                yield r.get(), m
        while pending:
            r, m = pending.popleft()
            yield r.get(), m


class TokenFile:
    """Appends token arrays to one file, hashing as it goes; keeps a copy of the hash state every
    HASH_CHECKPOINT_BYTES so the hash of any prefix costs at most that much re-reading."""

    def __init__(self, path: Path, dtype):
        self.path, self.dtype = path, np.dtype(dtype)
        self.f = open(path, "wb")
        self.h, self.nbytes = hashlib.sha256(), 0
        self.checkpoints = [(0, self.h.copy())]

    def write(self, ids: np.ndarray):
        if self.nbytes - self.checkpoints[-1][0] >= HASH_CHECKPOINT_BYTES:
            self.checkpoints.append((self.nbytes, self.h.copy()))
        b = memoryview(np.ascontiguousarray(ids, dtype=self.dtype)).cast("B")  # no copy
        self.f.write(b)
        self.h.update(b)
        self.nbytes += b.nbytes

    @property
    def tokens(self) -> int:
        return self.nbytes // self.dtype.itemsize

    def split(self, n_train: int, train_path: Path, val_path: Path) -> dict:
        """Tokens [0, n_train) become train_path, the rest val_path; returns both SHA-256s."""
        self.f.close()
        cut = n_train * self.dtype.itemsize
        at, h = max((c for c in self.checkpoints if c[0] <= cut), key=lambda c: c[0])
        h, hv = h.copy(), hashlib.sha256()
        with open(self.path, "r+b") as f, open(val_path, "wb") as v:
            f.seek(at)
            for dst, end in ((h, cut), (hv, self.nbytes)):
                while f.tell() < end:
                    b = f.read(min(COPY_BYTES, end - f.tell()))
                    dst.update(b)
                    if dst is hv:
                        v.write(b)
            f.truncate(cut)
        os.replace(self.path, train_path)
        return {"train": h.hexdigest(), "val": hv.hexdigest()}


def check_out(out: Path, force: bool):
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not force:
            raise GenlabError(f"--out '{out}' already exists and is not empty (nothing is overwritten; --force replaces "
                              f"a token dataset)")
        if not (out / "meta.json").exists():
            raise GenlabError(f"--out '{out}' is not a token dataset (no meta.json); --force replaces only a dataset")


def write_stream(out, items, meta: dict, source: str, workers: int = 1, chunk_chars: int = CHUNK_CHARS,
                 total_bytes: int | None = None, force: bool = False) -> Path:
    """Tokenize `items` (see source_items) into OUT/train.bin, val.bin, meta.json, built in OUT.partial and
    renamed into place at the end; --force replaces an existing token dataset only once the new one is whole."""
    out = Path(out)
    check_out(out, force)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)  # a crashed earlier run's leftovers
    tmp.mkdir(parents=True)
    dtype = token_dtype(meta["vocab_size"])
    try:
        tf = TokenFile(tmp / "tokens.bin", dtype)
        with Task("tokenize", total_bytes or None, unit="B") as task:
            for ids, n in encoded_items(work_items(items, meta["tokenizer"], chunk_chars), meta, dtype, workers):
                tf.write(ids)
                task.update(n)
        n = tf.tokens
        if n < 20:
            tf.f.close()
            raise GenlabError(f"the source holds only {n} tokens; too little text to split into train/val")
        n_train = int(n * (1 - VAL_FRACTION))
        sha = tf.split(n_train, tmp / "train.bin", tmp / "val.bin")
        meta = {"format": "genlab-tokens-v1", **meta, "source": source, "dtype": np.dtype(dtype).name,
                "train_tokens": n_train, "val_tokens": n - n_train, "sha256": sha}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        old = None
        if out.exists():
            old = out.with_name(out.name + ".replaced")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def fit_chars(items) -> list[str]:
    """The char tokenizer's alphabet, in one streaming pass (document boundaries add "\\n")."""
    seen: set[str] = set()
    for text, doc_end, _ in items:
        seen.update(text)
        if doc_end:
            seen.add("\n")
    return sorted(seen)


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
    """The split rule (also write_stream's): the first 90 % of the token stream train, the rest val."""
    n = int(len(ids) * (1 - VAL_FRACTION))
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
                 chunk_chars: int = CHUNK_CHARS, force: bool = False) -> Path:
    """Text files / folders / globs, .jsonl documents or a Hugging Face dataset's text column -> a token dataset,
    streaming (write_stream); workers=0: one per core for gpt2, else 1."""
    if tokenizer not in TOKENIZERS:
        raise GenlabError(f"unknown tokenizer '{tokenizer}'; valid: {', '.join(TOKENIZERS)}")
    if out is None:
        raise GenlabError("`data prepare text` needs --out DIR")
    if bool(src) == bool(hf):
        raise GenlabError("`data prepare text` needs exactly one of --src FILE_OR_DIR or --hf DATASET")
    check_out(Path(out), force)
    if hf:
        docs, source = _read_hf(hf)
        items, total = (lambda: doc_items(docs)), None
    else:
        files, kind = list_sources(src)
        items, total = (lambda: source_items(files, kind)), sum(f.stat().st_size for f in files)
        one_dir = isinstance(src, (str, os.PathLike)) and Path(src).is_dir()
        source = (f"{len(files)} file(s) under {src}" if one_dir else str(files[0]) if len(files) == 1
                  else f"{len(files)} file(s): {files[0]} ... {files[-1]}")
    if tokenizer == "char":  # the alphabet needs a first pass over the text
        tok = CharTokenizer(fit_chars(items()))
        if not tok.itos:
            raise GenlabError("the source holds no text")
    else:
        tok = build_tokenizer(tokenizer)
    if not workers:  # byte and char encode at numpy speed: worker processes cost more than they save (docs/lm.md)
        workers = (os.cpu_count() or 1) if tokenizer == "gpt2" else 1
    if total is not None:  # no more processes than work items
        workers = max(1, min(workers, -(-total // chunk_chars)))
    return write_stream(out, items(), tok.meta(), source, workers=workers, chunk_chars=chunk_chars,
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
    return resources.files("genlab.data").joinpath("shakespeare_excerpt.txt").read_bytes().decode("utf-8")


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
    ids = rng.integers(0, cfg_data.vocab_size, size=n + n // 9 + cfg_data.seq_len + 2).astype(token_dtype(cfg_data.vocab_size))
    train, val = split_tokens(ids)
    return TokenData(train, val, cfg_data.seq_len, {"vocab_size": cfg_data.vocab_size, "source": "synthetic"}).check("synthetic_tokens")
