"""Block-FP8 checkpoints written in code, in the layout Qwen3-*-FP8 and DeepSeek-V3/R1 ship.

The layout: every projection weight of the decoder layers (attention, MLP, each expert's) is
``float8_e4m3fn`` ``[N, K]`` with a float32 ``weight_scale_inv`` ``[ceil(N/bn), ceil(K/bk)]``, one
per ``bn x bk`` block, such that ``weight ~= fp8 * scale`` blockwise; everything else (embedding,
norms, routers, ``lm_head``) stays in bfloat16. ``config.json`` gets

    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                            "quant_method": "fp8", "weight_block_size": [bn, bk]}
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil

import torch
from safetensors.torch import load_file, save_file

FP8_MAX = torch.finfo(torch.float8_e4m3fn).max
# Projection weights of the decoder layers, experts' included; routers are ``mlp.gate.weight``.
QUANTIZED_WEIGHT = re.compile(r"^model\.layers\.\d+\..*_proj\.weight$")


def quantize_block_fp8(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp8 weight, weight_scale_inv)`` of a 2-D weight, one scale per block (partial blocks at
    the edges have their own scale, as in the published checkpoints)."""
    n, k = weight.shape
    bn, bk = block
    rows, cols = math.ceil(n / bn), math.ceil(k / bk)
    padded = torch.zeros(rows * bn, cols * bk, dtype=torch.float32)
    padded[:n, :k] = weight.float()
    tiles = padded.view(rows, bn, cols, bk)
    scale = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
    quantized = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return quantized.view(rows * bn, cols * bk)[:n, :k].contiguous(), scale


def write_block_fp8_checkpoint(src_dir: str, out_dir: str, block: tuple[int, int] = (128, 128)) -> str:
    """Copy the checkpoint at ``src_dir`` (one ``model.safetensors``, tokenizer, configs) to
    ``out_dir`` in block-FP8 layout; returns ``out_dir``."""
    shutil.copytree(src_dir, out_dir, dirs_exist_ok=True)
    tensors = {}
    for name, tensor in load_file(os.path.join(src_dir, "model.safetensors")).items():
        if QUANTIZED_WEIGHT.match(name) and tensor.dim() == 2:
            tensors[name], tensors[f"{name}_scale_inv"] = quantize_block_fp8(tensor, block)
        else:
            tensors[name] = tensor.to(torch.bfloat16)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    config_path = os.path.join(out_dir, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["torch_dtype"] = config["dtype"] = "bfloat16"
    config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                     "quant_method": "fp8", "weight_block_size": list(block)}
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)
    return out_dir
