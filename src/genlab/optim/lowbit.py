"""torchao's low-bit AdamW: moments blockwise in 8 bits (Dettmers et al. 2022), 4 bits (Li et al. 2023) or float8
e4m3, decoded to float32 for each update (tensors under 4096 elements keep float32 moments); CPU and CUDA.

torchao keeps the moments as tensor subclasses, genlab checkpoints plain tensors only (runtime/checkpoint.safe_load):
the state_dict stores each subclass as its inner tensors and attributes, and loading rebuilds it from a fixed table
of the three classes (nothing named by the file is imported).
"""
from __future__ import annotations

from genlab.core.errors import GenlabError
from genlab.optim.build import cautious, optimizer_entry
from genlab.optim.caution import adamw_decay_factor
from genlab.optim.groups import param_groups

STATE_CLASSES = ("OptimState8bit", "OptimState4bit", "OptimStateFp8")
_TAG = "torchao_state"


def _flatten(v):
    if type(v).__name__ in STATE_CLASSES and hasattr(v, "__tensor_flatten__"):
        names, attrs = v.__tensor_flatten__()
        return {_TAG: type(v).__name__, **{n: getattr(v, n) for n in names}, "attrs": list(attrs)}
    return v


def _unflatten(v, classes):
    if isinstance(v, dict) and v.get(_TAG) in classes:
        cls = classes[v[_TAG]]
        return cls(*[v[n] for n in cls.tensor_attrs], *v["attrs"])
    return v


def plain_state_dict(opt):
    """state_dict hooks: subclass moments out as {torchao_state: class, inner tensors, attrs}, and back in."""
    import torchao.optim.subclass_4bit as s4
    import torchao.optim.subclass_8bit as s8
    import torchao.optim.subclass_fp8 as sf
    classes = {"OptimState8bit": s8.OptimState8bit, "OptimState4bit": s4.OptimState4bit, "OptimStateFp8": sf.OptimStateFp8}

    def out(_, sd):
        # new dicts: state_dict() shares the live per-parameter dicts
        sd["state"] = {i: {k: _flatten(v) for k, v in s.items()} for i, s in sd["state"].items()}
        return sd

    def into(_, sd):
        # before torch's load casts the state to each parameter's dtype (a subclass survives that cast; its codes would not)
        sd = dict(sd)
        sd["state"] = {i: {k: _unflatten(v, classes) for k, v in s.items()} for i, s in sd["state"].items()}
        return sd

    opt.register_state_dict_post_hook(out)
    opt.register_load_state_dict_pre_hook(into)
    return opt


def build_lowbit(model, ocfg, cls_name):
    try:
        import torchao.optim as ao
    except ImportError:
        raise GenlabError("the low-bit AdamW optimizers need torchao: pip install torchao==0.18.0") from None
    cls = getattr(ao, cls_name)
    # torchao keeps each group's LR in a CPU tensor; genlab's set_lr fills tensor LRs in place
    opt = cls(param_groups(model, ocfg.weight_decay), lr=ocfg.lr, betas=tuple(ocfg.betas), eps=ocfg.eps)
    return cautious(plain_state_dict(opt), ocfg, decay_factor=adamw_decay_factor)


for _name, _cls, _doc in (
        ("adamw8bit", "AdamW8bit", "moments in 8-bit dynamic-tree codes per 256 (Dettmers et al. 2022)"),
        ("adamw4bit", "AdamW4bit", "moments in 4-bit codes per 128 (Li et al. 2023)"),
        ("adamw_fp8", "AdamWFp8", "moments in float8 e4m3 with an absmax scale per 256")):
    optimizer_entry(_name, f"torchao {_cls}: {_doc}; caution: wrapper", fsdp=False)(
        lambda model, ocfg, cls_name=_cls: build_lowbit(model, ocfg, cls_name))
