"""`genlab analyze`: linear CKA against its float64 HSIC definition, identity block skipping, the cached-block
sampler, and the command on a tiny trained run (files written, bad inputs refused in one line)."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import ANALYZE_BACKBONES as BACKBONES
from conftest import TINY, cli_in_process
from conftest import analyze_model as _model
from conftest import analyze_sample as _sample

from genlab.lab.analyze.cka import centred, cka_matrix, layer_similarity
from genlab.sampling.block_cache import cached_blocks
from genlab.sampling.skip import skip_blocks, skip_plans

def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """The pairwise reference of cka_matrix: CKA of [n, d1] and [n, d2] feature matrices, in float64 (a bf16 run's features are widened first)."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"CKA needs the same rows on both sides, got {x.shape[0]} and {y.shape[0]}")
    x, y = centred(x), centred(y)
    cross = (y.T @ x).square().sum()
    norm = torch.linalg.matrix_norm(x.T @ x) * torch.linalg.matrix_norm(y.T @ y)
    return float(cross / norm) if float(norm) > 0 else float("nan")  # a constant representation has no CKA


def hsic_cka(x, y):
    """The definition (Kornblith et al. 2019, eq. 1-3): HSIC of the n x n linear kernels, centred by H."""
    x, y = x.double(), y.double()
    n = x.shape[0]
    H = torch.eye(n, dtype=torch.float64) - 1.0 / n
    K, L = x @ x.T, y @ y.T

    def hsic(a, b):
        return torch.trace(a @ H @ b @ H) / (n - 1) ** 2
    return float(hsic(K, L) / torch.sqrt(hsic(K, K) * hsic(L, L)))


def _feats(seed, n=60, d=(12, 20)):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d[0], generator=g)
    y = x @ torch.randn(d[0], d[1], generator=g) * 0.3 + torch.randn(n, d[1], generator=g)  # related, not equal
    return x, y


def test_cka_of_a_representation_with_itself_is_one():
    x, _ = _feats(0)
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    assert torch.allclose(torch.diagonal(cka_matrix([x, x * 2, x[:, :5]])), torch.ones(3, dtype=torch.float64))


def test_cka_is_invariant_to_orthogonal_transforms_and_isotropic_scaling():
    x, y = _feats(1)
    q, _ = torch.linalg.qr(torch.randn(20, 20, generator=torch.Generator().manual_seed(2), dtype=torch.float64))
    base = linear_cka(x, y)
    assert linear_cka(x, y.double() @ q) == pytest.approx(base, rel=1e-10)
    assert linear_cka(3.7 * x.double(), 0.01 * y.double()) == pytest.approx(base, rel=1e-10)  # float64: exact scaling
    assert 0.05 < base < 0.95  # a case where invariance is informative


@pytest.mark.parametrize("seed", [3, 4])
def test_cka_matches_the_hsic_reference_in_float64(seed):
    x, y = _feats(seed)
    ref = hsic_cka(x, y)
    assert linear_cka(x, y) == pytest.approx(ref, rel=1e-10)
    # float32 inputs: the only error is the inputs' rounding, widened to float64 inside
    assert cka_matrix([x, y])[0, 1].item() == pytest.approx(ref, rel=1e-10)


@pytest.mark.parametrize("name", BACKBONES)
def test_skipping_no_block_reproduces_the_samples_bit_for_bit(name):
    model, method = _model(name)
    before = _sample(method, model)
    with skip_blocks(model, []):
        none = _sample(method, model)
    with skip_blocks(model, [1, 2]):
        _sample(method, model)
    after = _sample(method, model)  # leaving the context restores the blocks
    assert torch.equal(none, before) and torch.equal(after, before)


