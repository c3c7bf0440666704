"""A cached-block sampler in the spirit of Learning-to-Cache (Ma et al. 2024, arXiv:2406.01733), without a learned
router: a safe block computes its residual r = block(h) - h on one network evaluation and reuses h + r on the next
`every - 1`. Safe blocks change least between evaluations (`block_change`) and keep FD within a tolerance
(`search_cacheable`), or the user lists them; `step_schedule` picks (evaluation, block) pairs, as L2C's per-timestep
router does, read off one measured pass.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager

import torch

from genlab.core.errors import GenlabError
from genlab.sampling.skip import streams_of


def _streams(out):
    return out if isinstance(out, tuple) else (out,)


@contextmanager
def _removing(handles):
    """The hooks of `handles` stay registered inside the context only."""
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _on_calls(model, fn):
    """fn() before every forward of the whole model (one network evaluation of the sampler)."""
    return _removing([model.register_forward_pre_hook(lambda *_: fn())])


class BlockChange(dict):
    """{block: mean relative change of its residual between consecutive evaluations}; `at[(k, block)]` the change from
    evaluation k - 1 to k of the pass (`evaluations` per pass); with the output probe, `output_at[(k, block)]` the
    relative change of the model's output at k when that block alone reuses its residual from k - 1."""

    def __init__(self):
        super().__init__()
        self.at: dict[tuple[int, int], float] = {}
        self.output_at: dict[tuple[int, int], float] = {}
        self.evaluations = 0

    def at_output(self) -> "BlockChange":
        """The same pass with the output-level changes as `at` (for step_schedule)."""
        view = BlockChange()
        view.at, view.evaluations = dict(self.output_at), self.evaluations
        return view


@contextmanager
def block_change(model, output_probe: bool = False):
    """Yields a BlockChange, ||r_k - r_(k-1)|| / ||r_(k-1)|| per block, filled while the model samples one pass inside
    the context. `output_probe`: after each evaluation the model runs once more per block with that block reusing
    its previous residual (what one reuse costs after the later blocks; `depth` extra forwards per evaluation)."""
    prev: dict[int, tuple] = {}
    last: dict[int, tuple] = {}  # the residuals of the previous evaluation, for the probe
    sums: dict[int, list[float]] = {}
    change = BlockChange()
    probing = [False]

    def tick():
        if not probing[0]:
            change.evaluations += 1
            last.clear()
            last.update(prev)

    def hook(i):
        def record(mod, args, out):
            if probing[0]:
                return
            r = tuple((o - a).float() for o, a in zip(_streams(out), args[:streams_of(mod)]))
            if i in prev and prev[i][0].shape == r[0].shape:
                num = sum(float((a - b).norm()) ** 2 for a, b in zip(r, prev[i])) ** 0.5
                den = sum(float(b.norm()) ** 2 for b in prev[i]) ** 0.5
                s = sums.setdefault(i, [0.0, 0])
                s[0] += num / max(den, 1e-12)
                s[1] += 1
                change[i] = s[0] / s[1]
                change.at[(change.evaluations - 1, i)] = num / max(den, 1e-12)
            prev[i] = r
        return record

    def probe(mod, args, kwargs, out):
        if probing[0] or not last:
            return
        ref = _streams(out)[0].float()
        probing[0] = True
        try:
            for i, r in last.items():
                if prev[i][0].shape != r[0].shape:
                    continue  # another batch shape (CFG outside its interval): the cache would recompute here
                block = model.blocks[i]
                n = streams_of(block)

                def reuse(*a, _r=r, _n=n, **kw):
                    outs = tuple(x + d.to(x.dtype) for x, d in zip(a[:_n], _r))
                    return outs if _n > 1 else outs[0]
                block.forward = reuse
                try:
                    o = _streams(mod(*args, **kwargs))[0].float()
                finally:
                    del block.forward
                change.output_at[(change.evaluations - 1, i)] = float((o - ref).norm()) / max(float(ref.norm()), 1e-12)
        finally:
            probing[0] = False
    handles = [b.register_forward_hook(hook(i)) for i, b in enumerate(model.blocks)]
    if output_probe:
        handles.append(model.register_forward_hook(probe, with_kwargs=True))
    with _removing(handles), _on_calls(model, tick):
        yield change


def step_schedule(change: BlockChange, share: float, depth: int) -> dict[int, frozenset[int]]:
    """{k: blocks that reuse their last residual at evaluation k} (evaluation 0 always computes): `share` of the pass's
    block evaluations, picked greedily by the drift they add. Block i reused at k serves the residual of its last
    computed evaluation c, off by about the sum of its changes c+1..k (triangle inequality), so a pair costs that
    drift, plus as much again for each reuse right after it in the block's run: an ever staler residual is priced
    as such, not by its single-step change."""
    import heapq
    e = change.evaluations
    n = int(round(share * e * depth))
    reuse = [[False] * e for _ in range(depth)]
    version = [0] * depth
    heap: list[tuple[float, int, int, int]] = []

    def push_costs(i):
        d = [change.at.get((k, i), math.inf) for k in range(e)]
        drift = [0.0] * e  # drift[k]: sum of d since the last computed evaluation before k, through k
        for k in range(1, e):
            drift[k] = d[k] + (drift[k - 1] if reuse[i][k - 1] else 0.0)
        run = 0  # reuses right after k
        for k in range(e - 1, 0, -1):
            if reuse[i][k]:
                run += 1
                continue
            if math.isfinite(drift[k]):
                heapq.heappush(heap, (drift[k] * (1 + run), k, i, version[i]))
            run = 0
    for i in range(depth):
        push_costs(i)
    picked = 0
    while picked < n and heap:
        _, k, i, v = heapq.heappop(heap)
        if v != version[i]:
            continue  # priced before block i's last pick
        reuse[i][k] = True
        picked += 1
        version[i] += 1
        push_costs(i)
    plan: dict[int, set[int]] = {}
    for i in range(depth):
        for k in range(1, e):
            if reuse[i][k]:
                plan.setdefault(k, set()).add(i)
    return {k: frozenset(v) for k, v in sorted(plan.items())}


