"""Optimizer state: its size, and a resume that keeps the saved dtypes."""
from __future__ import annotations

import torch


def state_bytes(optimizer) -> int:
    """Bytes of the optimizer's state tensors on this rank (FSDP2: the local shards), in nested dicts, lists and
    library state objects; tensor subclasses count the tensors they store."""
    seen, total = set(), 0

    def walk(v):
        nonlocal total
        if torch.is_tensor(v):
            t = v._local_tensor if hasattr(v, "_local_tensor") else v
            if id(t) in seen:
                return
            seen.add(id(t))
            if type(t) is not torch.Tensor and hasattr(t, "__tensor_flatten__"):
                # a tensor subclass (torchao's low-bit states): its element_size is the logical dtype's; count
                # the tensors it stores (codes, scales, code tables)
                for name in t.__tensor_flatten__()[0]:
                    walk(getattr(t, name))
            else:
                total += t.numel() * t.element_size()
        elif isinstance(v, (dict, list, tuple)):
            for x in (v.values() if isinstance(v, dict) else v):
                walk(x)
        elif hasattr(v, "__dict__") and not isinstance(v, (type, torch.nn.Module)) and id(v) not in seen:
            # state held in library objects (pytorch-optimizer Shampoo's PreConditioner and graft): their tensors
            seen.add(id(v))
            walk(vars(v))
    for s in optimizer.state.values():
        walk(s)
    return total


def keep_saved_dtypes(optimizer):
    """torch's Optimizer.load_state_dict casts every floating state tensor to its parameter's dtype. heavyball keeps
    some in float64 (PSGD-Kron's running lower bound): rounded to float32 on load, a resumed run drifts from the
    uninterrupted one. These hooks put the saved dtype back after loading."""
    def pre(opt, state_dict):
        opt._genlab_loading = state_dict

    def post(opt):
        saved = opt.__dict__.pop("_genlab_loading", None)
        if not saved:
            return
        params = {pid: p for g_saved, g in zip(saved["param_groups"], opt.param_groups)
                  for pid, p in zip(g_saved["params"], g["params"])}
        for pid, st in saved["state"].items():
            if pid in params and params[pid] in opt.state:
                opt.state[params[pid]] = _with_saved_dtypes(opt.state[params[pid]], st)

    optimizer.register_load_state_dict_pre_hook(pre)
    optimizer.register_load_state_dict_post_hook(post)
    return optimizer


def _with_saved_dtypes(cur, saved):
    if torch.is_tensor(cur) and torch.is_tensor(saved):
        return saved.to(device=cur.device) if saved.dtype != cur.dtype else cur
    if isinstance(cur, dict) and isinstance(saved, dict):
        for k in cur:
            if k in saved:
                cur[k] = _with_saved_dtypes(cur[k], saved[k])
        return cur
    if isinstance(cur, (list, tuple)) and isinstance(saved, (list, tuple)) and len(cur) == len(saved):
        out = [_with_saved_dtypes(c, s) for c, s in zip(cur, saved)]
        return type(cur)(out) if isinstance(cur, tuple) else out
    return cur
