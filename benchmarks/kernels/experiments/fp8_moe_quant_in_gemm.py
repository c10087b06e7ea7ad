"""The block-FP8 fused MoE with its GEMMs quantizing their inputs themselves, against separate
quantization launches (``atom_kernels.moe.FUSED_A_QUANT_MAX_TOKENS`` set to 0), with the tile table
of this GPU.

Usage: python3 benchmarks/kernels/experiments/fp8_moe_quant_in_gemm.py OUT.json

Qwen3-30B-A3B's and DeepSeek-V3's expert shapes (128 x 128 weight blocks), uniform random top-8
routing, SiLU; whole-op time by CUDA-graph replay (mxfp4_decode_breakdown.graph_us); the two
outputs compared (equal bit for bit where the GEMMs quantize).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mxfp4_decode_breakdown import graph_us  # noqa: E402

from atom_kernels import moe  # noqa: E402

SHAPES = {"qwen3-30b-a3b": (128, 8, 2048, 768), "deepseek-v3": (256, 8, 7168, 2048)}  # E, top_k, D, I
TOKENS = (1, 4, 16, 64, 256, 1024)
BLOCK = 128
FP8 = torch.float8_e4m3fn


def fp8_blocks(experts: int, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random e4m3 weights and their fp32 scales per 128 x 128 block, about 1 / sqrt(cols) in size."""
    w = (torch.randn(experts, rows, cols, device="cuda") * 8).clamp(-448, 448).to(FP8)
    scales = torch.full((experts, rows // BLOCK, cols // BLOCK), cols**-0.5 / 8, device="cuda")
    return w, scales


def main(out_path: str) -> None:
    torch.manual_seed(0)
    fused_limit = moe.FUSED_A_QUANT_MAX_TOKENS
    report = {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
              "fused_a_quant_max_tokens": fused_limit, "shapes": {}}
    for name, (experts, top_k, hidden, inter) in SHAPES.items():
        w13, w13_scale = fp8_blocks(experts, 2 * inter, hidden)
        w2, w2_scale = fp8_blocks(experts, hidden, inter)
        options = {"w13_scale": w13_scale, "w2_scale": w2_scale, "block_size": BLOCK}
        fused_moe = moe.fused_moe.impl("triton")
        rows = report["shapes"][name] = {}
        for tokens in TOKENS:
            x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
            ids = torch.stack([torch.randperm(experts, device="cuda")[:top_k] for _ in range(tokens)]).int()
            weights = torch.randn(tokens, top_k, device="cuda").softmax(-1)
            row = rows[str(tokens)] = {}
            outs = {}
            for mode, limit in (("quant_in_gemm", 1 << 30), ("separate_launches", 0)):
                moe.FUSED_A_QUANT_MAX_TOKENS = limit
                fn = lambda: fused_moe(x, w13, w2, weights, ids, **options)  # noqa: E731
                outs[mode] = fn().float()
                row[mode] = round(graph_us(fn), 2)
            moe.FUSED_A_QUANT_MAX_TOKENS = fused_limit
            row["ratio"] = round(row["quant_in_gemm"] / row["separate_launches"], 3)
            row["equal"] = bool(torch.equal(outs["quant_in_gemm"], outs["separate_launches"]))
            print(name, tokens, row, flush=True)
            with open(out_path, "w") as f:
                json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp8-moe-quant-in-gemm.json")
