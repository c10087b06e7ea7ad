"""AMD Quark MXFP4 checkpoints written in code, in the layout amd/DeepSeek-R1-0528-MXFP4 ships, and
their references.

Quark quantizes every ``nn.Linear`` outside ``exclude`` to MXFP4, weights and inputs (W4A4); the
DeepSeek-V3 family's checkpoints exclude attention, the routers and ``lm_head``, so the dense MLPs,
the shared experts and each routed expert are quantized:

| tensor | dtype | shape |
|---|---|---|
| ``model.layers.N.mlp.{gate,up,down}_proj.weight`` (and ``shared_experts.*``, ``experts.E.*``) | uint8 | [N, K / 2] |
| the same ``.weight_scale`` | uint8 | [N, K / 32] |
| attention, routers, norms, embeddings, ``lm_head`` | bf16 | as the bf16 checkpoint |

Each byte holds two e2m1 codes, the even value in the low nibble; each block of 32 values along K one
e8m0 scale (bias 127), chosen as Quark chooses it (``scale_calculation_mode: even``,
:func:`atom_core.testing.mxfp4_checkpoints.quantize_mxfp4`). Activations are quantized at run time,
so the checkpoint has no input scales.

References for parity tests: :func:`write_dequantized_checkpoint` (the same weights in fp32, no
quantization) and :func:`fake_quantized_activations` (HF's quantized linear layers and experts see
their inputs rounded to MXFP4 and back, by the same reference quantizer).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator

import torch
from safetensors.torch import load_file, save_file

from atom_core.testing.fp8_checkpoints import TINY_FP8_OVERRIDES, fake_quantized_experts
from atom_core.testing.mxfp4_checkpoints import quantize_mxfp4, set_checkpoint_config

# A Quark MXFP4 tensor spec as Quark exports it.
_MXFP4_SPEC = {
    "ch_axis": -1, "dtype": "fp4", "group_size": 32, "is_scale_quant": False, "mx_element_dtype": None,
    "observer_cls": "PerBlockMXObserver", "qscheme": "per_group", "round_method": "half_even",
    "scale_calculation_mode": "even", "scale_format": "e8m0", "scale_type": "float", "symmetric": None,
}
# Attention, the routers (``mlp.gate``) and ``lm_head`` excluded, as the DeepSeek-V3 family's
# published configs exclude them; Quark's ``exclude`` takes globs.
DEEPSEEK_EXCLUDE = ["*self_attn*", "*mlp.gate", "lm_head"]


def quark_mxfp4_config(exclude: list[str] = DEEPSEEK_EXCLUDE) -> dict:
    """A Quark MXFP4 (W4A4) ``quantization_config`` leaving ``exclude`` unquantized."""
    return {
        "quant_method": "quark",
        "quant_mode": "eager_mode",
        "export": {"kv_cache_group": [], "min_kv_scale": 0.0, "pack_method": "reorder",
                   "weight_format": "real_quantized", "weight_merge_groups": None},
        "global_quant_config": {
            "weight": {**_MXFP4_SPEC, "is_dynamic": False},
            "input_tensors": {**_MXFP4_SPEC, "is_dynamic": True},
            "output_tensors": None, "bias": None, "target_device": None,
        },
        "layer_quant_config": {},
        "layer_type_quant_config": {},
        "exclude": list(exclude),
        "algo_config": None,
    }


# The tiny DeepSeek-V3 of the FP8 tests: hidden 128, MLP 128 and experts 64 wide, whole 32-blocks.
TINY_QUARK_OVERRIDES = TINY_FP8_OVERRIDES["DeepseekV3ForCausalLM"]
_LINEAR_WEIGHT = re.compile(r"^model\.layers\.\d+\..*_proj(_with_mqa)?\.weight$")


def _quantized(module: str, config: dict) -> bool:
    from atom_core.quantization import quant_config_from_hf

    class _Hf:
        quantization_config = config

    return quant_config_from_hf(_Hf).scheme_for(module) is not None


def quantize_mxfp4_activation(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to MXFP4 and back per 32 values along its last dim, as Quark rounds inputs."""
    return quantize_mxfp4(x, even_scale=True)[2].to(x.dtype)


