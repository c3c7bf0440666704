"""The stall sentinel (issue 55): a run whose training or evaluation loss is still at the level of a predictor that
ignores its input (the method's `trivial_baselines`) after `log.stall_after` of its steps learned nothing. The
console says so in one line while the run goes on (and again if the value leaves that level); summary.json keeps
`stalled` (the state at the end) and `stall` (what fired)."""
from __future__ import annotations

import math


def at_level(value: float, baseline, margin: float) -> bool:
    """Within `margin` of the baseline, on its bad side: relative to |baseline|, or to baseline.scale when set."""
    room = margin * (abs(baseline.value) if baseline.scale is None else baseline.scale)
    return value <= baseline.value + room if baseline.higher_is_better else value >= baseline.value - room


def margin_words(baseline, margin: float) -> str:
    return f"{margin * 100:g}%" if baseline.scale is None else f"{margin * baseline.scale:g}"


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


class StallWatcher:
    """Fed the values of each log line and each evaluation; `say` prints one line."""

    def __init__(self, baselines, total_steps: int, after: float, margin: float, say=print):
        self.baselines = list(baselines) if after > 0 else []
        self.start, self.total, self.margin, self.say = after * total_steps, total_steps, margin, say
        self.stalls = {}  # metric -> {metric, value, baseline, what, since_step[, left_at]}

    def check(self, step: int, values: dict, source: str = "training") -> None:
        if step < self.start:
            return
        for b in self.baselines:
            v = values.get(b.metric)
            if not is_number(v):
                continue
            name = "training loss" if b.metric == "loss" else f"{source} {b.metric}"
            rec = self.stalls.get(b.metric)
            if at_level(v, b, self.margin):
                if rec is None or "left_at" in rec:  # fires, or fires again after leaving
                    rec = self.stalls[b.metric] = {"metric": b.metric, "value": v, "baseline": b.value, "what": b.what,
                                                   "since_step": step}
                    self.say(f"stalled: {name} {v:.4g} is within {margin_words(b, self.margin)} of the {b.what} "
                             f"({b.value:.4g}) at step {step} of {self.total}")
                rec["value"] = v
            elif rec is not None and "left_at" not in rec:
                rec["left_at"] = step
                self.say(f"no longer stalled: {name} {v:.4g} left the level of the {b.what} ({b.value:.4g}) "
                         f"at step {step} of {self.total}")

    def summary(self) -> dict:
        """{} when nothing was watched; else `stalled` (a value still at its level) and `stall`: the record of the
        metric still stalled, or of the first one that fired."""
        if not self.baselines:
            return {}
        if not self.stalls:
            return {"stalled": False}
        now = [r for r in self.stalls.values() if "left_at" not in r]
        return {"stalled": bool(now), "stall": dict(now[0] if now else next(iter(self.stalls.values())))}
