"""The fused MoE with MXFP4 experts at gpt-oss-20b's shape, weights decoded in registers or through
Triton's microscaled dot (``atom_kernels.moe.mx_register_decode`` forced off), with the tile table of
this GPU.

Usage: python3 benchmarks/kernels/experiments/mxfp4_register_decode.py OUT.json

Uniform random top-4 routing over 32 experts, GPT-OSS's clamped SwiGLU with biases; whole-op time by
CUDA-graph replay (mxfp4_decode_breakdown.graph_us); the two paths' outputs compared. Results:
``mxfp4-tiled-decode-h200.json[3e901cf-whole-op]``.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mxfp4_decode_breakdown import graph_us, mxfp4_blocks  # noqa: E402

from atom_kernels import moe  # noqa: E402

E, TOP_K, D, INTER = 32, 4, 2880, 2880
TOKENS = (1, 4, 16, 64, 256, 1024)
BF16 = torch.bfloat16


def main(out_path: str) -> None:
    torch.manual_seed(0)
    w13, w13_scale = mxfp4_blocks(E, 2 * INTER, D)
    w2, w2_scale = mxfp4_blocks(E, D, INTER)
    options = {"activation": "clamped_swiglu", "interleaved": True, "weight_format": "mxfp4",
               "w13_scale": w13_scale, "w2_scale": w2_scale,
               "w13_bias": (torch.randn(E, 2 * INTER, device="cuda") * 0.1).to(BF16),
               "w2_bias": (torch.randn(E, D, device="cuda") * 0.1).to(BF16)}
    fused_moe = moe.fused_moe.impl("triton")
    registers = moe.mx_register_decode
    report = {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
              "shape": {"E": E, "top_k": TOP_K, "D": D, "I": INTER}, "tokens": {}}
    for tokens in TOKENS:
        x = torch.randn(tokens, D, device="cuda", dtype=BF16)
        ids = torch.stack([torch.randperm(E, device="cuda")[:TOP_K] for _ in range(tokens)]).int()
        weights = torch.randn(tokens, TOP_K, device="cuda").softmax(-1)
        row = report["tokens"][str(tokens)] = {}
        outs = {}
        for mode in ("registers", "microscaled_dot"):
            moe.mx_register_decode = registers if mode == "registers" else (lambda *args: False)
            fn = lambda: fused_moe(x, w13, w2, weights, ids, **options)  # noqa: E731
            outs[mode] = fn().float()
            row[mode] = round(graph_us(fn), 2)
        moe.mx_register_decode = registers
        row["ratio"] = round(row["registers"] / row["microscaled_dot"], 3)
        row["max_abs_diff"] = (outs["registers"] - outs["microscaled_dot"]).abs().max().item()
        row["max_abs_out"] = outs["microscaled_dot"].abs().max().item()
        print(tokens, row, flush=True)
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mxfp4-register-decode.json")
