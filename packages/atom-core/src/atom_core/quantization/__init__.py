"""Quantized checkpoints: the schemes ATOM serves (:mod:`.scheme`), which layers get them
(:mod:`.context`) and the FP8 math (:mod:`.fp8`)."""

from atom_core.quantization.context import layer_scheme, quantized_layers
from atom_core.quantization.scheme import (
    Fp8Scheme,
    QuantConfig,
    UnsupportedQuantization,
    quant_config_from_hf,
)

__all__ = [
    "Fp8Scheme",
    "QuantConfig",
    "UnsupportedQuantization",
    "layer_scheme",
    "quant_config_from_hf",
    "quantized_layers",
]
