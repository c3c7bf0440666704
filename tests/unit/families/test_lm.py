"""Language models: tokenizers, token files and loader, the GPT backbone, the autoregressive and the
masked-diffusion (MDLM) methods, checked against brute-force references."""
import functools
import itertools
import json
import math

import numpy as np
import pytest
import torch
from conftest import cli_in_process, plain_context
from torch.utils.flop_counter import FlopCounterMode

from genlab.config.tree import ModelConfig, load_config
from genlab.core.errors import GenlabError
from genlab.data.text import embedded_corpus, prepare_text, read_token_dataset
from genlab.data.token_loader import TokenLoader
from genlab.data.tokenizers import ByteTokenizer, CharTokenizer, GPT2Tokenizer
from genlab.families.lm import mdlm
from genlab.families.lm.gpt import GPT, GPTSpec, build_gpt, padded_vocab

LM_TINY = ["model.dim=32", "model.depth=2", "model.heads=2", "data.seq_len=32", "train.batch_size=16",
           "log.progress=false", "log.tensorboard=false", "optim.warmup_steps=5", "eval.num_samples=8",
           "eval.batch_size=8", "method.sample_len=24", "eval.nelbo_reps=1", "log.every=10"]
SCHEDULES = ("loglinear", "cosine")  # method.noise_schedule


def lm_config(tmp_path, preset, *overrides):
    return load_config(preset, LM_TINY + [f"train.out_dir={tmp_path}", *overrides])


# -- tokenizers and files --------------------------------------------------------------------------
def test_char_tokenizer_round_trip():
    text = "To be, or not to be:\nthat is the question."
    tok = CharTokenizer.fit(text)
    assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == len(set(text)) and tok.itos == sorted(set(text))
    with pytest.raises(GenlabError):
        tok.encode("Z")  # not in the fitted alphabet


def test_byte_tokenizer_round_trip_utf8():
    text = "naïve café — 東京"
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert max(ids) < 256 and len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_gpt2_tokenizer_round_trip():
    try:
        tok = GPT2Tokenizer()
    except GenlabError as e:
        pytest.skip(f"gpt2 BPE not available offline: {e}")
    text = "Hello world, this is GPT-2's tokenizer."
    ids = tok.encode(text)
    assert ids[:2] == [15496, 995]  # "Hello", " world" in GPT-2's vocabulary
    assert tok.decode(ids) == text


def test_prepare_text_writes_bins_that_read_back(tmp_path):
    src = tmp_path / "in.txt"
    text = "abcdefghij" * 30 + "xyz"
    src.write_text(text)
    out = prepare_text(src=str(src), out=str(tmp_path / "ds"), tokenizer="char")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 13 and meta["tokenizer"] == "char"
    train = np.fromfile(out / "train.bin", dtype=np.uint16)
    val = np.fromfile(out / "val.bin", dtype=np.uint16)
    assert len(train) == int(len(text) * 0.9) and len(train) + len(val) == len(text)
    tok = CharTokenizer(meta["itos"])
    assert tok.decode(np.concatenate([train, val]).tolist()) == text
    data = read_token_dataset(out, seq_len=8)
    assert np.array_equal(np.asarray(data.train), train) and data.spec["vocab_size"] == 13


def test_prepare_text_refuses_bad_input_and_creates_nothing(tmp_path):
    with pytest.raises(GenlabError):
        prepare_text(src=str(tmp_path / "missing.txt"), out=str(tmp_path / "a"), tokenizer="char")
    with pytest.raises(GenlabError):
        prepare_text(src=str(tmp_path), out=str(tmp_path / "b"), tokenizer="klingon")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    (tmp_path / "t.txt").write_text("hello world " * 10)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep").write_text("x")
    with pytest.raises(GenlabError):
        prepare_text(src=str(tmp_path / "t.txt"), out=str(busy), tokenizer="byte")
    assert sorted(p.name for p in busy.iterdir()) == ["keep"]


