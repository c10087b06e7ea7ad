"""Split K summed by a second kernel against each tile's last split summing in the GEMM itself.

    PYTHONPATH=packages/atom-kernels/src python3 fp8_serial_split_k.py OUT.json

At the widths of ``fp8_split_k.SHAPES`` and 1-256 rows where the shipped rule splits K:
``gemm._launch_fp8_gemm`` (block-scaled, bf16 out, the rule's split) with ``serial_sum`` False (the
sum kernel) and True (arrival counters, the last split sums). In a CUDA graph a small dependent
launch costs several microseconds at these sizes, which the serial sum saves. Outputs compared bit
for bit (``equal``); CUDA-graph timings, us.
"""

import json
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_scales_ahead import scales, us  # noqa: E402
from fp8_split_k import FP8, ROWS, SHAPES  # noqa: E402

from atom_kernels import gemm  # noqa: E402


def main(out_path: str) -> None:
    torch.manual_seed(0)
    device = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(), "rows": []}
    for name, (n, k) in SHAPES.items():
        b = (torch.randn(n, k, device="cuda") * 0.05).to(FP8)
        b_scale = scales(triton.cdiv(n, 128), k // 128)
        for m in ROWS:
            config = gemm._gemm_config(m)
            tiles = triton.cdiv(m, config["BLOCK_M"]) * triton.cdiv(n, config["BLOCK_N"])
            split = gemm._split_k(tiles, triton.cdiv(k, 128), config["split_min_steps"], device)
            if split == 1:
                continue
            a, a_scale = torch.randn(m, k, device="cuda").to(FP8), scales(m, k // 128)
            run = {serial: (lambda serial=serial: gemm._launch_fp8_gemm(
                a, b, a_scale, b_scale, torch.bfloat16, None, True, 128, serial_sum=serial)) for serial in (False, True)}
            row = {"shape": name, "n": n, "k": k, "m": m, "split": split,
                   "equal": all(torch.equal(run[True](), run[False]()) for _ in range(20)),
                   "sum_kernel_us": us(run[False]), "serial_us": us(run[True])}
            row["ratio"] = round(row["serial_us"] / row["sum_kernel_us"], 3)
            print(row, flush=True)
            out["rows"].append(row)
    with open(out_path, "w") as f:
        json.dump(out, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp8-serial-split-k.json")
