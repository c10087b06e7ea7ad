"""GPU benchmark: fused MoE (with the shipped tile tables), its sort, and routing, ATOM against vLLM
0.26.0 across token counts, from one token (decode at batch 1) to 8192 (a prefill chunk).

    python benchmarks/kernels/sweep_tokens.py --out sweep-tokens.json

``bench_kernels.py`` times one decode and one prefill size per op; this fills in the sizes between,
where the tuned tables switch tiles and the sort switches from one program to three launches.
CUDA-graph replays, median microseconds; ratio = ATOM / vLLM (< 1: ATOM is faster).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from triton.testing import do_bench_cudagraph

MOE_MODELS = {  # experts, top_k, hidden, intermediate (as in bench_kernels.MODELS)
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "deepseek-v2-lite": (64, 6, 2048, 1408),
}
TOKENS = (1, 16, 128, 512, 2048, 8192)


def graph_us(fn) -> float:
    return do_bench_cudagraph(fn, rep=40, return_mode="median") * 1e3


def moe_rows(ak, moe):
    from vllm.model_executor.layers.fused_moe import fused_experts
    from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size

    from atom_kernels.moe_align import moe_align_block_size_triton

    for model, (experts, top_k, hidden, inter) in MOE_MODELS.items():
        w13 = torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=torch.bfloat16)
        w2 = torch.randn(experts, hidden, inter, device="cuda", dtype=torch.bfloat16)
        w13 *= hidden**-0.5
        w2 *= inter**-0.5
        key = moe.moe_shape_key(experts, hidden, inter, top_k, torch.bfloat16)
        for tokens in TOKENS:
            x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
            weights, ids = ak.topk_softmax(torch.randn(tokens, experts, device="cuda"), top_k, True)
            args = (x, w13, w2, weights, ids)
            block_m = moe.moe_config(key, tokens, experts, top_k, x)["BLOCK_M"]
            ours, theirs = graph_us(lambda: ak.fused_moe(*args)), graph_us(lambda: fused_experts(*args))
            diff = (ak.fused_moe(*args).float() - fused_experts(*args).float()).abs().max().item()
            yield {
                "op": "fused_moe",
                "model": model,
                "tokens": tokens,
                "ours_us": ours,
                "vllm_us": theirs,
                "ratio": ours / theirs,
                "max_abs_diff": diff,
                "block_m": block_m,
                "sort_ours_us": graph_us(lambda: moe_align_block_size_triton(ids, experts, block_m)),
                "sort_vllm_us": graph_us(lambda: moe_align_block_size(ids, block_m, experts)),
            }


def routing_rows(ak, ops):
    for model, (experts, top_k, _, _) in MOE_MODELS.items():
        for tokens in TOKENS:
            logits = torch.randn(tokens, experts, device="cuda")
            weights = torch.empty(tokens, top_k, device="cuda")
            ids, token_ids = (torch.empty_like(weights, dtype=torch.int32) for _ in range(2))
            ours = graph_us(lambda: ak.topk_softmax(logits, top_k, True))
            theirs = graph_us(lambda: ops.topk_softmax(weights, ids, token_ids, logits, True))
            yield {"op": "topk_softmax", "model": model, "tokens": tokens, "ours_us": ours,
                   "vllm_us": theirs, "ratio": ours / theirs}
    for tokens in TOKENS:  # DeepSeek-V2-Lite's experts with V3's noaux_tc routing: 8 groups, 4 kept
        logits = torch.randn(tokens, 64, device="cuda")
        bias = torch.randn(64, device="cuda") * 0.01
        ours = graph_us(lambda: ak.grouped_topk(logits, 6, 8, 4, True, "sigmoid", bias, 2.5))
        theirs = graph_us(lambda: ops.grouped_topk(logits, 8, 4, 6, True, 2.5, bias, 1))
        yield {"op": "grouped_topk (sigmoid + bias)", "model": "deepseek-v2-lite", "tokens": tokens,
               "ours_us": ours, "vllm_us": theirs, "ratio": ours / theirs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("sweep-tokens.json"))
    args = parser.parse_args()
    from vllm import _custom_ops as ops
    from vllm.config import VllmConfig, set_current_vllm_config

    import atom_kernels as ak
    from atom_kernels import moe

    torch.manual_seed(0)
    report = {"device": torch.cuda.get_device_name(), "rows": []}
    with set_current_vllm_config(VllmConfig()):
        for row in [*moe_rows(ak, moe), *routing_rows(ak, ops)]:
            sort = (
                f" | sort (BLOCK_M={row['block_m']}) {row['sort_ours_us']:6.2f} vs {row['sort_vllm_us']:6.2f}"
                if "block_m" in row
                else ""
            )
            print(
                f"{row['op']:30} {row['model']:16} {row['tokens']:6d} {row['ours_us']:9.2f} "
                f"{row['vllm_us']:9.2f} {row['ratio']:6.2f}{sort}",
                flush=True,
            )
            report["rows"].append(row)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