class _FakeHubDataset:
    """What `datasets.load_dataset(name, split="train")` returns, reduced to what the converter reads."""

    def __init__(self, columns: dict):
        self.columns = columns
        self.column_names = list(columns)

    def __getitem__(self, key):
        return self.columns[key]


def test_prepare_text_from_hugging_face_offline(tmp_path, monkeypatch):
    """The --hf path with a stand-in `datasets` module: documents joined with a boundary, byte-exact
    round trip, and clear errors for a missing text column or a failed download."""
    import sys
    import types
    docs = ["First document.", "Second one, a bit longer.", "Third!" * 5]
    calls = []

    def load_dataset(name, split):
        calls.append((name, split))
        if name == "no/text":
            return _FakeHubDataset({"content": docs})
        if name == "offline/fail":
            raise ConnectionError("no internet")
        return _FakeHubDataset({"text": docs})

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    out = prepare_text(hf="someone/corpus", out=str(tmp_path / "ds"), tokenizer="byte")
    assert calls == [("someone/corpus", "train")]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["source"] == "huggingface:someone/corpus"
    ids = np.concatenate([np.fromfile(out / f"{n}.bin", dtype=np.dtype(meta["dtype"])) for n in ("train", "val")])
    assert bytes(ids.astype(np.uint8).tolist()).decode() == "".join(d + "\n\n" for d in docs)
    with pytest.raises(GenlabError, match="no 'text' column"):
        prepare_text(hf="no/text", out=str(tmp_path / "a"), tokenizer="byte")
    with pytest.raises(GenlabError, match="could not load"):
        prepare_text(hf="offline/fail", out=str(tmp_path / "b"), tokenizer="byte")
    with pytest.raises(GenlabError, match="exactly one"):
        prepare_text(src=str(out / "meta.json"), hf="someone/corpus", out=str(tmp_path / "c"), tokenizer="byte")
    assert not any((tmp_path / n).exists() for n in "abc")


def test_corrupt_bin_is_detected(tmp_path):
    (tmp_path / "t.txt").write_text("hello world " * 20)
    out = prepare_text(src=str(tmp_path / "t.txt"), out=str(tmp_path / "ds"), tokenizer="byte")
    raw = bytearray((out / "train.bin").read_bytes())
    raw[0] ^= 1
    (out / "train.bin").write_bytes(bytes(raw))
    with pytest.raises(GenlabError, match="checksum"):
        read_token_dataset(out, seq_len=8)


# -- loader ---------------------------------------------------------------------------------------
def test_loader_targets_are_inputs_shifted_by_one():
    tokens = np.arange(1000, dtype=np.uint16)
    for on_device in ("yes", "no"):
        b = TokenLoader(tokens, 16, 8, "cpu", seed=1, on_device=on_device).next()
        assert torch.equal(b["x"][:, 1:], b["y"][:, :-1])
        assert torch.equal(b["y"] - b["x"], torch.ones_like(b["x"]))  # consecutive tokens of the stream


def test_loader_resumes_exactly_and_shards_ranks():
    tokens = np.random.default_rng(0).integers(0, 50, 5000).astype(np.uint16)
    a = TokenLoader(tokens, 16, 4, "cpu", seed=3)
    for _ in range(5):
        a.next()
    state = a.state_dict()
    want = [a.next()["x"] for _ in range(3)]
    b = TokenLoader(tokens, 16, 4, "cpu", seed=3)
    b.load_state_dict(state)
    assert all(torch.equal(w, b.next()["x"]) for w in want)
    full = TokenLoader(tokens, 16, 8, "cpu", seed=3).next()["x"]
    parts = [TokenLoader(tokens, 16, 4, "cpu", seed=3, rank=r, world=2).next()["x"] for r in range(2)]
    assert torch.equal(torch.cat(parts), full)