def parse_block_list(text: str, key: str, auto: bool = True) -> list[int] | None:
    """'auto' -> None (picked from a warm-up pass), else the sorted comma-separated block indices (>= 0)."""
    if auto and str(text).strip() == "auto":
        return None
    try:
        idx = [int(s) for s in str(text).split(",") if s.strip()]
    except ValueError:
        idx = []
    if not idx or min(idx) < 0:
        either = "'auto' or " if auto else ""
        raise GenlabError(f"{key} must be {either}comma-separated block indices >= 0, got {text!r}")
    return sorted(set(idx))


def pick_cacheable(change: dict[int, float], k: int) -> list[int]:
    """The k blocks whose contribution changes least (ties: the lower index)."""
    return sorted(sorted(change, key=lambda i: (change[i], i))[:k])


def search_cacheable(change: dict[int, float], tol: float, score) -> tuple[list[int], list[dict]]:
    """(the blocks safe to cache, the trail): in order of least change (ties: lower index), a block joins when the set
    plus it keeps FD within `tol` x the uncached FD, else the walk goes on; `score(blocks)` samples with those blocks
    cached and returns its metrics with `fd_ratio` (one scored pass per block)."""
    kept, trail = [], []
    for i in sorted(change, key=lambda i: (change[i], i)):
        trial = sorted(kept + [i])
        m = score(trial)
        ok = m["fd_ratio"] <= tol
        trail.append({"block": i, "blocks": trial, "fd_ratio": m["fd_ratio"],
                      "sample_accuracy": m.get("sample_accuracy"), "kept": ok})
        if ok:
            kept = trial
    return kept, trail


@contextmanager
def cached_blocks(model, indices, every: int = 2, schedule: dict[int, frozenset[int]] | None = None,
                  period: int = 0):
    """Inside, the blocks at `indices` recompute on every `every`-th network evaluation and reuse their last residual
    in between (a batch of another shape, e.g. CFG outside its interval, recomputes); with a `schedule` ({k: blocks},
    step_schedule) block i reuses at evaluation k of each `period` exactly when i is in schedule[k]. Yields counters
    {"computed", "reused"}; on exit the blocks are as before."""
    state = {"call": -1, "computed": 0, "reused": 0}
    saved: dict[int, tuple] = {}
    if schedule is not None:
        indices = set().union(*schedule.values())

    def tick():
        state["call"] += 1

    def reuse_now(i) -> bool:
        if schedule is not None:
            return i in schedule.get(state["call"] % period, ())
        return state["call"] % every != 0

    def wrap(i, run, n):
        def forward(*args, **kw):
            inputs = args[:n]
            r = saved.get(i)
            if reuse_now(i) and r is not None and r[0].shape == inputs[0].shape:
                state["reused"] += 1
                out = tuple(a + d for a, d in zip(inputs, r))
                return out if n > 1 else out[0]
            out = run(*args, **kw)
            state["computed"] += 1
            saved[i] = tuple(o - a for o, a in zip(_streams(out), inputs))
            return out
        return forward
    blocks = {i: model.blocks[i] for i in sorted(set(indices))}
    compiled = {i: b._compiled_call_impl for i, b in blocks.items() if getattr(b, "_compiled_call_impl", None)}
    for i, b in blocks.items():
        if i in compiled:
            # a block compiled in place (train.compile=blocks): the bookkeeping above runs around its compiled call,
            # not inside it, where dynamo would guard on `saved` and `state` and recompile at every evaluation
            b._compiled_call_impl = wrap(i, compiled[i], streams_of(b))
        else:
            b.forward = wrap(i, type(b).forward.__get__(b), streams_of(b))
    try:
        with _on_calls(model, tick):
            yield state
    finally:
        for i, b in blocks.items():
            if i in compiled:
                b._compiled_call_impl = compiled[i]
            else:
                del b.forward


@contextmanager
def forward_timer(model, device):
    """Yields {"seconds", "calls"}: wall-clock seconds inside the model's forward (the network's share of sampling),
    synchronising the device at each boundary so queued kernels are counted where they ran."""
    acc = {"seconds": 0.0, "calls": 0}
    start = []
    cuda = torch.device(device).type == "cuda"

    def pre(*_):
        if cuda:
            torch.cuda.synchronize(device)
        start.append(time.perf_counter())

    def post(*_):
        if cuda:
            torch.cuda.synchronize(device)
        acc["seconds"] += time.perf_counter() - start.pop()
        acc["calls"] += 1
    with _removing([model.register_forward_pre_hook(pre), model.register_forward_hook(post)]):
        yield acc


def format_cache_schedule(period: int, plan: dict) -> str:
    """The method.cache_schedule text of a plan (cache_schedule_plan's inverse)."""
    return f"{period}/" + ";".join(f"{k}:{','.join(str(b) for b in sorted(v))}" for k, v in sorted(plan.items()))