@pytest.mark.parametrize("name", BACKBONES)
def test_skipping_a_block_changes_the_samples_and_passes_its_inputs_through(name):
    model, method = _model(name)
    before = _sample(method, model)
    seen = []
    h = model.blocks[2].register_forward_hook(lambda m, args, out: seen.append((args, out)))
    with skip_blocks(model, [2]):
        skipped = _sample(method, model)
    h.remove()
    assert not torch.allclose(skipped, before, atol=1e-3)
    args, out = seen[0]
    outs = out if isinstance(out, tuple) else (out,)
    assert all(o is a for o, a in zip(outs, args))  # identity: the very input tensors, every stream


def test_skip_plans_cover_each_block_and_centred_middle_runs():
    plans = dict(skip_plans(12))
    assert plans["none"] == () and all(plans[f"block {i}"] == (i,) for i in range(12))
    assert plans["blocks 5-6"] == (5, 6) and plans["blocks 3-8"] == tuple(range(3, 9)) and len(plans) == 1 + 12 + 5


@pytest.mark.parametrize("name", BACKBONES)
def test_cached_blocks_recompute_every_other_evaluation_and_reuse_the_residual(name):
    model, _ = _model(name)
    x, t, y = torch.randn(3, 1, 8, 8), torch.full((3,), 0.4), torch.tensor([0, 1, 2])
    with torch.no_grad():
        ref = model(x, t, y)
        with cached_blocks(model, [1, 2], every=2) as counts:
            outs = [model(x, t, y) for _ in range(5)]
    assert counts == {"call": 4, "computed": 2 * 3, "reused": 2 * 2}
    # same input every call: h + (block(h) - h) is block(h) up to one rounding per add
    for o in outs:
        torch.testing.assert_close(o, ref, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        assert torch.equal(model(x, t, y), ref)  # restored


def _plan_drift(at, plan, evaluations, depth):
    """Naive reference: the plan's total drift, each reused (k, i) costing the sum of block i's changes since its last
    computed evaluation, through k."""
    total = 0.0
    for i in range(depth):
        since = 0.0
        for k in range(1, evaluations):
            if i in plan.get(k, ()):
                since += at[(k, i)]
                total += since
            else:
                since = 0.0
    return total


def _naive_greedy(at, n, evaluations, depth):
    """The schedule's greedy, by brute force: each time the pair whose addition raises the plan's total drift least
    (ties: the lower evaluation, then the lower block)."""
    plan: dict[int, set[int]] = {}
    for _ in range(n):
        base = _plan_drift(at, plan, evaluations, depth)
        best = None
        for k in range(1, evaluations):
            for i in range(depth):
                if i in plan.get(k, ()):
                    continue
                trial = {kk: set(v) for kk, v in plan.items()}
                trial.setdefault(k, set()).add(i)
                key = (_plan_drift(at, trial, evaluations, depth) - base, k, i)
                best = key if best is None or key < best else best
        plan.setdefault(best[1], set()).add(best[2])
    return {k: frozenset(v) for k, v in sorted(plan.items())}


def test_block_change_is_recorded_per_evaluation_and_the_schedule_follows_the_measured_changes():
    from genlab.sampling.block_cache import block_change, step_schedule
    model, method = _model("dit")
    with block_change(model) as ch:
        _sample(method, model)  # Heun, 3 steps: 6 network evaluations
    assert ch.evaluations == 6 and set(ch.at) == {(k, i) for k in range(1, 6) for i in range(4)}
    for i in range(4):  # the mean is the per-evaluation changes' mean
        assert ch[i] == pytest.approx(sum(ch.at[(k, i)] for k in range(1, 6)) / 5)
    plan = step_schedule(ch, 0.25, depth=4)  # a quarter of 6 x 4 block evaluations: 6 pairs
    pairs = {(k, i) for k, v in plan.items() for i in v}
    assert len(pairs) == 6 and 0 not in plan
    assert plan == _naive_greedy(ch.at, 6, 6, 4)


@pytest.mark.parametrize("name", BACKBONES)
def test_the_output_probe_measures_one_reuse_as_the_cache_makes_it(name):
    """output_at[(k, i)] against the cache itself: the model at evaluation k - 1's inputs, then at evaluation k's with
    block i reusing (a 2-evaluation schedule), compared with the plain output at k. The probe changes neither the
    samples nor the block-level record."""
    from genlab.sampling.block_cache import block_change
    model, method = _model(name)
    inputs = []
    h = model.register_forward_pre_hook(lambda m, a, kw: inputs.append((a, kw)), with_kwargs=True)
    with block_change(model) as plain_ch:
        want = _sample(method, model)
    h.remove()
    with block_change(model, output_probe=True) as ch:
        got = _sample(method, model)
    assert torch.equal(got, want) and ch.evaluations == 6 and ch.at == plain_ch.at
    assert set(ch.output_at) == {(k, i) for k in range(1, 6) for i in range(4)}
    with torch.no_grad():
        for k, i in [(1, 0), (2, 3), (5, 1), (4, 2)]:
            ref = model(*inputs[k][0], **inputs[k][1])
            with cached_blocks(model, [], schedule={1: frozenset({i})}, period=2):
                model(*inputs[k - 1][0], **inputs[k - 1][1])
                reused = model(*inputs[k][0], **inputs[k][1])
            expect = float((reused - ref).norm() / ref.norm())
            assert expect > 0 and ch.output_at[(k, i)] == pytest.approx(expect, rel=1e-4, abs=1e-7)
    view = ch.at_output()
    assert view.at == ch.output_at and view.evaluations == 6


@pytest.mark.parametrize("seed", range(5))
def test_the_schedule_is_the_greedy_on_total_drift_by_brute_force(seed):
    """Integer changes, so that the fast path's running sums and the reference's are exact and ties break alike."""
    from genlab.sampling.block_cache import BlockChange, step_schedule
    g = torch.Generator().manual_seed(seed)
    evaluations, depth = 7, 3
    ch = BlockChange()
    ch.evaluations = evaluations
    ch.at = {(k, i): float(torch.randint(1, 50, (), generator=g)) for k in range(1, evaluations) for i in range(depth)}
    for share in (0.1, 0.3, 0.6):
        n = int(round(share * evaluations * depth))
        assert step_schedule(ch, share, depth) == _naive_greedy(ch.at, n, evaluations, depth)


def test_a_block_that_barely_changes_is_not_reused_at_every_evaluation():
    """Block 0 changes least at every step; picking by single-step change alone would reuse it at evaluations 1-3, its
    residual from evaluation 0 ever staler (drift 1 + 2 + 3). The schedule spreads its reuses between computes."""
    from genlab.sampling.block_cache import BlockChange, step_schedule
    ch = BlockChange()
    ch.evaluations = 7
    ch.at = {(k, i): (1.0 if i == 0 else 10.0) for k in range(1, 7) for i in range(2)}
    plan = step_schedule(ch, 3 / 14, depth=2)
    assert plan == {1: frozenset({0}), 3: frozenset({0}), 5: frozenset({0})}
    assert _plan_drift(ch.at, plan, 7, 2) == 3.0


@pytest.mark.parametrize("name", BACKBONES)
def test_a_schedule_of_every_other_evaluation_is_the_fixed_cache(name):
    """The step-aware path against the fixed one: blocks 1, 2 reusing at the odd evaluations of each 6-evaluation
    pass is `every=2`, over two passes in one context (the evaluation index wraps per pass)."""
    model, method = _model(name)
    with cached_blocks(model, [1, 2], every=2) as fixed_counts:
        want = [_sample(method, model), _sample(method, model)]
    plan = {k: frozenset({1, 2}) for k in (1, 3, 5)}
    with cached_blocks(model, [], schedule=plan, period=6) as counts:
        got = [_sample(method, model), _sample(method, model)]
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert counts["reused"] == fixed_counts["reused"] == 2 * 3 * 2 and counts["computed"] == 2 * 3 * 2


def test_a_schedule_reuses_exactly_its_pairs(monkeypatch):
    """Which (evaluation, block) pairs computed, seen from the block class's own forward (what the cache calls)."""
    model, method = _model("dit")
    computed, call = [], [-1]
    block_cls = type(model.blocks[0])
    plain = block_cls.forward

    def counting(self, *a, **k):
        computed.append((call[0], [i for i, b in enumerate(model.blocks) if b is self][0]))
        return plain(self, *a, **k)
    monkeypatch.setattr(block_cls, "forward", counting)
    h = model.register_forward_pre_hook(lambda *_: call.__setitem__(0, call[0] + 1))
    with cached_blocks(model, [], schedule={2: frozenset({3}), 4: frozenset({0, 3})}, period=6) as counts:
        _sample(method, model)
    h.remove()
    everything = {(k, i) for k in range(6) for i in range(4)}
    assert set(computed) == everything - {(2, 3), (4, 0), (4, 3)} and len(computed) == len(set(computed))
    assert counts == {"call": 5, "reused": 3, "computed": 2 * 6 - 3}  # the wrapped blocks 0 and 3


@pytest.mark.parametrize("name", BACKBONES)
def test_layer_similarity_has_ones_on_the_diagonal_per_t(name):
    model, method = _model(name)
    images = torch.rand(5, 1, 8, 8) * 2 - 1
    sims = layer_similarity(method, model, images, torch.arange(5) % 4, [0.1, 0.9], torch.Generator().manual_seed(0))
    assert set(sims) == {0.1, 0.9}
    for m in sims.values():
        assert m.shape == (4, 4) and torch.allclose(torch.diagonal(m), torch.ones(4, dtype=torch.float64))
        assert torch.equal(m, m.T) and bool(((m > 0) & (m <= 1 + 1e-9)).all())


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from genlab.config.tree import load_config
    from genlab.training.trainer import Trainer
    out = tmp_path_factory.mktemp("analyze_run")
    Trainer(load_config("digits_flow", TINY + ["model.depth=4", "train.steps=8", f"train.out_dir={out}", "train.name=r",
                                               "eval.num_samples=0", "log.sample_every=0", "log.ckpt_every=0"])).fit()
    return out / "r"


def test_analyze_writes_heat_maps_skip_table_and_cache_result(tiny_run, tmp_path, capfd):
    out = tmp_path / "an"
    r = cli_in_process(capfd, "analyze", tiny_run, "eval.num_samples=12", "eval.sample_steps=2", "--batch", "8",
                       "--t", "0.2,0.8", "--out", out, "--cache-fd-tol", "1e9")
    assert r.returncode == 0, r.stderr
    assert {p.name for p in out.iterdir()} == {"cka_t0.2.png", "cka_t0.8.png", "skip.png", "analysis.md", "analysis.json"}
    res = json.loads((out / "analysis.json").read_text())
    assert [row["skipped"] for row in res["skip"]] == [name for name, _ in skip_plans(4)]
    assert res["skip"][0]["pixel_diff"] == 0 and res["skip"][0]["fd_ratio"] == 1
    assert set(res["cka"]["by_t"]) == {"0.2", "0.8"}
    c = res["cache"]  # auto: searched in order of least change; every block passes a tolerance of 1e9
    order = sorted(range(4), key=lambda i: (c["change"][str(i)], i))
    assert [t["block"] for t in c["search"]["trail"]] == order and all(t["kept"] for t in c["search"]["trail"])
    assert [t["blocks"] for t in c["search"]["trail"]] == [sorted(order[:k + 1]) for k in range(4)]
    assert c["blocks"] == [0, 1, 2, 3] and c["fd_ratio"] == c["search"]["trail"][-1]["fd_ratio"]  # same blocks, same noise
    sc = res["cache"]["scheduled"]  # the step-aware schedule at the fixed cache's share of reused block evaluations
    assert sc["evaluations"] == 4 and abs(sc["block_evals_saved"] - res["cache"]["block_evals_saved"]) <= 1 / (4 * 4)
    assert all(int(k) >= 1 for k in sc["reuse"]) and sc["fd_ratio"] > 0
    md = (out / "analysis.md").read_text()
    assert res["complete"] is True and "Partial" not in md
    hint = f"genlab sample RUN method.cache_blocks={','.join(map(str, res['cache']['blocks']))} method.cache_every=2"
    for s in ("## Layer similarity", "| 0.2 |", "| blocks 1-2 |", "## Cached-block sampler", "cka_t0.8.png", hint,
              "| step-aware schedule, same share |"):
        assert s in md, s


def test_search_keeps_a_block_only_while_the_cached_fd_stays_within_the_tolerance():
    """The walk is in order of least change; a block over the tolerance is left out and a later one may still join."""
    from genlab.sampling.block_cache import search_cacheable
    change = {0: 0.3, 1: 0.1, 2: 0.2, 3: 0.05}
    cost = {3: 0.02, 1: 0.5, 2: 0.03, 0: 0.04}  # each block's share of FD added when cached
    seen = []

    def score(blocks):
        seen.append(blocks)
        return {"fd_ratio": 1 + sum(cost[b] for b in blocks), "sample_accuracy": 0.9}
    kept, trail = search_cacheable(change, 1.1, score)
    assert seen == [[3], [1, 3], [2, 3], [0, 2, 3]] and kept == [0, 2, 3]
    assert [t["kept"] for t in trail] == [True, False, True, True] and trail[1]["fd_ratio"] == pytest.approx(1.52)
    assert search_cacheable(change, 1.0, score)[0] == []


def test_half_picks_the_half_that_changes_least_without_a_search(tiny_run, tmp_path, capfd):
    out = tmp_path / "half"
    r = cli_in_process(capfd, "analyze", tiny_run, "eval.num_samples=12", "eval.sample_steps=2", "--what", "cache",
                       "--cache-blocks", "half", "--out", out)
    assert r.returncode == 0, r.stderr
    c = json.loads((out / "analysis.json").read_text())["cache"]
    assert "search" not in c and c["blocks"] == sorted(sorted(range(4), key=lambda i: (c["change"][str(i)], i))[:2])


def test_a_search_that_keeps_no_block_says_so_and_auto_sampling_refuses(tiny_run, tmp_path, capfd, monkeypatch):
    from genlab.lab.analyze import run as analyze
    from genlab.lab.analyze.compare import compare
    from genlab.lab.analyze.run import analyze_run
    real = analyze.search_cacheable
    monkeypatch.setattr(analyze, "search_cacheable", lambda change, tol, score: real(change, tol, lambda b: {
        **score(b), "fd_ratio": 2.0}))  # every block doubles FD
    run = tmp_path / "copy"
    import shutil
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("analysis", ".lock"))
    analyze_run(run, what="cache", device="cpu", overrides=["eval.num_samples=12", "eval.sample_steps=2"])
    res = json.loads((run / "analysis" / "analysis.json").read_text())
    assert res["cache"]["blocks"] == [] and [t["kept"] for t in res["cache"]["search"]["trail"]] == [False] * 4
    assert "No block can be cached within the tolerance" in (run / "analysis" / "analysis.md").read_text()
    assert compare([str(run), str(run)], tmp_path / "cmp")["markdown"]  # a cache without rows is read, not a KeyError
    out = tmp_path / "s.png"
    r = cli_in_process(capfd, "sample", run, "method.cache_blocks=auto", "--out", out)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "found no block" in r.stderr, r.stderr
    assert not out.exists()


