"""Split K in the block-FP8 Triton GEMM: each split count against the chosen one and the library GEMM.

    PYTHONPATH=packages/atom-kernels/src python3 fp8_split_k.py OUT.json

For the FP8 linear widths of Qwen3-8B, Qwen3-30B-A3B and DeepSeek-V3 at TP 1 ([N, K] as vLLM fuses
them) and 1-256 rows: ``gemm._launch_fp8_gemm`` (block-scaled, bf16 out) with split counts 1-32 and
with its own choice (``auto``), and the library GEMM of ``fp8_block_scaled_mm_torchlib`` (torch._scaled_mm) at every row count
where N is a multiple of 128. Activations already quantized, so only the GEMMs are timed; random fp8 values and
scales; CUDA-graph timings, us; each split's fp32 output against the unsplit one
(``max_rel_diff_to_unsplit``, the largest over the splits of a row). Result: ``fp8-h200.json.gz[split-k]`` (behind ``gemm.SPLIT_K_*`` and the
rows at which the library GEMM takes over).
"""

import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_scales_ahead import scales, us  # noqa: E402

from atom_kernels import gemm  # noqa: E402

SHAPES = {
    "qwen3-8b qkv": (6144, 4096), "qwen3-8b o": (4096, 4096), "qwen3-8b gate_up": (24576, 4096),
    "qwen3-8b down": (4096, 12288), "qwen3-30b qkv": (5120, 2048), "qwen3-30b o": (2048, 4096),
    "v3 fused_qkv_a": (2112, 7168), "v3 kv_a": (576, 7168), "v3 q_b": (24576, 1536), "v3 o": (7168, 16384),
    "v3 shared gate_up": (4096, 7168), "v3 shared down": (7168, 2048), "v3 dense down": (7168, 18432),
}
ROWS = (1, 16, 64, 128, 256)
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
FP8 = torch.float8_e4m3fn


def main(out_path: str) -> None:
    torch.manual_seed(0)
    device = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
           "rows": []}
    for name, (n, k) in SHAPES.items():
        b = (torch.randn(n, k, device="cuda") * 0.05).to(FP8)
        b_scale = scales(triton.cdiv(n, 128), k // 128)
        for m in ROWS:
            a, a_scale = torch.randn(m, k, device="cuda").to(FP8), scales(m, k // 128)
            config = gemm._gemm_config(m)
            tiles = triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"])
            steps = triton.cdiv(k, 128)
            row = {"shape": name, "n": n, "k": k, "m": m, "tiles": tiles, "k_steps": steps,
                   "auto_split": gemm._split_k(tiles, steps, config["split_min_steps"], device), "us": {}}
            whole = gemm._launch_fp8_gemm(a, b, a_scale, b_scale, torch.float32, None, True, 128, 1)
            row["max_rel_diff_to_unsplit"] = 0.0
            for split in (*[s for s in SPLITS if s <= steps], None):
                split_out = gemm._launch_fp8_gemm(a, b, a_scale, b_scale, torch.float32, None, True, 128, split)
                diff = ((split_out - whole).abs().max() / whole.abs().max()).item()
                row["max_rel_diff_to_unsplit"] = max(row["max_rel_diff_to_unsplit"], diff)
                row["us"][str(split or "auto")] = us(
                    lambda: gemm._launch_fp8_gemm(a, b, a_scale, b_scale, torch.bfloat16, None, True, 128, split))
            if n % 128 == 0:  # the block recipe's shape rule; rows padded to 16 at any count
                row["us"]["torchlib"] = us(
                    lambda: gemm._library_mm(a, b, a_scale, b_scale.t(), torch.bfloat16))
            best = min(row["us"], key=row["us"].get)
            row["best"] = best
            print(name, m, "tiles", tiles, "auto", row["auto_split"], row["us"], "best", best,
                  "diff", f"{row['max_rel_diff_to_unsplit']:.1e}", flush=True)
            out["rows"].append(row)
            with open(out_path, "w") as f:
                json.dump(out, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp8-split-k.json")
