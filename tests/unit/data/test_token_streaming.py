"""Token datasets larger than memory: streaming preparation (text.write_stream) against the in-memory rule, and the
token loader's memmap path with the resident/permutation limits patched small."""
from __future__ import annotations

import hashlib
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import cli_in_process

from genlab.core.errors import GenlabError
from genlab.data import text as text_stream, token_loader
from genlab.data.text import prepare_text, read_token_dataset, split_tokens
from genlab.data.token_loader import TokenLoader, window_starts
from genlab.data.tokenizers import build_tokenizer

# whitespace runs, "\r\n", blank lines, trailing spaces, contractions, digits, multi-byte characters: the places
# where cutting a text into pieces could change its tokens
TEXTS = [
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.  \n \n\tIndented line's end\n",
    "Caf\u00e9 cr\u00e8me \u2014 na\u00efve r\u00e9sum\u00e9s.\r\nLine two\r\n\r\n\r\nThree blank-separated 123 4567\n   x\ny",
    "\n\nStarts with newlines; ends without one. \u65e5\u672c\u8a9e\u306e\u6587 \U0001F600 emoji",
]
TOKENIZERS = ["char", "byte", "gpt2"]


def _gpt2_or_skip(name):
    if name == "gpt2":
        try:
            build_tokenizer("gpt2")
        except GenlabError as e:
            pytest.skip(str(e))


def _write(tmp_path, texts, suffix=".txt"):
    folder = tmp_path / "src"
    folder.mkdir()
    paths = []
    for i, t in enumerate(texts):
        p = folder / f"part{i:02d}{suffix}"
        p.write_bytes(t.encode("utf-8"))
        paths.append(p)
    return folder, paths


def _bins(out):
    meta = json.loads((out / "meta.json").read_text())
    return [np.fromfile(out / f"{n}.bin", dtype=np.dtype(meta["dtype"])) for n in ("train", "val")] + [meta]


def _reference(texts, name):
    """The in-memory rule: files read whole (universal newlines) and joined by "\\n", encoded at once, 90/10."""
    text = "\n".join(t.replace("\r\n", "\n").replace("\r", "\n") for t in texts)
    tok = build_tokenizer(name, text)
    return split_tokens(np.asarray(tok.encode(text), dtype=np.int64)) + (tok.meta(),)


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("chunk_chars", [1, 7, 64])
def test_streaming_matches_tokenizing_the_whole_text(tmp_path, monkeypatch, name, chunk_chars):
    _gpt2_or_skip(name)
    monkeypatch.setattr(text_stream, "READ_BYTES", 5)  # blocks split multi-byte characters and "\r\n"
    texts = TEXTS * 4
    _, paths = _write(tmp_path, texts)
    out = prepare_text(src=[str(p) for p in paths], out=str(tmp_path / "ds"), tokenizer=name, chunk_chars=chunk_chars)
    train, val, meta = _bins(out)
    ref_train, ref_val, ref_meta = _reference(texts, name)
    assert np.array_equal(train, ref_train) and np.array_equal(val, ref_val)
    assert {k: meta[k] for k in ref_meta} == ref_meta


@pytest.mark.parametrize("name", TOKENIZERS)
def test_jsonl_documents_are_separated_by_the_boundary(tmp_path, name):
    _gpt2_or_skip(name)
    docs = TEXTS * 3
    lines = [json.dumps({"text": d, "id": i}) for i, d in enumerate(docs)]
    (tmp_path / "a.jsonl").write_text("\n".join(lines[:4]) + "\n\n")
    (tmp_path / "b.jsonl").write_text("\n".join(lines[4:]))
    out = prepare_text(src=str(tmp_path / "*.jsonl"), out=str(tmp_path / "ds"), tokenizer=name, chunk_chars=50)
    train, val, meta = _bins(out)
    tok = build_tokenizer(name, "".join(docs) + "\n")
    sep = [tok.eot] if name == "gpt2" else tok.encode("\n\n")  # nanoGPT's openwebtext rule
    ref = [i for d in docs for i in tok.encode(d) + sep]
    assert np.array_equal(np.concatenate([train, val]), ref) and len(train) == int(len(ref) * 0.9)


