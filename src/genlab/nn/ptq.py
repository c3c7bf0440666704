"""Post-training weight quantization of a backbone's block linears with torchao (`genlab quantize --to NAME`).

Only plain nn.Linear layers inside the blocks (nearly all the weights): embeddings, norms, adaLN modulation and the
output layer stay float, as QLoRA and LLM.int8 keep them, since an error there moves whole activations (float8's skip
list, nn/float8.py). A quantization is recorded as {format, layers} and re-applied at load: quantizing the same
weights with the same format is deterministic, so nothing but tensors and strings is stored.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn

from genlab.core.errors import GenlabError
from genlab.core.registry import Registry
from genlab.nn.float8 import SKIP_PARTS

ptq_registry = Registry("quant_format")

NF4_BLOCK = 64          # QLoRA's block: one absmax scale per 64 weights
NF4_SCALER_BLOCK = 256  # QLoRA's double quantization: the block scales in int8, one float factor per 256 of them


@dataclass
class Format:
    apply: Callable[[nn.Linear, torch.device], None]   # quantizes one linear's weight in place
    fits: Callable[[nn.Linear], str | None]            # None, or why this layer stays float (a shape the kernel refuses)
    needs: Callable[[torch.device], str | None] = lambda device: None  # None, or why this device cannot run it


def _torchao():
    try:
        import logging
        for name in ("torchao", "torch.utils._pytree"):  # missing optional CUDA kernels; a deprecation notice at import
            logging.getLogger(name).setLevel(logging.ERROR)
        import torchao.quantization as q
    except ImportError:
        raise GenlabError("post-training quantization needs torchao: pip install torchao==0.18.0") from None
    return q


def _cuda_only(what: str, min_cap=(0, 0)):
    def needs(device):
        if device.type != "cuda":
            return f"{what} needs a CUDA GPU in torchao 0.18"
        if torch.cuda.get_device_capability(device) < min_cap:
            return f"{what} needs compute capability >= {min_cap[0]}.{min_cap[1]}"
        return None
    return needs


def _quantize_one(linear: nn.Linear, config):
    _torchao().quantize_(nn.Sequential(linear), config)  # quantize_ walks a parent: wrap the one layer


def _bf16_apply(config_of):
    """int4 and float8 kernels take bf16 weights and activations: the layer turns bf16, and a float32 model
    (sampling runs without autocast) casts in and out around it; config_of(linear) -> the torchao config."""
    def apply(linear, device):
        linear.to(torch.bfloat16)
        _quantize_one(linear, config_of(linear))
        linear.register_forward_pre_hook(lambda m, args: tuple(a.to(torch.bfloat16) for a in args))
        linear.register_forward_hook(lambda m, args, out: out.to(torch.float32))
    return apply


# -- nf4 ------------------------------------------------------------------------------------------------------
def nf4_scaler_block(numel: int) -> int:
    """The double-quantization group: 256 block scales per float factor (QLoRA), or the largest divisor of the
    number of blocks below that for a small layer (torchao needs it to divide)."""
    n_blocks = numel // NF4_BLOCK
    return max(d for d in range(1, min(NF4_SCALER_BLOCK, n_blocks) + 1) if n_blocks % d == 0)


def _nf4_apply(linear, device):
    NF4Tensor = _torchao().NF4Tensor
    w = linear.weight.detach().contiguous()
    linear.weight = nn.Parameter(NF4Tensor.from_tensor(w, NF4_BLOCK, nf4_scaler_block(w.numel())), requires_grad=False)


ptq_registry.register("nf4", "NormalFloat4 (QLoRA): 16 normal-quantile levels per block of 64 weights, absmax "
                             "scales in int8 (double quantization); torchao NF4Tensor, dequantized per matmul; CPU and GPU")(
    Format(_nf4_apply, lambda m: None if m.weight.numel() % NF4_BLOCK == 0 else f"{m.weight.numel()} weights, not a multiple of {NF4_BLOCK}"))


# -- int8 -----------------------------------------------------------------------------------------------------
def _int8_apply(linear, device):
    _quantize_one(linear, _torchao().Int8WeightOnlyConfig())


ptq_registry.register("int8", "int8 weight-only, one symmetric scale per output row (torchao Int8WeightOnlyConfig); "
                              "CPU and GPU")(Format(_int8_apply, lambda m: None))


# -- int4 -----------------------------------------------------------------------------------------------------
def int4_group(in_features: int) -> int | None:
    return next((g for g in (128, 64, 32) if in_features % g == 0), None)


def _int4_config(linear):  # tinygemm's packed int4 layout is bf16 only
    q = _torchao()
    from torchao.quantization.quantize_.workflows.int4.int4_packing_format import Int4PackingFormat
    return q.Int4WeightOnlyConfig(group_size=int4_group(linear.in_features),
                                  int4_packing_format=Int4PackingFormat.TILE_PACKED_TO_4D)


ptq_registry.register("int4", "int4 weight-only, asymmetric groups of 128/64/32 input weights (torchao "
                              "Int4WeightOnlyConfig, tinygemm layout); CUDA only")(
    Format(_bf16_apply(_int4_config), lambda m: None if int4_group(m.in_features) and m.out_features % 8 == 0
           else f"shape {tuple(m.weight.shape)}: in_features not a multiple of 32 or out_features of 8",
           _cuda_only("int4 weight-only (tinygemm kernel)")))


# -- fp8 ------------------------------------------------------------------------------------------------------
ptq_registry.register("fp8", "float8 e4m3 weights and dynamically scaled float8 activations (torchao "
                             "Float8DynamicActivationFloat8WeightConfig); CUDA SM89+ (H100/H200)")(
    Format(_bf16_apply(lambda m: _torchao().Float8DynamicActivationFloat8WeightConfig()),
           lambda m: None if m.in_features % 16 == 0 and m.out_features % 16 == 0
           else f"shape {tuple(m.weight.shape)}: dims not multiples of 16", _cuda_only("float8 (e4m3 tensor cores)", (8, 9))))


# -- selection, application, memory ---------------------------------------------------------------------------
def check_format(name: str, device, what: str | None = None) -> Format:
    """The format exists and this device can run it; else one line naming the formats that run here."""
    fmt = ptq_registry.get(name)
    why = fmt.needs(torch.device(device))
    if why:
        here = [n for n, f in ptq_registry.items() if f.needs(torch.device(device)) is None]
        raise GenlabError(f"{what or f'--to {name}'}: {why}; on {torch.device(device).type} use one of: "
                          f"{', '.join(here)}")
    return fmt


def candidate_linears(model: nn.Module, adaln: bool = False) -> list[tuple[str, nn.Linear]]:
    """The block linears (type exactly nn.Linear: a converted BitLinear/Float8Linear is not requantized); with
    `adaln`, the blocks' adaLN modulation linears too (a DiT block's 6·dim² modulation weights are a third of its
    weights: NF4's memory target is out of reach without them, at a quality cost the gap table measures)."""
    def wanted(n):
        parts = n.split(".")
        if adaln and "ada" in parts and parts[0] == "blocks":
            return True
        return not any(p in SKIP_PARTS for p in parts)
    return [(n, m) for n, m in model.named_modules() if type(m) is nn.Linear and wanted(n)]


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a (possibly quantized) tensor holds: the sum over a tensor subclass's inner tensors."""
    if hasattr(t, "__tensor_flatten__") and type(t) not in (torch.Tensor, nn.Parameter):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names if getattr(t, n) is not None)
    return t.numel() * t.element_size()


