"""Block-FP8 fused MoE: the GEMMs quantizing their own inputs against a quantization launch per GEMM.

    python benchmarks/kernels/bench_moe_input_quant.py --out FILE.json

For each block-FP8 shape of tune_kernels.py (Qwen3-30B-A3B-FP8, DeepSeek-V3 at TP 1) and token count,
the whole op (atom_kernels.moe.run_fused_moe with this GPU's packaged tile table) is timed both ways
with the same tiles, as CUDA-graph replays. ``moe.FUSED_INPUT_QUANT_MAX_TOKENS`` is the bound up to
which the op fuses by default; the rows above it show what fusing there would cost or save. Needs
only torch, triton and atom-kernels (no vLLM).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from tune_kernels import FP8, MOE_FP8_MODELS, MoeShape, graph_us

TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def row(model: str, dims: tuple[int, int, int, int], num_tokens: int) -> dict:
    from atom_kernels import moe

    s = MoeShape(dims, num_tokens, FP8)
    args, quant = (s.x, s.w13, s.w2, s.weights, s.ids), s.quant_args()
    config = moe.moe_config(moe.moe_shape_key(s.experts, s.hidden, s.inter, s.top_k, FP8),
                            num_tokens, s.experts, s.top_k, s.x)

    def run(fused: bool) -> torch.Tensor:
        return moe.run_fused_moe(*args, config, **quant, quantize_in_gemm=fused)

    fused, separate = run(True).float(), run(False).float()
    return {
        "model": model,
        "tokens": num_tokens,
        "BLOCK_M": config["BLOCK_M"],
        "gemms_quantizing": [gemm for gemm in ("gate_up", "down")
                             if moe.quantizes_input(config[gemm], s.block_size)],
        "fused_us": graph_us(lambda: run(True)),
        "separate_us": graph_us(lambda: run(False)),
        "max_abs_diff": (fused - separate).abs().max().item(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_moe_input_quant needs a CUDA GPU")
    from atom_kernels import moe

    report = {"device": torch.cuda.get_device_name(),
              "default_max_tokens": moe.FUSED_INPUT_QUANT_MAX_TOKENS, "rows": []}
    torch.manual_seed(0)
    for model, dims in MOE_FP8_MODELS.items():
        for num_tokens in TOKENS:
            r = row(model, dims, num_tokens)
            report["rows"].append(r)
            print(f"{model:14s} {num_tokens:5d} tok  in-GEMM {r['fused_us']:8.1f} us  separate "
                  f"{r['separate_us']:8.1f} us  ratio {r['fused_us'] / r['separate_us']:.3f}  "
                  f"{'+'.join(r['gemms_quantizing']) or 'none'}  diff {r['max_abs_diff']:.1e}", flush=True)
            with open(args.out, "w") as f:  # after each row: a cut-off run keeps what it measured
                json.dump(report, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
