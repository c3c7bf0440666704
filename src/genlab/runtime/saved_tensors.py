"""Activation memory, measured: the bytes autograd saves for backward in one step, and what FP8 storage of them would
save (COAT; counted, not run; docs/precision.md). Each distinct storage counts once at full size (a view of qkv is the
whole qkv buffer); parameter storages are excluded, parameter-sized copies (autocast's bf16 weights) are in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

FP8_GROUP = 128  # elements per fp32 scale in the FP8 form (COAT's per-group scaling); 4 bytes per group added


@dataclass
class Saved:
    bytes_by_dtype: dict[str, int] = field(default_factory=dict)   # distinct non-parameter storages, by dtype
    numel_by_dtype: dict[str, int] = field(default_factory=dict)
    param_bytes: int = 0                                           # saved tensors that are parameters (not counted)

    @property
    def total(self) -> int:
        return sum(self.bytes_by_dtype.values())

    def fp8_bytes(self, group: int = FP8_GROUP) -> int:
        """The same tensors with every floating one wider than a byte stored as FP8 codes plus one fp32 scale per
        `group` elements; integer and bool tensors (indices, masks) and 1-byte ones unchanged."""
        out = 0
        for name, b in self.bytes_by_dtype.items():
            dt, n = getattr(torch, name), self.numel_by_dtype[name]
            out += n + 4 * math.ceil(n / group) if dt.is_floating_point and dt.itemsize > 1 else b
        return out


def measure_saved(fn: Callable[[], object], params: Iterable[torch.Tensor] = ()) -> Saved:
    """Run fn (a forward and backward, e.g. one training step) and count what its forward saves for backward."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, tuple[torch.dtype, int]] = {}   # storage address -> (dtype, bytes)
    param_seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor subclass without a storage: count its own size
            s = None
        ptr, nbytes = (s.data_ptr(), s.nbytes()) if s is not None else (id(t), t.numel() * t.element_size())
        if ptr in skip:
            param_seen[ptr] = nbytes
        elif nbytes:
            seen[ptr] = (t.dtype, max(nbytes, seen.get(ptr, (None, 0))[1]))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    out = Saved(param_bytes=sum(param_seen.values()))
    for dt, b in seen.values():
        name = str(dt).removeprefix("torch.")
        out.bytes_by_dtype[name] = out.bytes_by_dtype.get(name, 0) + b
        out.numel_by_dtype[name] = out.numel_by_dtype.get(name, 0) + b // dt.itemsize
    return out


def fit_per_sample(batches: tuple[int, int], saved: tuple[Saved, Saved], group: int = FP8_GROUP) -> dict:
    """bytes = fixed + per_sample x batch through two batch sizes (the forward is the same graph at every batch,
    so each saved tensor either grows with the batch or does not), as saved and in FP8: the figures to scale."""
    (b1, b2), (s1, s2) = batches, saved

    def line(f):
        per = (f(s2) - f(s1)) / (b2 - b1)
        return per, f(s1) - b1 * per

    per, fixed = line(lambda s: s.total)
    fp8_per, fp8_fixed = line(lambda s: s.fp8_bytes(group))
    return {"per_sample": per, "fixed": fixed, "fp8_per_sample": fp8_per, "fp8_fixed": fp8_fixed}


def at_batch(fit: dict, batch: int) -> tuple[float, float]:
    """(bytes saved for backward, the same in FP8) at `batch`, from fit_per_sample."""
    return fit["fixed"] + batch * fit["per_sample"], fit["fp8_fixed"] + batch * fit["fp8_per_sample"]
