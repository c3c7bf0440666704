"""torchao's quantized-training prototypes as converters (`train.convert = ["bitnet_torchao"]` / `["int8_mixed"]`,
docs/precision.md), on the block linears genlab's own BitLinear converts, so the two BitNets compare side by side.
bitnet_torchao keeps genlab's input RMSNorm (a NormedLinear whose weight torchao swaps); a state-dict hook hands back
plain tensors. int8_mixed is the module-swap form: torchao 0.18's subclass form never sees F.linear (it trains
unquantised), and its swap casts nothing under autocast, so genlab's swapped class casts to the autocast dtype.
Both run on the CPU (torch._int_mm): no device check.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from genlab.core.errors import GenlabError
from genlab.nn.convert import Converter, add_bitnet_norms, bitlinear_filter, convert_registry

SUBCLASSES = ("BitNetTrainingLinearWeight",)


def _plain_weights(module, state_dict, prefix, local_metadata):
    """Checkpoints hold the subclass's plain tensor (torch.load(weights_only=True) admits no torchao class)."""
    for k, v in state_dict.items():
        if k.startswith(prefix) and type(v).__name__ in SUBCLASSES:
            state_dict[k] = v._data.detach()
    return state_dict


def _torchao_config(name: str):
    try:
        from torchao.prototype import quantized_training as qt
    except ImportError as e:
        raise GenlabError(f"train.convert={name} needs torchao's quantized_training prototype "
                          f"(pip install torchao): {e}") from None
    return qt.bitnet_training() if name == "bitnet_torchao" else qt.int8_mixed_precision_training(module_swap=True)


def _autocast_int8_class():
    from torchao.prototype.quantized_training import int8_mixed_precision as imp

    class AutocastInt8MixedLinear(imp.Int8MixedPrecisionTrainingLinear):
        """torchao's swapped linear, with its operands cast to the autocast dtype (see the module docstring)."""

        def forward(self, x):
            w, b = self.weight, self.bias
            if torch.is_autocast_enabled(x.device.type):
                dt = torch.get_autocast_dtype(x.device.type)
                x, w, b = x.to(dt), w.to(dt), None if b is None else b.to(dt)
            return imp._Int8MixedPrecisionTrainingLinearFunction.apply(x, w, b, self.config)

    return imp.Int8MixedPrecisionTrainingLinear, AutocastInt8MixedLinear


def convert_quantized_training(model: nn.Module, name: str) -> nn.Module:
    """Convert the block linears in place (bitnet: a weight subclass; int8_mixed: a module swap); names are kept."""
    from torchao.quantization import quantize_
    quantize_(model, _torchao_config(name), filter_fn=bitlinear_filter)
    if name == "int8_mixed":
        swapped, ours = _autocast_int8_class()
        for m in model.modules():
            if type(m) is swapped:
                m.__class__ = ours
    for m in model.modules():  # on each linear: a sub-module's state_dict is plain too
        if type(getattr(m, "weight", None)).__name__ in SUBCLASSES:
            m._register_state_dict_hook(_plain_weights)
    return model


def _entry(name, prepare=None):
    return Converter(lambda model, device, cfg=None: convert_quantized_training(model, name),
                     lambda device: _torchao_config(name), linears=True, prepare=prepare)


convert_registry.register("bitnet_torchao", "torchao's bitnet_training prototype (BitNet b1.58: ternary weights, "
                                            "int8 activations, int8 matmul) for the block linears, after genlab's "
                                            "input RMSNorm (train.bitlinear_norm)", reads=("train.bitlinear_norm",))(
    _entry("bitnet_torchao", prepare=add_bitnet_norms))
convert_registry.register("int8_mixed", "torchao's int8_mixed_precision_training prototype: dynamic int8 weights "
                                        "and activations in forward and backward matmuls of the block linears")(
    _entry("int8_mixed"))