# -- backbone -------------------------------------------------------------------------------------
def tiny_gpt(causal, pos_emb="learned", mlp="gelu", norm="layernorm", V=11, T=12, attention="sdpa"):
    torch.manual_seed(0)
    return GPT(GPTSpec(vocab_size=V, seq_len=T, dim=32, depth=2, heads=4, pos_emb=pos_emb, mlp=mlp, norm=norm,
                       causal=causal, attention=attention)).eval()


@pytest.mark.parametrize("pos_emb", ["learned", "rope"])
def test_causal_model_is_causal(pos_emb):
    model = tiny_gpt(True, pos_emb)
    x = torch.randint(0, 11, (2, 12))
    x2 = x.clone()
    x2[:, 8] = (x2[:, 8] + 1) % 11  # change a "future" token
    with torch.no_grad():
        a, b = model(x), model(x2)
    assert torch.allclose(a[:, :8], b[:, :8], atol=1e-6), "earlier logits must not see token 8"
    assert not torch.allclose(a[:, 8:], b[:, 8:], atol=1e-4)


@pytest.mark.parametrize("pos_emb", ["learned", "rope"])
def test_bidirectional_model_sees_the_future(pos_emb):
    model = tiny_gpt(False, pos_emb)
    x = torch.randint(0, 11, (2, 12))
    x2 = x.clone()
    x2[:, -1] = (x2[:, -1] + 1) % 11
    with torch.no_grad():
        assert not torch.allclose(model(x)[:, 0], model(x2)[:, 0], atol=1e-5)


@pytest.mark.parametrize("mlp,tie,attention,causal", [("gelu", True, "math", True), ("swiglu", False, "math", True),
                                                      ("gelu", True, "differential", True), ("gelu", True, "linear", True),
                                                      ("gelu", True, "linear", False)])
def test_flops_match_flop_counter(mlp, tie, attention, causal):
    model = build_gpt(ModelConfig(name="gpt", size="tiny", mlp=mlp, tie_weights=tie, attention=attention, causal=causal),
                      {"kind": "tokens", "vocab_size": 65, "seq_len": 48})
    x = torch.randint(0, 65, (3, 48))
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        model(x)
    assert fc.get_total_flops() == 3 * model.flops_per_sample()


def test_vocab_padding_and_gpt2_size():
    assert padded_vocab(50257) == 50304 and padded_vocab(65) == 128 and padded_vocab(64) == 128
    model = build_gpt(ModelConfig(name="gpt", size="gpt2"), {"kind": "tokens", "vocab_size": 50257, "seq_len": 1024})
    assert model.n_vocab == 50304 and model.mask_id == 50257
    n = sum(p.numel() for p in model.parameters())
    assert 123e6 < n < 125e6  # GPT-2 small: 124M with the tied head


