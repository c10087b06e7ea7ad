"""Tiles of the block-FP8 Triton GEMM at decode rows, each with split counts, against the shipped tiles.

    PYTHONPATH=packages/atom-kernels/src python3 fp8_tiles.py OUT.json

Why: at 16-64 rows the shipped tiles are 64 output columns wide, so every program reads its rows of
the activations once per 64 columns: at Qwen3-8B's qkv_proj and 64 rows as many bytes from L2 as the
weights themselves. There the GEMM took 1.13-1.85x the time of vLLM's DeepGEMM path
(``results/fp8-gemm-h200.json[fad0aae]``). Every (BLOCK_M, BLOCK_N, warps) below at 16, 32 and 64
rows, split K as the shipped rule picks it (``auto``) and forced to 1, 2 and 4, through
``gemm._launch_fp8_gemm(config=...)``; activations already quantized, random fp8 values and scales,
CUDA-graph timings (us), each bf16 output against the shipped tiles' (``max_rel_diff``: bf16 rounding
and summation order give a few 1e-3; a wrong tile O(1)).
The earlier ``fp8-h200.json[tiles]`` (128 and 8192 rows at Qwen3-8B's gate_up) came from this file's
version of d40db6b.
"""

import itertools
import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_scales_ahead import scales  # noqa: E402
from triton.testing import do_bench_cudagraph  # noqa: E402

from atom_kernels import gemm  # noqa: E402

SHAPES = {
    "qwen3-8b qkv": (6144, 4096), "qwen3-8b o": (4096, 4096), "qwen3-8b gate_up": (24576, 4096),
    "qwen3-8b down": (4096, 12288), "qwen3-30b qkv": (5120, 2048), "v3 q_b": (24576, 1536), "v3 o": (7168, 16384),
}
ROWS = (16, 32, 64)
TILES = list(itertools.product((16, 32, 64), (64, 128, 256), (4, 8)))  # BLOCK_M, BLOCK_N, num_warps
SPLITS = (None, 1, 2, 4)
# The fewest K steps a split may have, per BLOCK_M, as the shipped rule takes them (32: between).
MIN_STEPS = {16: 6, 32: 8, 64: 12}
FP8 = torch.float8_e4m3fn


def us(fn) -> float:
    """CUDA-graph mean over 5 ms replays: 1512 timings of 5-30 us kernels fit a few minutes."""
    fn()
    torch.cuda.synchronize()
    return round(do_bench_cudagraph(fn, rep=5) * 1000, 2)


def main(out_path: str) -> None:
    torch.manual_seed(0)
    columns = ["shape", "m", "block_m", "block_n", "warps", "split", "us", "max_rel_diff"]
    out = {"device": torch.cuda.get_device_name(), "columns": columns, "rows": [], "shipped": []}
    for name, (n, k) in SHAPES.items():
        b = (torch.randn(n, k, device="cuda") * 0.05).to(FP8)
        b_scale = scales(triton.cdiv(n, 128), k // 128)
        for m in ROWS:
            a, a_scale = torch.randn(m, k, device="cuda").to(FP8), scales(m, k // 128)

            def run(config=None, split=None):
                return gemm._launch_fp8_gemm(a, b, a_scale, b_scale, torch.bfloat16, None, True, 128, split, config)

            shipped = run().float()
            out["shipped"].append([name, m, us(run)])
            for (block_m, block_n, warps), split in itertools.product(TILES, SPLITS):
                config = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": 128, "GROUP_M": 8,
                          "num_warps": warps, "num_stages": 4, "split_min_steps": MIN_STEPS[block_m]}
                try:
                    diff = ((run(config, split).float() - shipped).abs().max() / shipped.abs().max()).item()
                    time = us(lambda: run(config, split))
                except triton.runtime.errors.OutOfResources:  # shared memory of the larger tiles
                    diff = time = float("inf")
                out["rows"].append([name, m, block_m, block_n, warps, split or "auto", time, float(f"{diff:.1e}")])
            best = min((r for r in out["rows"] if r[:2] == [name, m]), key=lambda r: r[6])
            print(name, m, "shipped", out["shipped"][-1][2], "best", best, flush=True)
            with open(out_path, "w") as f:
                json.dump(out, f, separators=(",", ":"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp8-tiles.json")
