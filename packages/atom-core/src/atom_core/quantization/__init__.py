"""Quantized checkpoints: the schemes ATOM serves (:mod:`.scheme`), which layers get them
(:mod:`.context`) and the FP8 math (:mod:`.fp8`). MXFP4 experts compute in atom_kernels'
``fused_moe``."""

from atom_core.quantization.context import layer_scheme, quantized_layers
from atom_core.quantization.scheme import (
    Fp8Scheme,
    Mxfp4Scheme,
    QuantConfig,
    UnsupportedQuantization,
    quant_config_from_hf,
)

__all__ = [
    "Fp8Scheme",
    "Mxfp4Scheme",
    "QuantConfig",
    "UnsupportedQuantization",
    "layer_scheme",
    "quant_config_from_hf",
    "quantized_layers",
]
