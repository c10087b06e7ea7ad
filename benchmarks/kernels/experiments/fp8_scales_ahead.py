"""The block-FP8 Triton dense GEMM and fused MoE at a few decode shapes, for comparing two trees of
atom_kernels one after the other on one GPU (each on PYTHONPATH in turn):

    PYTHONPATH=TREE/packages/atom-kernels/src python3 fp8_scales_ahead.py OUT.json

Dense: ``fp8_block_scaled_mm_triton`` at Qwen3-8B's qkv and down widths and two DeepSeek-V3 ones, 1-64
rows. MoE: Qwen3-30B-A3B and DeepSeek-V3's width with each expert split over 4 ranks (I = 512), block
128, uniform random top-8, 1-256 tokens, the shipped tables. Random fp8 values and scales; CUDA-graph
timings, us. Result: ``fp8-h200.json.gz[scales-ahead]`` (scales loaded in each K step against a step ahead).
"""

import json
import sys

import torch
from triton.testing import do_bench_cudagraph

from atom_kernels import gemm, moe

DENSE = ((6144, 4096), (4096, 12288), (24576, 1536), (7168, 4096))
MOE = (("qwen3-30b-a3b", 128, 2048, 768, 8), ("deepseek-v3 tp4", 256, 7168, 512, 8))
FP8 = torch.float8_e4m3fn


def us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return round(do_bench_cudagraph(fn, rep=20) * 1000, 2)


def scales(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, device="cuda") * 0.01 + 0.001


def main(out_path: str) -> None:
    torch.manual_seed(0)
    out = {}
    for n, k in DENSE:
        b = (torch.randn(n, k, device="cuda") * 0.05).to(FP8)
        b_scale = scales(n // 128, k // 128)
        for m in (1, 16, 64):
            a, a_scale = torch.randn(m, k, device="cuda").to(FP8), scales(m, k // 128)
            out[f"gemm {n}x{k} m{m}"] = us(lambda: gemm.fp8_block_scaled_mm_triton(a, b, a_scale, b_scale))
    fused_moe = moe.fused_moe.impl("triton")
    for name, experts, d, inter, top_k in MOE:
        w13 = (torch.randn(experts, 2 * inter, d, device="cuda") * 0.05).to(FP8)
        w2 = (torch.randn(experts, d, inter, device="cuda") * 0.05).to(FP8)
        options = {"w13_scale": scales(experts, 2 * inter // 128, d // 128),
                   "w2_scale": scales(experts, d // 128, inter // 128), "block_size": 128}
        for tokens in (1, 16, 64, 256):
            x = torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16)
            ids = torch.stack([torch.randperm(experts, device="cuda")[:top_k] for _ in range(tokens)]).int()
            weights = torch.rand(tokens, top_k, device="cuda").softmax(-1)
            out[f"moe {name} t{tokens}"] = us(lambda: fused_moe(x, w13, w2, weights, ids, **options))
    for key, value in out.items():
        print(key, value, flush=True)
    with open(out_path, "w") as f:
        json.dump(out, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp8-scales-ahead.json")