def test_an_analysis_stopped_midway_keeps_its_finished_parts(tiny_run, tmp_path, monkeypatch):
    """A time limit that stops the skip phase leaves analysis.json/md with the CKA, the reference and the rows done."""
    from genlab.lab.analyze import run as analyze_mod
    real, calls = analyze_mod.Sampler.score, []

    def score_then_stop(self, desc):
        calls.append(desc)
        if len(calls) == 4:  # unskipped, then two skipped blocks, then the stop
            raise KeyboardInterrupt
        return real(self, desc)

    monkeypatch.setattr(analyze_mod.Sampler, "score", score_then_stop)
    out = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        analyze_mod.analyze_run(tiny_run, what="cka,skip", batch=8, t="0.5", device="cpu", out=out,
                                overrides=["eval.num_samples=12", "eval.sample_steps=2"])
    res = json.loads((out / "analysis.json").read_text())
    assert res["complete"] is False and set(res["cka"]["by_t"]) == {"0.5"} and "feature_fd" in res["reference"]
    assert [r["skipped"] for r in res["skip"]] == [name for name, _ in skip_plans(4)][:3]
    md = (out / "analysis.md").read_text()
    assert "**Partial:**" in md and "## Layer skipping" in md and "skip.png" not in md
    assert sorted(p.name for p in out.iterdir()) == ["analysis.json", "analysis.md", "cka_t0.5.png"]