def write_quark_mxfp4_checkpoint(src_dir: str, out_dir: str, exclude: list[str] = DEEPSEEK_EXCLUDE) -> str:
    """Copy the checkpoint at ``src_dir`` (one ``model.safetensors``, tokenizer, configs) to
    ``out_dir`` with every linear weight outside ``exclude`` in Quark's MXFP4 and everything else in
    bf16; return ``out_dir``."""
    shutil.copytree(src_dir, out_dir, dirs_exist_ok=True)
    config = quark_mxfp4_config(exclude)
    tensors = {}
    for name, tensor in load_file(os.path.join(src_dir, "model.safetensors")).items():
        module = name[: -len(".weight")]
        if _LINEAR_WEIGHT.match(name) and tensor.dim() == 2 and _quantized(module, config):
            blocks, scales, _ = quantize_mxfp4(tensor, even_scale=True)
            tensors[name], tensors[f"{module}.weight_scale"] = blocks.flatten(-2).contiguous(), scales
        else:
            tensors[name] = tensor.to(torch.bfloat16)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    set_checkpoint_config(out_dir, "bfloat16", config)
    return out_dir


def write_dequantized_checkpoint(quark_dir: str, out_dir: str) -> str:
    """The checkpoint at ``quark_dir`` with every MXFP4 weight decoded to fp32 (by the format's
    definition, not ATOM's decoder) and no ``quantization_config``: what HF transformers runs as
    the reference."""
    shutil.copytree(quark_dir, out_dir, dirs_exist_ok=True)
    tensors = load_file(os.path.join(quark_dir, "model.safetensors"))
    magnitudes = torch.tensor((0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0))
    out = {}
    for name, tensor in tensors.items():
        if name.endswith(".weight_scale"):
            continue
        if tensor.dtype == torch.uint8:
            codes = torch.stack([tensor & 15, tensor >> 4], dim=-1).flatten(-2).long()
            values = torch.where(codes >= 8, -magnitudes[codes & 7], magnitudes[codes & 7])
            scale = tensors[name[: -len("weight")] + "weight_scale"].float()
            tensor = values * torch.exp2(scale - 127).repeat_interleave(32, dim=-1)
        out[name] = tensor.float()
    save_file(out, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    set_checkpoint_config(out_dir, "float32", None)
    return out_dir


@contextlib.contextmanager
def fake_quantized_activations(model: torch.nn.Module, quark_dir: str) -> Iterator[None]:
    """Inside, the HF model (running the dequantized copy of the Quark checkpoint at ``quark_dir``)
    computes as the format prescribes: the input of each ``nn.Linear`` whose weight is MXFP4 in the
    checkpoint, and both GEMMs' inputs of its fused experts modules, rounded by
    :func:`quantize_mxfp4_activation`."""
    tensors = load_file(os.path.join(quark_dir, "model.safetensors"))
    handles = []
    for name, module in model.named_modules():
        weight = tensors.get(f"{name}.weight")
        if isinstance(module, torch.nn.Linear) and weight is not None and weight.dtype == torch.uint8:
            handles.append(module.register_forward_pre_hook(
                lambda m, args: (quantize_mxfp4_activation(args[0]), *args[1:])))
        elif getattr(module, "gate_up_proj", None) is not None and f"{name}.0.down_proj.weight" in tensors:
            experts_hook = fake_quantized_experts(quantize_mxfp4_activation)
            handles.append(module.register_forward_hook(experts_hook, with_kwargs=True))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def write_tiny_quark_checkpoints(tiny_model_dir, out_dir: str,
                                 exclude: list[str] = DEEPSEEK_EXCLUDE) -> tuple[str, str]:
    """A tiny DeepSeek-V3 (the ``tiny_model_dir`` fixture, sized by :data:`TINY_QUARK_OVERRIDES`) in
    Quark MXFP4 and dequantized: ``(out_dir/quark, out_dir/dequantized)``."""
    source = tiny_model_dir("DeepseekV3ForCausalLM", **TINY_QUARK_OVERRIDES)
    quark = write_quark_mxfp4_checkpoint(source, os.path.join(out_dir, "quark"), exclude)
    return quark, write_dequantized_checkpoint(quark, os.path.join(out_dir, "dequantized"))
