"""Trivial baselines (families/baselines.py, Method.trivial_baselines) against references computed independently:
entropies by counting in Python, the mean predictors by brute force with the methods' own losses."""
import importlib
import math
import pkgutil
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import genlab.families
from genlab.config.tree import load_config
from genlab.data.formats import ImageData
from genlab.families import baselines as bl
from conftest import plain_context
from genlab.families.base import Method
from genlab.families.image_flow.flow import FlowMatching
from genlab.families.lm import mdlm


def counted_entropy(items) -> float:
    c = Counter(items)
    n = sum(c.values())
    return -sum(k / n * math.log(k / n) for k in c.values())


def markov_tokens(n=20000, V=7, seed=0) -> np.ndarray:
    """Tokens with a skewed unigram and a strong dependence on the previous token."""
    rng = np.random.default_rng(seed)
    trans = rng.dirichlet(np.full(V, 0.3), size=V)
    out = [0]
    for _ in range(n - 1):
        out.append(rng.choice(V, p=trans[out[-1]]))
    return np.array(out, dtype=np.uint16)


def test_token_entropies_equal_counting():
    t = markov_tokens()
    assert bl.unigram_entropy(t) == pytest.approx(counted_entropy(t.tolist()), abs=1e-12)


def test_a_large_corpus_is_counted_in_chunks(monkeypatch):
    monkeypatch.setattr(bl, "MAX_TOKENS", 4096)
    monkeypatch.setattr(bl, "TOKEN_CHUNK", 512)
    t = markov_tokens()
    starts = np.linspace(0, len(t) - 512, 8).astype(np.int64)
    chunks = [t[s:s + 512].tolist() for s in starts]
    assert bl.unigram_entropy(t) == pytest.approx(counted_entropy([v for c in chunks for v in c]), abs=1e-12)


def test_position_byte_entropy_equals_counting():
    rng = np.random.default_rng(1)
    u8 = rng.integers(0, 4, (300, 3, 3, 2)).astype(np.uint8) * rng.integers(1, 60, (1, 3, 3, 2)).astype(np.uint8)
    flat = u8.reshape(300, -1)
    want = np.mean([counted_entropy(flat[:, j].tolist()) for j in range(flat.shape[1])])
    assert bl.position_byte_entropy(u8) == pytest.approx(want, abs=1e-12)


def test_mean_image_l1_and_variance_equal_brute_force():
    x = np.random.default_rng(2).normal(size=(50, 2, 3, 3))
    mean = x.sum(0) / 50
    assert bl.mean_image_l1(x) == pytest.approx(float(np.mean([np.abs(xi - mean).mean() for xi in x])), rel=1e-12)
    assert bl.mean_element_variance(x) == pytest.approx(float(np.mean([((xi - mean) ** 2).mean() for xi in x])), rel=1e-12)


class ConstantVelocity(torch.nn.Module):
    """A model that cannot see its input: the same velocity for every x_t, t and label."""
    null_class = 3

    def __init__(self, c):
        super().__init__()
        self.c = c

    def forward(self, x_t, t, y):
        return self.c.expand_as(x_t)


@pytest.mark.parametrize("weighting", ["none", "min_snr"])
def test_flow_mean_predictor_equals_the_loss_of_a_constant_model(weighting):
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (24, 4, 4, 1)).astype(np.uint8)
    data = ImageData(images=images, labels=np.arange(24) % 3, classes=["a", "b", "c"])
    cfg = load_config("digits_flow", [f"method.loss_weighting={weighting}"])
    method = FlowMatching(cfg, {**data.spec, "batch_keys": ("image", "label")})
    x = torch.from_numpy(images).permute(0, 3, 1, 2).double() / 127.5 - 1
    model = ConstantVelocity(x.mean(0, keepdim=True).float())  # the best constant: E[data] - E[noise]
    g, losses = torch.Generator().manual_seed(0), []
    for _ in range(200):
        batch = {"image": x.float().repeat(20, 1, 1, 1), "label": torch.arange(480) % 3}
        losses.append(method.loss(model, batch, plain_context(g))[0].item())
    want = method.mean_velocity_loss(data, torch.Generator().manual_seed(1))
    assert np.mean(losses) == pytest.approx(want, rel=0.02)
    assert method.trivial_baselines(data, torch.Generator())[0].metric == "loss"


class UnigramLM(torch.nn.Module):
    """A context-blind masked-token predictor: the training tokens' frequencies at every position."""

    def __init__(self, tokens, V):
        super().__init__()
        self.logp = torch.from_numpy(np.log(np.bincount(tokens, minlength=V) / len(tokens))).float()

    def forward(self, z, targets, weights, vocab):
        ce = F.cross_entropy(self.logp.expand(*z.shape, -1).reshape(-1, vocab), targets.reshape(-1), reduction="none")
        return (weights.reshape(-1) * ce).sum()


@pytest.mark.parametrize("schedule", ["loglinear", "cosine"])
def test_mdlm_nelbo_of_a_context_blind_predictor_is_the_unigram_entropy(schedule):
    tokens = markov_tokens(4096, V=7).astype(np.int64)
    cfg = load_config("text_mdlm", [f"method.noise_schedule={schedule}"])
    spec = {"kind": "tokens", "vocab_size": 7, "seq_len": 64}
    method = mdlm.MaskedDiffusion(cfg, spec)
    method.mask_id, method._checked = 7, True
    x = torch.from_numpy(tokens[:4096].reshape(64, 64))
    g = torch.Generator().manual_seed(0)
    model = UnigramLM(tokens, 7)
    losses = [method.loss(model, {"x": x}, plain_context(g))[0].item() for _ in range(100)]
    data = type("Tokens", (), {"train": tokens})()
    (loss_b, eval_b) = method.trivial_baselines(data, g)
    assert loss_b.value == pytest.approx(counted_entropy(tokens.tolist()), abs=1e-12)
    assert (loss_b.metric, eval_b.metric) == ("loss", "nelbo_loss")
    assert np.mean(losses) == pytest.approx(loss_b.value, rel=0.02)


def family_methods():
    """Every Method subclass defined under genlab/families (all its modules imported)."""
    for m in pkgutil.walk_packages(genlab.families.__path__, "genlab.families."):
        importlib.import_module(m.name)
    seen, todo = [], list(Method.__subclasses__())
    while todo:
        c = todo.pop()
        todo += c.__subclasses__()
        if c.__module__.startswith("genlab.families.") and c not in seen:
            seen.append(c)
    return seen


def test_every_method_states_its_baselines_or_says_why_not():
    methods = family_methods()
    assert len(methods) >= 18  # the 17 registered methods and FewStepFlow
    silent = [c.__name__ for c in methods if c.trivial_baselines is Method.trivial_baselines]
    assert silent == [], f"{silent} inherit Method's empty list: state the baselines, or return [] with a comment why"