def test_one_and_two_workers_write_identical_files(tmp_path):
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta\n", "\n\n", "  ", "\u00e9t\u00e9", "42", ",", "'s"]
    texts = ["".join(rng.choice(words, 3000)) for _ in range(3)]
    _, paths = _write(tmp_path, texts)
    outs = [prepare_text(src=[str(p) for p in paths], out=str(tmp_path / f"w{w}"), tokenizer="char", workers=w,
                         chunk_chars=997) for w in (1, 2)]
    for f in ("train.bin", "val.bin", "meta.json"):
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes(), f


def test_checksums_are_the_files_and_folder_equals_its_sorted_files(tmp_path, monkeypatch):
    monkeypatch.setattr(text_stream, "HASH_CHECKPOINT_BYTES", 64)  # the train hash resumes from a saved state
    folder, paths = _write(tmp_path, TEXTS * 10)
    a = prepare_text(src=str(folder), out=str(tmp_path / "a"), tokenizer="byte", chunk_chars=40)
    b = prepare_text(src=[str(p) for p in paths], out=str(tmp_path / "b"), tokenizer="byte")
    meta = json.loads((a / "meta.json").read_text())
    for n in ("train", "val"):
        assert meta["sha256"][n] == hashlib.sha256((a / f"{n}.bin").read_bytes()).hexdigest()
        assert (a / f"{n}.bin").read_bytes() == (b / f"{n}.bin").read_bytes()
    read_token_dataset(a, seq_len=8, verify=True)


def test_existing_output_is_refused_and_force_replaces_only_a_dataset(tmp_path):
    _, paths = _write(tmp_path, TEXTS)
    out = prepare_text(src=str(paths[0]), out=str(tmp_path / "ds"), tokenizer="byte")
    before = (out / "train.bin").read_bytes()
    with pytest.raises(GenlabError, match="already exists"):
        prepare_text(src=str(paths[1]), out=str(out), tokenizer="byte")
    assert (out / "train.bin").read_bytes() == before
    prepare_text(src=str(paths[1]), out=str(out), tokenizer="byte", force=True)
    assert (out / "train.bin").read_bytes() != before and sorted(p.name for p in tmp_path.iterdir()) == ["ds", "src"]
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(GenlabError, match="not a token dataset"):
        prepare_text(src=str(paths[0]), out=str(other), tokenizer="byte", force=True)
    assert [p.name for p in other.iterdir()] == ["keep.txt"]


def test_a_failure_midway_leaves_no_output(tmp_path):
    _, paths = _write(tmp_path, TEXTS)
    paths[2].write_bytes(b"valid start \xff\xfe not utf-8")
    with pytest.raises(GenlabError, match="not UTF-8"):
        prepare_text(src=[str(p) for p in paths], out=str(tmp_path / "ds"), tokenizer="byte", chunk_chars=8)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # neither ds nor ds.partial


def test_cli_refuses_to_overwrite_in_one_line(tmp_path, capfd):
    folder, _ = _write(tmp_path, TEXTS)
    args = ("data", "prepare", "text", "--src", str(folder / "*.txt"), "--tokenizer", "byte", "--out", str(tmp_path / "ds"))
    assert cli_in_process(capfd, *args, "--workers", "2").returncode == 0
    r = cli_in_process(capfd, *args)
    assert r.returncode == 2 and "already exists" in r.stderr and r.stderr.strip().count("\n") == 0
    assert cli_in_process(capfd, *args, "--force").returncode == 0


# -- the loader over a memmap ------------------------------------------------------------------------
class ReadSpy:
    """A token memmap that records the size of every read and refuses to be read whole."""

    def __init__(self, mm):
        self.mm, self.reads = mm, []

    def __len__(self):
        return len(self.mm)

    def __getitem__(self, idx):
        out = np.asarray(self.mm[idx])
        self.reads.append(out.size)
        return out

    def __array__(self, *args, **kwargs):
        raise AssertionError("the whole token stream was read")


@pytest.fixture
def big_stream(tmp_path, monkeypatch):
    """A 20,000-token memmap, "larger than" the patched resident limit (and permutation limit, per test)."""
    monkeypatch.setattr(token_loader, "RESIDENT_LIMIT_BYTES", 1024)
    ids = np.random.default_rng(1).integers(0, 50000, 20000).astype(np.uint16)
    ids.tofile(tmp_path / "t.bin")
    return ids, np.memmap(tmp_path / "t.bin", dtype=np.uint16, mode="r")