@pytest.mark.parametrize("ce_chunk", [0, 7])
@pytest.mark.parametrize("weighted", [False, True])
def test_model_loss_equals_cross_entropy_of_logits(ce_chunk, weighted):
    # model(x, targets, weights, vocab) (the fused training path, chunked or not) = the cross-entropy of
    # model(x)'s logits, in value and in every parameter gradient (tied head included)
    torch.manual_seed(0)
    model = GPT(GPTSpec(vocab_size=50, seq_len=16, dim=32, depth=2, heads=4, ce_chunk=ce_chunk))
    x, y = torch.randint(0, 50, (3, 16)), torch.randint(0, 50, (3, 16))
    w, vocab = (torch.rand(3, 16), 50) if weighted else (None, None)
    loss = model(x, targets=y, weights=w, vocab=vocab)
    got = torch.autograd.grad(loss, list(model.parameters()))
    nll = torch.nn.functional.cross_entropy(model(x)[..., :vocab or model.n_vocab].flatten(0, 1), y.flatten(), reduction="none")
    ref = nll.mean() if w is None else (w.flatten() * nll).sum()
    want = torch.autograd.grad(ref, list(model.parameters()))
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    for g, r in zip(got, want):
        assert torch.allclose(g, r, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("pos_emb", ["learned", "rope"])
def test_kv_cache_decode_matches_the_full_forward(pos_emb):
    from genlab.families.lm.autoregressive import generate
    model = tiny_gpt(True, pos_emb, V=11, T=12)
    x = torch.randint(0, 11, (2, 12))
    cache = []
    steps = [model.decode(x[:, :5], cache)] + [model.decode(x[:, i:i + 1], cache) for i in range(5, 12)]
    with torch.no_grad():
        full = model(x)
    for i, logits in zip(range(4, 12), steps):
        assert torch.allclose(logits, full[:, i], atol=1e-5), i
    # greedy sampling with and without the cache: the same tokens within the context length, and the
    # cached sampler keeps going past it (refilling the cache)
    prompt = x[:, :3]
    a = generate(model, prompt, 9, 11, 12, temperature=0, kv_cache=True)
    b = generate(model, prompt, 9, 11, 12, temperature=0, kv_cache=False)
    assert torch.equal(a, b)
    assert generate(model, prompt, 30, 11, 12, temperature=1.0, generator=torch.Generator().manual_seed(0)).shape == (2, 33)


# -- MDLM against brute force ---------------------------------------------------------------------
def _brute_force_terms(model, x, V):
    """{mask tuple: C(mask)} = sum over masked positions of -log p(x_l | z), in float64, every mask."""
    L = x.shape[0]
    masks = list(itertools.product([0, 1], repeat=L))
    mt = torch.tensor(masks, dtype=torch.bool)
    z = torch.where(mt, torch.tensor(model.mask_id), x[None].expand_as(mt))
    with torch.no_grad():
        logp = model(z.long())[..., :V].double().log_softmax(-1)                  # [masks, L, V]
    nll = -(logp.gather(-1, x[None, :, None].expand(len(masks), L, 1))[..., 0] * mt).sum(1)
    return {m: float(c) for m, c in zip(masks, nll)}


@functools.lru_cache
def _gauss_legendre(n=128):
    return np.polynomial.legendre.leggauss(n)


def _exact_continuous(terms, L, schedule):
    """Float64 Gauss-Legendre integration over t of w(t) * E_{mask ~ q_t}[C(mask)]."""
    nodes, wts = _gauss_legendre()
    t = torch.tensor(0.5 * (nodes + 1), dtype=torch.float64)
    a, w = mdlm.alpha(t, schedule), mdlm.weight(t, schedule)
    integrand = torch.zeros_like(t)
    for m, c in terms.items():
        k = sum(m)
        integrand += c * (1 - a) ** k * a ** (L - k)
    return float(0.5 * (torch.tensor(wts) * w * integrand).sum())


def _exact_discrete(terms, L, schedule, T):
    """sum_i (alpha_s - alpha_t)/(1 - alpha_t) E_{mask ~ q_t}[C(mask)], t = i/T, s = (i-1)/T, in float64."""
    i = torch.arange(1, T + 1, dtype=torch.float64)
    at, as_ = mdlm.alpha(i / T, schedule), mdlm.alpha((i - 1) / T, schedule)
    by_k = [sum(c for m, c in terms.items() if sum(m) == k) for k in range(L + 1)]
    e = sum(by_k[k] * (1 - at) ** k * at ** (L - k) for k in range(L + 1))
    return float(((as_ - at) / (1 - at) * e).sum())


@pytest.fixture(scope="module")
def mdlm_case():
    torch.manual_seed(1)
    model = GPT(GPTSpec(vocab_size=3, seq_len=4, dim=16, depth=1, heads=2, causal=False)).double().eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.5)  # a sharp, position-dependent denoiser
    x = torch.tensor([0, 2, 1, 2])
    return model, x, _brute_force_terms(model, x, 3)


