"""Block-FP8 GEMM: ATOM's Triton kernel against torch._scaled_mm's block-wise recipe (CUTLASS inside
torch on Hopper), on the weight as is and, for widths of partial 128-row blocks, zero-padded to whole
ones; and the Triton kernel with tiles that fill the SMs. All after the same per_group_quant_fp8.
Writes $OUT/fp8-block-library.json."""

import argparse
import json
import os

import torch
import triton

import atom_kernels
from atom_core.testing.fp8_checkpoints import quantize_block_fp8
from atom_kernels import gemm

SHAPES = {  # (N, K) of Qwen3-8B and DeepSeek-V3 layers
    "qwen3-8b qkv": (6144, 4096), "qwen3-8b o": (4096, 4096), "qwen3-8b gate_up": (24576, 4096),
    "qwen3-8b down": (4096, 12288), "deepseek q_a": (1536, 7168), "deepseek o": (7168, 16384),
    "deepseek fused_qkv_a": (2112, 7168), "deepseek kv_a": (576, 7168), "deepseek dense gate_up": (36864, 7168),
}
MS = (1, 16, 64, 256, 1024, 4096)


def scaled_mm(xq, xs, w, ws):
    # scale_a [M, K/128] outer-dim-major, scale_b [K/128, N/128]: the weight's [N/128, K/128] transposed.
    return torch._scaled_mm(xq, w.t(), scale_a=xs.t().contiguous().t(), scale_b=ws.t(), out_dtype=torch.bfloat16)


def small_tiles(m, n):
    """128 x 128 tiles unless they give fewer programs than SMs: then the largest smaller tile
    that fills them."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for bm, bn in ((128, 128), (64, 128), (64, 64), (32, 64), (16, 64), (16, 32)):
        if triton.cdiv(m, bm) * triton.cdiv(n, bn) >= sms:
            break
    return bm, bn


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--m", default=",".join(map(str, MS)))
    args = parser.parse_args()
    rows = []
    for name in args.shapes.split(","):
        n, k = SHAPES[name]
        wq, ws = (t.cuda() for t in quantize_block_fp8(torch.randn(n, k) * 0.05, (128, 128)))
        wq_padded = torch.cat([wq, wq.new_zeros(-n % 128, k)])  # whole 128-row blocks, as its scales
        for m in map(int, args.m.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            xq, xs = atom_kernels.per_group_quant_fp8(x, 128)
            ref = atom_kernels.fp8_block_scaled_mm.impl("torch")(xq, wq, xs, ws, torch.float32, 128)
            row = {"shape": name, "N": n, "K": k, "M": m}
            candidates = {"triton": lambda: atom_kernels.fp8_block_scaled_mm.impl("triton")(xq, wq, xs, ws, torch.bfloat16, 128),
                          "scaled_mm": lambda: scaled_mm(xq, xs, wq, ws)}
            if n % 128:
                candidates["scaled_mm_padded"] = lambda: scaled_mm(xq, xs, wq_padded, ws)[:, :n]
            original = gemm._gemm_config

            def tiled():
                bm, bn = small_tiles(m, n)
                gemm._gemm_config = lambda mm, *rest: {**original(mm, *rest), "BLOCK_M": bm, "BLOCK_N": bn,
                                                        "num_warps": 8 if bm * bn >= 128 * 128 else 4}
                try:
                    return atom_kernels.fp8_block_scaled_mm.impl("triton")(xq, wq, xs, ws, torch.bfloat16, 128)
                finally:
                    gemm._gemm_config = original

            candidates["triton_fill_sms"] = tiled
            for label, fn in candidates.items():
                try:
                    out = fn()
                    row[f"{label}_err"] = ((out.float() - ref).abs().max() / ref.abs().max()).item()
                    row[f"{label}_us"] = 1e3 * triton.testing.do_bench_cudagraph(fn, rep=20)
                except Exception as exc:  # noqa: BLE001 (recorded per row)
                    row[f"{label}_error"] = repr(exc)[:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = os.path.join(os.environ.get("OUT", "/tmp"), "fp8-block-library.json")
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
