"""The fused MoE with MXFP4 experts at gpt-oss's shapes, weights decoded in registers or through
Triton's microscaled dot (``atom_kernels.moe.mx_register_decode`` forced off), with the tile table of
this GPU.

Usage: python3 benchmarks/kernels/experiments/mxfp4_register_decode.py OUT.json [--experts 128]
(32 experts: gpt-oss-20b; 128: gpt-oss-120b)

Uniform random top-4 routing, GPT-OSS's clamped SwiGLU with biases; whole-op time by
CUDA-graph replay (mxfp4_decode_breakdown.graph_us); the two paths' outputs compared. Results:
``mxfp4-tiled-decode-h200.json[3e901cf-whole-op, d9df8fc-whole-op, e3ec8a2-whole-op-120b]``.
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

TOP_K, D, INTER = 4, 2880, 2880
TOKENS = (1, 4, 16, 64, 256, 1024)
BF16 = torch.bfloat16


def main(out_path: str, experts: int) -> None:
    torch.manual_seed(0)
    w13, w13_scale = mxfp4_blocks(experts, 2 * INTER, D)
    w2, w2_scale = mxfp4_blocks(experts, D, INTER)
    options = {"activation": "clamped_swiglu", "interleaved": True, "weight_format": "mxfp4",
               "w13_scale": w13_scale, "w2_scale": w2_scale,
               "w13_bias": (torch.randn(experts, 2 * INTER, device="cuda") * 0.1).to(BF16),
               "w2_bias": (torch.randn(experts, D, device="cuda") * 0.1).to(BF16)}
    fused_moe = moe.fused_moe.impl("triton")
    registers = moe.mx_register_decode
    report = {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
              "shape": {"E": experts, "top_k": TOP_K, "D": D, "I": INTER}, "tokens": {}}
    for tokens in TOKENS:
        x = torch.randn(tokens, D, device="cuda", dtype=BF16)
        ids = torch.stack([torch.randperm(experts, device="cuda")[:TOP_K] for _ in range(tokens)]).int()
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
    args = sys.argv[1:]
    experts = int(args[args.index("--experts") + 1]) if "--experts" in args else 32
    main(args[0] if args and not args[0].startswith("--") else "mxfp4-register-decode.json", experts)
