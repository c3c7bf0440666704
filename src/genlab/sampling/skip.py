"""Sampling with blocks skipped: a skipped block is the identity (its input passes unchanged), the weights untouched.

Every image-backbone block is residual, so identity is "this block adds nothing". An MMDiT dual block passes both
of its streams (image, context) through; others pass their token sequence.
"""
from __future__ import annotations

from contextlib import contextmanager


def _identity(streams: int):
    def forward(*args, **_):
        return args[0] if streams == 1 else tuple(args[:streams])
    return forward


def streams_of(block) -> int:
    """Token streams a block maps (MMDiT's JointBlock: image and context); its forward takes them first."""
    return getattr(block, "token_streams", 1)


@contextmanager
def skip_blocks(model, indices):
    """Within the context the blocks at `indices` of model.blocks are the identity: an instance attribute shadows
    their class's forward (nn.Module.__call__ looks it up on the instance), and is removed on exit."""
    blocks = [model.blocks[i] for i in sorted(set(indices))]
    for b in blocks:
        b.forward = _identity(streams_of(b))
    try:
        yield
    finally:
        for b in blocks:
            del b.forward


def skip_plans(depth: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, blocks) to compare: none, each single block, then runs of 2..depth/2 consecutive blocks centred on the
    middle of the network (where the users' belief says skipping is safe)."""
    plans = [("none", ())] + [(f"block {i}", (i,)) for i in range(depth)]
    for n in range(2, depth // 2 + 1):
        start = (depth - n) // 2
        plans.append((f"blocks {start}-{start + n - 1}", tuple(range(start, start + n))))
    return plans
