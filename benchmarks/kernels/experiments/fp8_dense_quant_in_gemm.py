"""The block-FP8 dense GEMM quantizing its bf16 input itself against the quantization launch before it.

    PYTHONPATH=packages/atom-kernels/src python3 fp8_dense_quant_in_gemm.py OUT.json

At the widths of ``fp8_split_k.SHAPES`` and 1-64 rows: ``per_group_quant_fp8`` + ``gemm._launch_fp8_gemm``
(the path of an FP8 linear whose input no norm or activation kernel quantized, e.g. ``o_proj``) against
``gemm._launch_fp8_gemm`` on the bf16 input (``a_scale`` None: quantized per K step in the kernel, the
same codes). Split K as shipped. Random bf16 inputs, fp8 weights and scales; CUDA-graph timings, us;
the two outputs compared (``equal``). Result: ``fp8-dense-quant-in-gemm-h200.json``.
"""

import json
import os
import sys

import torch
import triton
from triton.testing import do_bench_cudagraph

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp8_split_k import FP8, SHAPES, scales  # noqa: E402

from atom_kernels import gemm, per_group_quant_fp8  # noqa: E402

ROWS = (1, 4, 16, 32, 64)


def us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    return round(do_bench_cudagraph(fn, rep=20) * 1000, 2)


def main(out_path: str) -> None:
    torch.manual_seed(0)
    out = {"device": torch.cuda.get_device_name(), "rows": []}
    for name, (n, k) in SHAPES.items():
        b = (torch.randn(n, k, device="cuda") * 0.05).to(FP8)
        b_scale = scales(triton.cdiv(n, 128), k // 128)
        for m in ROWS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)

            def launched():
                x_q, x_scale = per_group_quant_fp8(x, 128)
                return gemm._launch_fp8_gemm(x_q, b, x_scale, b_scale, torch.bfloat16, None, True, 128)

            def fused():
                return gemm._launch_fp8_gemm(x, b, None, b_scale, torch.bfloat16, None, True, 128)

            row = {"shape": name, "n": n, "k": k, "m": m, "equal": torch.equal(launched(), fused()),
                   "launch_us": us(launched), "fused_us": us(fused)}
            row["ratio"] = round(row["fused_us"] / row["launch_us"], 3)
            print(row, flush=True)
            out["rows"].append(row)
    with open(out_path, "w") as f:
        json.dump(out, f, indent=0)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp8-dense-quant-in-gemm.json")