def test_continuous_nelbo_is_schedule_invariant_and_any_order_closed_form(mdlm_case):
    model, x, terms = mdlm_case
    L = len(x)
    # sum_k 1/k * mean over masks of size k (the Beta integral of MDLM's weight): independent of alpha
    closed = sum(c / (sum(m) * math.comb(L, sum(m))) for m, c in terms.items() if sum(m))
    for schedule in SCHEDULES:
        assert _exact_continuous(terms, L, schedule) == pytest.approx(closed, rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_monte_carlo_nelbo_matches_brute_force(mdlm_case, schedule):
    model, x, terms = mdlm_case
    L, N = len(x), 100_000
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        est = mdlm.nelbo_estimates(model, x.repeat(N, 1), [1, 4], schedule, 3, model.mask_id, gen)
    exact = {math.inf: _exact_continuous(terms, L, schedule), 1: _exact_discrete(terms, L, schedule, 1),
             4: _exact_discrete(terms, L, schedule, 4)}
    for T, v in est.items():
        v = v.double()
        se = float(v.std()) / math.sqrt(N)
        assert abs(float(v.mean()) - exact[T]) < 4 * se + 1e-6, (T, float(v.mean()), exact[T], se)


def test_training_loss_is_an_unbiased_nelbo_estimate(mdlm_case):
    model, x, terms = mdlm_case
    cfg = load_config("text_mdlm", ["method.eps=0"])
    method = mdlm.MaskedDiffusion(cfg, {"kind": "tokens", "vocab_size": 3, "seq_len": 4})
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        losses = torch.stack([method.loss(model, {"x": x.repeat(4096, 1)}, plain_context(gen))[0] for _ in range(40)]).double()
    exact = _exact_continuous(terms, len(x), "loglinear") / len(x)
    assert abs(float(losses.mean()) - exact) < 4 * float(losses.std()) / math.sqrt(40) + 1e-6


class OracleDenoiser(torch.nn.Module):
    """The exact conditionals p(x_l | visible tokens of z) of a joint distribution over V^L (Bayes-optimal)."""

    def __init__(self, V=3, L=4, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.X = torch.tensor(list(itertools.product(range(V), repeat=L)))
        self.p = torch.distributions.Dirichlet(torch.full((V ** L,), 0.3, dtype=torch.float64)).sample() \
            if seed is None else torch.rand(V ** L, generator=g, dtype=torch.float64) ** 4
        self.p = self.p / self.p.sum()
        self.V, self.causal, self.vocab_size, self.mask_id, self.n_vocab = V, False, V, V, padded_vocab(V)

    def forward(self, z):
        vis = z != self.mask_id
        compat = ((z[:, None, :] == self.X[None]) | ~vis[:, None, :]).all(-1)       # [B, outcomes]
        w = compat * self.p[None]
        onehot = torch.nn.functional.one_hot(self.X, self.V).double()               # [outcomes, L, V]
        probs = torch.einsum("bo,olv->blv", w, onehot) / w.sum(1)[:, None, None]
        logits = torch.full((*z.shape, self.n_vocab), -1e9, dtype=torch.float64)
        logits[..., :self.V] = probs.clamp_min(1e-300).log()
        return logits


@pytest.mark.slow
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_T_step_bound_is_above_continuous_and_falls_with_T(schedule):
    # For the exact denoiser the continuous NELBO is tight for every x (any-order chain rule). A T-step
    # sampler reveals several tokens at once from a product of marginals, a different model p_T, so its
    # bound holds for -log p_T(x); averaged over x ~ p it is >= the entropy and shrinks on finer grids.
    model = OracleDenoiser()
    L, Ts = 4, (1, 2, 4, 8, 32, 128, 1024)
    cont, bounds = 0.0, np.zeros(len(Ts))
    for x, px in zip(model.X, model.p.tolist()):
        terms = _brute_force_terms(model, x, 3)
        c = _exact_continuous(terms, L, schedule)
        assert c == pytest.approx(-math.log(px), rel=1e-6)
        cont += px * c
        bounds += px * np.array([_exact_discrete(terms, L, schedule, T) for T in Ts])
    assert all(b >= cont - 1e-9 for b in bounds)
    assert all(b1 >= b2 - 1e-9 for b1, b2 in zip(bounds, bounds[1:]))
    assert bounds[0] - cont > 1e-3  # the test has teeth: one step is strictly worse
    assert bounds[-1] - cont < 1e-2 * (bounds[0] - cont)


def test_bound_error_bars_are_the_standard_error_over_sequences(tmp_path, monkeypatch):
    # 5 validation sequences x 3 passes (eval.nelbo_reps) in batches of 2: each sequence's draws are averaged, the
    # bound is the mean over sequences and its standard error std / sqrt(5); the plot's bars are that number
    import statistics
    from types import SimpleNamespace

    import matplotlib.axes
    model, L, reps, n = OracleDenoiser(), 4, 3, 5
    cfg = load_config("text_mdlm", ["eval.T_list=2,8", f"eval.nelbo_reps={reps}", f"eval.num_samples={n}", "eval.batch_size=2"])
    method = mdlm.MaskedDiffusion(cfg, {"kind": "tokens", "vocab_size": 3, "seq_len": L})
    data = SimpleNamespace(val=np.random.default_rng(0).integers(0, 3, 40))
    draws, real = [], mdlm.nelbo_estimates
    monkeypatch.setattr(mdlm, "nelbo_estimates", lambda *a, **k: draws.append(real(*a, **k)) or draws[-1])
    ctx = {"eval": cfg.eval, "device": torch.device("cpu"), "generator": torch.Generator().manual_seed(0)}
    res, gaps, n_tok = method.bounds(model, data, ctx)
    assert len(draws) == reps * 3 and n_tok == n * L
    per_pass = {T: torch.stack([torch.cat([d[T] for d in draws[3 * r:3 * r + 3]]) for r in range(reps)]).double() / L
                for T in (math.inf, 2, 8)}  # [reps, n] nats per token
    for T, v in per_pass.items():
        seq = v.mean(0).tolist()
        assert res[T][0] == pytest.approx(statistics.mean(seq), rel=1e-12)
        assert res[T][1] == pytest.approx(statistics.stdev(seq) / math.sqrt(n), rel=1e-9)
        assert res[T][1] > 0
        if T != math.inf:  # the paired gap to the continuous bound, from the same draws
            gap = (v - per_pass[math.inf]).mean(0).tolist()
            assert gaps[T][0] == pytest.approx(res[T][0] - res[math.inf][0], abs=1e-12)
            assert gaps[T][1] == pytest.approx(statistics.stdev(gap) / math.sqrt(n), rel=1e-9)
    bars, real_errorbar = [], matplotlib.axes.Axes.errorbar
    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", lambda ax, x, y, yerr=None, **k:
                        bars.append((list(x), list(y), list(yerr))) or real_errorbar(ax, x, y, yerr=yerr, **k))
    mdlm.write_bound_table(tmp_path, res, {"tokenizer": "char"}, "loglinear", gaps)
    assert bars == [([2, 8], [res[T][0] / math.log(2) for T in (2, 8)], [res[T][1] / math.log(2) for T in (2, 8)])]
    assert (tmp_path / "bound_vs_T.png").exists()
    csv = [line.split(",") for line in (tmp_path / "bound_vs_T.csv").read_text().splitlines()]
    assert csv[0] == ["T", "nelbo_bits", "stderr_bits", "ppl_bound", "gap_bits", "gap_stderr_bits"]
    assert [float(r[2]) for r in csv[1:]] == pytest.approx([res[T][1] / math.log(2) for T in (2, 8, math.inf)], abs=1e-5)
    table = (tmp_path / "bound_vs_T.md").read_text()
    assert f"| 2 | {res[2][0] / math.log(2):.4f} | {res[2][1] / math.log(2):.4f} | {gaps[2][0] / math.log(2):.4f} |" in table


class Recorder(torch.nn.Module):
    """Wraps a backbone and keeps every input it is called on."""

    def __init__(self, model):
        super().__init__()
        self.model, self.inputs = model, []
        self.causal, self.vocab_size, self.mask_id, self.n_vocab = model.causal, model.vocab_size, model.mask_id, model.n_vocab

    def forward(self, z):
        self.inputs.append(z.clone())
        return self.model(z)


def test_sampler_only_unmasks_and_skips_unchanged_steps():
    model = Recorder(tiny_gpt(False, V=5, T=8))
    M = model.mask_id
    z0 = torch.full((3, 8), M)
    z0[:, 0] = 2  # a prefix prompt token
    stats = {}
    out = mdlm.ancestral_sample(model, z0, 200, "loglinear", 5, M, torch.Generator().manual_seed(0), stats=stats)
    seq = model.inputs + [out]
    for a, b in zip(seq, seq[1:]):
        keep = a != M
        assert torch.equal(a[keep], b[keep]), "an unmasked token changed"
    assert (out != M).all() and (out < 5).all() and (out[:, 0] == 2).all()
    # one call to start plus at most one per step that revealed something (3 rows x 7 free positions)
    assert stats["model_calls"] == len(model.inputs) <= 1 + 3 * 7


def test_semi_autoregressive_blocks_fill_left_to_right():
    model = Recorder(tiny_gpt(False, V=5, T=8))
    M = model.mask_id
    out = mdlm.ancestral_sample(model, torch.full((2, 8), M), 16, "loglinear", 5, M, torch.Generator().manual_seed(0),
                                block_len=4)
    assert (out != M).all()
    for z in model.inputs:
        if (z[:, 4:] != M).any():
            assert (z[:, :4] != M).all(), "block 2 started before block 1 was done"


def test_methods_refuse_the_wrong_backbone():
    spec = {"kind": "tokens", "vocab_size": 11, "seq_len": 12}
    batch = {"x": torch.randint(0, 11, (2, 12)), "y": torch.randint(0, 11, (2, 12))}
    from genlab.families.lm.autoregressive import Autoregressive
    with pytest.raises(GenlabError, match="causal"):
        Autoregressive(load_config("text_ar"), spec).loss(tiny_gpt(False), batch, plain_context(torch.Generator()))
    with pytest.raises(GenlabError, match="bidirectional"):
        mdlm.MaskedDiffusion(load_config("text_mdlm"), spec).loss(tiny_gpt(True), batch, plain_context(torch.Generator()))


def test_embedded_corpus_is_deterministic():
    a, b = embedded_corpus(32), embedded_corpus(32)
    assert np.array_equal(a.train, b.train) and a.spec["vocab_size"] == b.spec["vocab_size"] > 40


# -- training and CLI -----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("preset", ["text_ar", "text_mdlm"])
def test_both_methods_train_with_falling_loss(tmp_path, preset):
    from genlab.runtime.metrics import read_metrics
    from genlab.training.trainer import Trainer
    cfg = lm_config(tmp_path, preset, "train.steps=80", "optim.lr=3e-3", f"train.name={preset}")
    s = Trainer(cfg).fit()
    losses = [r["loss"] for r in read_metrics(s["run_dir"]) if "loss" in r]
    assert s["status"] == "finished" and losses[-1] < 0.85 * losses[0], losses
    key = "val_loss" if preset == "text_ar" else "nelbo_bits_per_token"
    assert key in s and math.isfinite(s[key])


@pytest.mark.slow
def test_keep_best_keeps_the_lowest_validation_checkpoint(tmp_path):
    from genlab.runtime import checkpoint as ckpt
    from genlab.runtime.metrics import read_metrics
    from genlab.training.trainer import Trainer
    cfg = lm_config(tmp_path, "text_ar", "train.steps=40", "optim.lr=3e-3", "log.eval_every=10", "log.keep_best=true",
                    "log.keep_last=1", "train.name=kb")
    s = Trainer(cfg).fit()
    evals = {r["step"]: r["eval/val_loss"] for r in read_metrics(s["run_dir"]) if "eval/val_loss" in r}
    assert sorted(evals) == [10, 20, 30, 40]
    best_step = min(evals, key=evals.get)
    assert s["best_step"] == best_step and s["val_loss_best"] == pytest.approx(evals[best_step])
    state = ckpt.load_checkpoint(s["best_checkpoint"])
    assert state["step"] == best_step and state["best"]["value"] == pytest.approx(evals[best_step])
    # best.pt is neither pruned by keep_last nor taken by resume, which continues from the latest step
    assert [p.name for p in ckpt.list_checkpoints(s["run_dir"])] == ["step_00000040.pt"]
    assert ckpt.resolve_checkpoint(s["run_dir"]).name == "step_00000040.pt"
    # the best checkpoint's weights reproduce its validation loss
    from genlab.runs.load import evaluate_run
    res = evaluate_run(s["best_checkpoint"], device="cpu")
    assert res["val_loss"] == pytest.approx(evals[best_step], rel=1e-4)


@pytest.mark.slow
def test_cli_prepare_train_sample_eval(tmp_path, capfd):
    """Every command runs in-process (the CLI's main with this argv; test_cli and test_bad_inputs run real processes)."""
    src = tmp_path / "corpus.txt"
    src.write_text(("It was the best of times, it was the worst of times.\n" * 40))
    r = cli_in_process(capfd, "data", "prepare", "text", "--src", str(src), "--tokenizer", "char", "--out", str(tmp_path / "ds"))
    assert r.returncode == 0, r.stderr
    r = cli_in_process(capfd, "data", "prepare", "text", "--src", str(src), "--tokenizer", "nope", "--out", str(tmp_path / "ds2"))
    assert r.returncode == 2 and not (tmp_path / "ds2").exists()
    common = LM_TINY + [f"train.out_dir={tmp_path}", "train.steps=6", "data.name=tokens", f"data.path={tmp_path / 'ds'}"]
    r = cli_in_process(capfd, "train", "text_ar", *common, "train.name=ar")
    assert r.returncode == 0, r.stderr
    assert "val_loss" in r.stdout and (tmp_path / "ar" / "samples.txt").exists()
    r = cli_in_process(capfd, "sample", str(tmp_path / "ar"), "--n", "2", "--prompt", "It was", "--temperature", "0.5",
                       "--top-k", "5", "--out", str(tmp_path / "s.txt"))
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "s.txt").read_text()
    assert text.count("===== sample") == 2 and "\nIt was" in text
    r = cli_in_process(capfd, "train", "text_mdlm", *common, "train.name=md")
    assert r.returncode == 0, r.stderr
    r = cli_in_process(capfd, "eval", str(tmp_path / "md"), "eval.T_list=4,16", f"eval.gen_ppl_model={tmp_path / 'ar'}", "eval.gen_samples=2")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["nelbo_T4_bits_per_token"] > 0 and res["gen_ppl"] > 1
    table = (tmp_path / "md" / "bound_vs_T.md").read_text()
    assert "| 4 |" in table and "| 16 |" in table and "| inf |" in table
    r = cli_in_process(capfd, "sample", str(tmp_path / "md"), "--n", "1", "--steps", "8", "--prompt", "It [[5]] the", "--out", str(tmp_path / "m.txt"))
    assert r.returncode == 0, r.stderr
    body = (tmp_path / "m.txt").read_text().split("=====\n", 1)[1]
    assert body.startswith("It ") and body[8:12] == " the"


def test_cli_prepare_tiny_shakespeare(tmp_path, shared_data, capfd):
    src = shared_data / "text" / "tinyshakespeare.txt"
    if not src.exists():
        pytest.skip("Tiny Shakespeare not present")
    r = cli_in_process(capfd, "data", "prepare", "text", "--src", str(src), "--tokenizer", "char", "--out", str(tmp_path / "sc"))
    assert r.returncode == 0, r.stderr
    meta = json.loads((tmp_path / "sc" / "meta.json").read_text())
    assert meta["vocab_size"] == 65 and meta["train_tokens"] == 1003854 and meta["val_tokens"] == 111540  # as nanoGPT