def test_analyze_defaults_to_the_runs_analysis_folder(tiny_run, capfd):
    r = cli_in_process(capfd, "analyze", tiny_run, "--what", "cka", "--batch", "4", "--t", "0.5")
    assert r.returncode == 0, r.stderr
    assert (tiny_run / "analysis" / "cka_t0.5.png").exists() and "skip" not in (tiny_run / "analysis" / "analysis.md").read_text().lower()


@pytest.mark.parametrize("args,expect", [
    (["--what", "cka,speed"], "--what must be a comma-separated subset of cka,skip,cache"),
    (["--batch", "1"], "--batch must be >= 2"),
    (["--t", "0.5,1.5"], "--t must be comma-separated noise levels in [0, 1]"),
    (["--t", "mid"], "--t must be comma-separated noise levels in [0, 1]"),
    (["--cache-every", "1"], "--cache-every must be >= 2"),
    (["--cache-blocks", "two"], "--cache-blocks must be 'auto', 'half' or comma-separated block indices"),
    (["--cache-fd-tol", "0.9"], "--cache-fd-tol must be >= 1"),
    (["--cache-fd-tol", "nan"], "--cache-fd-tol must be >= 1"),
    (["--cache-blocks", "1,9"], "--cache-blocks 9 out of range; this model has blocks 0..3"),
    (["--device", "tpu"], "--device"),
    (["eval.num_samples=1"], "eval.num_samples"),
    (["model.depth=2"], "override 'model.depth=2' is not allowed here"),
])
def test_bad_analyze_inputs_are_one_line_and_write_nothing(tiny_run, tmp_path, capfd, args, expect):
    out = tmp_path / "bad"
    r = cli_in_process(capfd, "analyze", tiny_run, "--out", out, *args)
    assert r.returncode == 2 and expect in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not out.exists()