def quantize_model(model: nn.Module, name: str, device, layers: list[str] | None = None, adaln: bool = False,
                   what: str | None = None) -> dict:
    """Quantize the model's block linears in place (or exactly `layers`, a record's list) and return the record:
    format, the layers quantized, those left float and why, and weight memory against bf16."""
    fmt = check_format(name, device, what)
    found = dict(candidate_linears(model, adaln=adaln or layers is not None))
    if layers is not None:
        missing = [n for n in layers if n not in found]
        if missing:
            raise GenlabError(f"quantization record names layers this model lacks: {', '.join(missing[:3])}")
    kept = {n: why for n, m in found.items() if (why := fmt.fits(m))} if layers is None else {}
    chosen = [n for n in found if n not in kept] if layers is None else list(layers)
    if not chosen:
        raise GenlabError(f"--to {name}: no block linear of this model fits ({'; '.join(kept.values()) or 'none found'})")
    n_params = {n: found[n].weight.numel() for n in chosen}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in chosen:
            fmt.apply(found[n], torch.device(device))
    q_bytes = sum(tensor_bytes(found[n].weight) for n in chosen)
    lin_bf16 = 2 * sum(n_params.values())
    other_bf16 = 2 * sum(p.numel() for pn, p in model.named_parameters()
                         if pn.rsplit(".", 1)[0] not in n_params or not pn.endswith("weight"))
    return {"format": name, "layers": chosen, "left_float": kept,
            "left_float_rule": "embeddings, norms, output layers" + ("" if adaln else ", adaLN modulation")
                               + " stay float (genlab.nn.ptq)",
            "quantized_params": sum(n_params.values()),
            "linear_bytes_bf16": lin_bf16, "linear_bytes_quantized": q_bytes,
            "model_bytes_bf16": lin_bf16 + other_bf16, "model_bytes_quantized": q_bytes + other_bf16,
            "weight_memory_ratio": round((q_bytes + other_bf16) / (lin_bf16 + other_bf16), 4)}


def apply_record(model: nn.Module, record: dict, device) -> nn.Module:
    """Re-apply a saved quantization at load time (genlab sample/eval on a quantized run)."""
    if not isinstance(record, dict) or not isinstance(record.get("format"), str) or not isinstance(record.get("layers"), list):
        raise GenlabError("this checkpoint's quantization record is malformed (want format and layers)")
    quantize_model(model, record["format"], device, layers=record["layers"],
                   what=f"this run is quantized to {record['format']} (genlab quantize)")
    return model