@pytest.mark.parametrize("permute_limit", [1 << 24, 100])  # IndexStream, then per-batch draws (RandomStarts)
@pytest.mark.parametrize("prefetch", [0, 2])
def test_memmap_windows_are_naive_slices_and_nothing_reads_the_whole_file(big_stream, monkeypatch, permute_limit,
                                                                           prefetch):
    monkeypatch.setattr(token_loader, "PERMUTE_LIMIT", permute_limit)
    ids, mm = big_stream
    T, B = 32, 6
    spy = ReadSpy(mm)
    loader = TokenLoader(spy, T, B, "cpu", seed=5, prefetch=prefetch)
    assert not loader.resident
    starts = window_starts(len(ids), T, 5)
    for _ in range(4):
        b = loader.next()
        for row, s in enumerate(starts.take(B)):
            assert np.array_equal(b["x"][row].numpy(), ids[s:s + T]) and np.array_equal(b["y"][row].numpy(), ids[s + 1:s + T + 1])
    loader.close()
    assert spy.reads and max(spy.reads) <= B * (T + 1)


@pytest.mark.parametrize("permute_limit", [1 << 24, 100])
def test_memmap_loader_resumes_exactly_with_batches_in_flight(big_stream, monkeypatch, permute_limit):
    monkeypatch.setattr(token_loader, "PERMUTE_LIMIT", permute_limit)
    _, mm = big_stream
    a = TokenLoader(mm, 16, 4, "cpu", seed=3, prefetch=3)
    for _ in range(5):
        a.next()
    state = a.state_dict()  # three batches are gathered ahead at this point
    want = [a.next()["x"] for _ in range(4)]
    b = TokenLoader(mm, 16, 4, "cpu", seed=3, prefetch=1)
    b.next()
    b.load_state_dict(state)
    assert all(torch.equal(w, b.next()["x"]) for w in want)
    a.close(), b.close()


@pytest.mark.parametrize("permute_limit", [1 << 24, 100])
def test_memmap_rank_slices_are_disjoint_and_make_the_global_batch(big_stream, monkeypatch, permute_limit):
    monkeypatch.setattr(token_loader, "PERMUTE_LIMIT", permute_limit)
    ids, mm = big_stream
    T, B, world = 16, 4, 3
    full = TokenLoader(mm, T, B * world, "cpu", seed=9)
    ranks = [TokenLoader(mm, T, B, "cpu", seed=9, rank=r, world=world) for r in range(world)]
    for _ in range(3):
        parts = [r.next()["x"] for r in ranks]
        assert torch.equal(torch.cat(parts), full.next()["x"])
    starts = window_starts(len(ids), T, 9).take(B * world)
    if permute_limit > len(ids):  # a permutation never repeats a start within an epoch
        assert len(set(starts.tolist())) == B * world
    for loader in ranks + [full]:
        loader.close()


def test_prepared_dataset_over_the_limit_streams_from_its_memmap(tmp_path, monkeypatch):
    monkeypatch.setattr(token_loader, "RESIDENT_LIMIT_BYTES", 1024)
    _, paths = _write(tmp_path, TEXTS * 30)
    out = prepare_text(src=[str(p) for p in paths], out=str(tmp_path / "ds"), tokenizer="byte", workers=2,
                       chunk_chars=300)
    data = read_token_dataset(out, seq_len=24)
    cfg = SimpleNamespace(split="train", on_device="auto", pin_memory="auto", prefetch=2)
    loader = data.make_loader(cfg, 4, "cpu", seed=0)
    assert isinstance(loader.tokens, np.memmap) and not loader.resident
    b = loader.next()
    train = (out / "train.bin").read_bytes()  # uint8 ids of the byte tokenizer's stream
    assert data.meta["dtype"] == "uint16" and torch.equal(b["x"][:, 1:], b["y"][:, :-1])
    assert all(np.asarray(row, dtype=np.uint16).tobytes() in train for row in b["y"].tolist())
    loader.close()