def test_analyze_of_a_missing_run_is_one_line(tmp_path, capfd):
    r = cli_in_process(capfd, "analyze", tmp_path / "nope")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "nope" in r.stderr, r.stderr


# -- genlab analyze compare -------------------------------------------------------------------------------------------
def _fake_analysis(folder, depth, ratios, seed, scheduled=None):
    """An analysis.json as `genlab analyze` writes it: a random symmetric CKA map per t, skip rows with given ratios."""
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(depth, depth, generator=g, dtype=torch.float64)
    m = (m + m.T) / 2
    m.fill_diagonal_(1.0)
    blocks = [[i] for i in range(depth)] + [[depth // 2 - 1, depth // 2], [depth // 2 - 2, depth // 2 - 1, depth // 2]]
    skip = [{"skipped": "none", "blocks": [], "fd_ratio": 1.0, "feature_fd": 2.0, "sample_accuracy": 1.0}]
    skip += [{"skipped": f"b{b}", "blocks": b, "fd_ratio": r, "feature_fd": 2.0 * r, "sample_accuracy": 0.9}
             for b, r in zip(blocks, ratios)]
    res = {"run": str(folder), "depth": depth, "model": "dit", "cka": {"by_t": {"0.5": m.tolist(), "0.9": m.tolist()}},
           "reference": {"feature_fd": 2.0}, "skip": skip, "cache": {"fd_ratio": 1.3}}
    if scheduled is not None:
        res["cache"]["scheduled"] = {"fd_ratio": scheduled}
    (folder / "analysis").mkdir(parents=True)
    (folder / "analysis" / "analysis.json").write_text(json.dumps(res))
    return m


def test_compare_summarises_each_analysis_against_a_direct_computation(tmp_path, capfd):
    m4 = _fake_analysis(tmp_path / "d4", 4, [3.0, 1.2, 1.4, 2.0, 1.45, 9.0], seed=0)
    _fake_analysis(tmp_path / "d6", 6, [1.1, 1.0, 1.6, 1.2, 1.3, 1.4, 2.5, 1.2], seed=1, scheduled=1.02)
    r = cli_in_process(capfd, "analyze", "compare", tmp_path / "d4", tmp_path / "d6" / "analysis", "--out", tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert {p.name for p in (tmp_path / "c").iterdir()} == {"compare.md", "compare.json", "compare_cka_t0.5.png",
                                                            "compare_cka_t0.9.png"}
    s4, s6 = json.loads((tmp_path / "c" / "compare.json").read_text())["summaries"]
    off = m4[~torch.eye(4, dtype=torch.bool)]
    assert s4["cka"]["0.5"]["adjacent"] == pytest.approx(float((m4[0, 1] + m4[1, 2] + m4[2, 3]) / 3), rel=1e-12)
    assert s4["cka"]["0.5"]["all_pairs"] == pytest.approx(float(off.mean()), rel=1e-12)
    assert s4["cka"]["0.5"]["first_last"] == pytest.approx(float(m4[0, 3]), rel=1e-12)
    # depth 4: single ratios 3.0, 1.2, 1.4, 2.0 (two within 1.5x); pair 1.45 (within); triple 9.0 (not)
    assert (s4["skip"]["single_min"], s4["skip"]["single_max"], s4["skip"]["single_within"]) == (1.2, 3.0, 2)
    assert (s4["skip"]["pair_ratio"], s4["skip"]["longest_within"]) == (1.45, 2)
    # depth 6: the triple (1.2) is within 1.5x, so the longest tolerated run has 3 blocks
    assert (s6["skip"]["single_within"], s6["skip"]["longest_within"]) == (5, 3)
    md = (tmp_path / "c" / "compare.md").read_text()
    assert "| d4 | 4 |" in md and "2 of 4" in md and "5 of 6" in md and "1.45 (b[1, 2])" in md
    assert "cache_scheduled_fd_ratio" not in s4 and s6["cache_scheduled_fd_ratio"] == 1.02  # an older analysis: "-"
    assert md.count("| 1.3 | - |") == 1 and md.count("| 1.3 | 1.02 |") == 1


@pytest.mark.parametrize("runs,expect", [(["a"], "needs two or more runs"), (["a", "missing"], "has no analysis.json")])
def test_bad_compare_inputs_are_one_line_and_write_nothing(tmp_path, capfd, runs, expect):
    _fake_analysis(tmp_path / "a", 4, [1.0] * 6, seed=0)
    r = cli_in_process(capfd, "analyze", "compare", *[tmp_path / x for x in runs], "--out", tmp_path / "c")
    assert r.returncode == 2 and expect in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "c").exists()
