"""MXFP4 checkpoints written in code, in the layout gpt-oss ships, and their dequantized reference.

gpt-oss-20b / 120b quantize each layer's experts and nothing else:

| tensor | dtype | shape |
|---|---|---|
| ``model.layers.N.mlp.experts.gate_up_proj_blocks`` | uint8 | [E, 2I, D / 32, 16] |
| ``model.layers.N.mlp.experts.gate_up_proj_scales`` | uint8 | [E, 2I, D / 32] |
| ``model.layers.N.mlp.experts.down_proj_blocks`` | uint8 | [E, D, I / 32, 16] |
| ``model.layers.N.mlp.experts.down_proj_scales`` | uint8 | [E, D, I / 32] |
| ``*_proj_bias``, attention, router, embeddings, ``lm_head`` | bf16 | as the bf16 checkpoint |

Rows are output channels (gate/up interleaved along 2I), blocked along the input dim: the bf16
checkpoint's ``gate_up_proj`` [E, D, 2I] and ``down_proj`` [E, I, D] transposed. Each byte holds two
e2m1 codes, the even value in the low nibble; each block of 32 values one e8m0 scale (bias 127).

Quantization follows the OCP Microscaling spec (v1.0, section 6.3): a block's shared exponent is
``floor(log2(amax)) - 2`` (2 is e2m1's largest exponent), and each value divided by ``2 ** exponent``
is rounded to the nearest e2m1 value, ties to even, clamped to 6.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import torch
from safetensors.torch import load_file, save_file

BLOCK = 32
E8M0_BIAS = 127
# e2m1 magnitudes by the 3 low bits of a code; bit 3 is the sign.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_EMAX = 2
# Tiny GPT-OSS sizes whose hidden and intermediate dims are whole blocks (two of them for I, so
# that TP=2 splits it in whole blocks).
TINY_MXFP4_OVERRIDES = dict(hidden_size=128, intermediate_size=64)
# gpt-oss's quantization_config as published.
GPT_OSS_QUANTIZATION_CONFIG = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                               "model.embed_tokens", "lm_head"],
}
_EXPERT_WEIGHT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")


def quantize_mxfp4(weight: torch.Tensor, even_scale: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(blocks uint8 [..., N, K / 32, 16], scales uint8 [..., N, K / 32], dequantized fp32
    [..., N, K])`` of ``weight`` [..., N, K], blocked along K. ``even_scale``: AMD Quark's scale
    (its ``scale_calculation_mode: even``): the amax is first rounded to a power of two, up from 1.75
    times one, so that no value scales past 7 and saturates."""
    values = weight.float().unflatten(-1, (-1, BLOCK))
    amax = values.abs().amax(-1, keepdim=True)
    if even_scale:
        power = torch.exp2(torch.floor(torch.log2(amax)))
        amax = torch.where(amax >= 1.75 * power, 2 * power, power)
    # An all-zero block takes the smallest scale; its values are zeros whatever the scale.
    exponent = torch.where(amax > 0, torch.floor(torch.log2(amax)) - E2M1_EMAX, -E8M0_BIAS)
    exponent = exponent.clamp(-E8M0_BIAS, E8M0_BIAS)
    scaled = values / torch.exp2(exponent)
    magnitudes = torch.tensor(E2M1_MAGNITUDES)
    distance = (scaled.abs()[..., None] - magnitudes).abs()
    nearest = distance == distance.amin(-1, keepdim=True)
    even = torch.arange(len(E2M1_MAGNITUDES)) % 2 == 0  # mantissa bit 0
    # The nearest magnitude; on a tie, the one with an even mantissa. Beyond 6: 6, the nearest.
    index = torch.where((nearest & even).any(-1), (nearest & even).int().argmax(-1), nearest.int().argmax(-1))
    negative = scaled < 0
    codes = (index + 8 * negative.long()).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    signed = torch.where(negative, -magnitudes[index], magnitudes[index])
    dequantized = (signed * torch.exp2(exponent)).flatten(-2)
    scales = (exponent[..., 0] + E8M0_BIAS).to(torch.uint8)
    return blocks, scales, dequantized


def write_mxfp4_checkpoint(src_dir: str, out_dir: str) -> str:
    """Copy the GPT-OSS checkpoint at ``src_dir`` (one ``model.safetensors``) to ``out_dir`` with
    its experts in MXFP4 and everything else in bf16, as gpt-oss ships; return ``out_dir``."""
    shutil.copytree(src_dir, out_dir, dirs_exist_ok=True)
    tensors = {}
    for name, tensor in load_file(os.path.join(src_dir, "model.safetensors")).items():
        if _EXPERT_WEIGHT.match(name):
            # [E, D, 2I] or [E, I, D] -> rows by output channel, blocked along the input dim.
            blocks, scales, _ = quantize_mxfp4(tensor.transpose(1, 2))
            tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks.contiguous(), scales.contiguous()
        else:
            tensors[name] = tensor.to(torch.bfloat16)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    set_checkpoint_config(out_dir, "bfloat16", GPT_OSS_QUANTIZATION_CONFIG)
    return out_dir


def write_dequantized_checkpoint(src_dir: str, out_dir: str) -> str:
    """The checkpoint :func:`write_mxfp4_checkpoint` writes from ``src_dir``, dequantized: every
    weight in fp32 with the values the MXFP4 one holds (the experts' as they round, the others'
    bf16), in the bf16 layout and without ``quantization_config``. What HF transformers runs as the
    reference, independent of any MXFP4 decoder."""
    shutil.copytree(src_dir, out_dir, dirs_exist_ok=True)
    tensors = {}
    for name, tensor in load_file(os.path.join(src_dir, "model.safetensors")).items():
        if _EXPERT_WEIGHT.match(name):
            _, _, dequantized = quantize_mxfp4(tensor.transpose(1, 2))
            tensors[name] = dequantized.transpose(1, 2).contiguous()
        else:
            tensors[name] = tensor.to(torch.bfloat16).float()
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    set_checkpoint_config(out_dir, "float32", None)
    return out_dir


def set_checkpoint_config(model_dir: str, dtype: str, quantization: dict | None) -> None:
    """The checkpoint's config.json with ``dtype`` and ``quantization`` (None: no quantization_config)."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    config["torch_dtype"] = config["dtype"] = dtype
    config.pop("quantization_config", None)
    if quantization is not None:
        config["quantization_config"] = quantization
    with open(path, "w") as f:
        json.dump(config, f, indent=2)


def write_tiny_mxfp4_checkpoints(tiny_model_dir, out_dir: str) -> tuple[str, str]:
    """A tiny GPT-OSS (the ``tiny_model_dir`` fixture, sized by :data:`TINY_MXFP4_OVERRIDES`) in
    MXFP4 and dequantized: ``(out_dir/mxfp4, out_dir/dequantized)``."""
    source = tiny_model_dir("GptOssForCausalLM", **TINY_MXFP4_OVERRIDES)
    return (write_mxfp4_checkpoint(source, os.path.join(out_dir, "mxfp4")),
            write_dequantized_checkpoint(source, os.path.join(out_dir, "dequantized")))
