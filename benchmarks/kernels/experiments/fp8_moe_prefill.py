"""The block-FP8 fused MoE at prefill sizes taken apart, ATOM against vLLM 0.26's Triton FP8 MoE.

    PYTHONPATH=packages/atom-kernels/src python3 fp8_moe_prefill.py OUT.json [--shapes deepseek-v3:16384,...]

At 8192-16384 tokens vLLM's whole op took 0.76-0.95x ATOM's (``tune-logs-h200.log``, section
tune-fp8-prefill-h200-1afa1af), with near-identical kernels: the same K loop (a fresh dot per 128-wide K
step, scaled by the activations' and weights' block scales) and the same tiles on offer. What differs is
the gate/up GEMM's form: ATOM's program holds a gate and an up accumulator and applies SiLU * mul in its
epilogue (two dots of BLOCK_N a K step), vLLM's is one plain GEMM over the 2I stacked columns followed by
an activation launch; and vLLM groups 32 row blocks a weight column block (ATOM's tuner: 8). Timed, each
in a CUDA graph, µs:

* ``whole``: each engine's whole op (ATOM with this GPU's packaged table);
* ``gate_up`` / ``down``: each GEMM alone, ATOM's packaged tile, then ATOM with vLLM's tile
  (``vllm_tile``: its BLOCK_N halved for the gated form, which computes two column blocks) and with
  GROUP_M 32, then vLLM's kernel with its own config;
* ``gate_up_plain``: ATOM's kernel as one plain GEMM over the 2I columns (vLLM's form) with vLLM's tile,
  and ``silu_mul_quant``: the launch that form needs after it (``silu_and_mul_quant_fp8``), against the
  gated form's quantization launch ``quant_hidden`` (``quantize_activations`` of the I-wide rows).

The plain form's activation is checked against the gated form's output (``max_rel_diff``).
"""

import argparse
import json
import os
import sys

import torch
import triton.language as tl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from tune_kernels import FP8, MOE_FP8_MODELS, MoeShape, graph_us  # noqa: E402

from atom_kernels import moe  # noqa: E402
from atom_kernels.activation import silu_and_mul_quant_fp8  # noqa: E402

DEFAULT_SHAPES = "qwen3-30b-a3b:16384,deepseek-v3:8192,deepseek-v3:16384"
BLOCK = [128, 128]


def vllm_tiles(config: dict, gated: bool) -> dict:
    """vLLM's config in ATOM's tile keys (its BLOCK_N halved for ATOM's gated form)."""
    return {"BLOCK_N": config["BLOCK_SIZE_N"] // (2 if gated else 1), "BLOCK_K": config["BLOCK_SIZE_K"],
            "GROUP_M": config["GROUP_SIZE_M"], "num_warps": config["num_warps"],
            "num_stages": config["num_stages"]}


def vllm_gemms(s: MoeShape, config: dict):
    """vLLM's two GEMM launches on its own quantized inputs and alignment: (gate_up, down) callables."""
    from vllm.model_executor.layers.fused_moe.fused_moe import invoke_fused_moe_triton_kernel
    from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size
    from vllm.model_executor.layers.fused_moe.utils import moe_kernel_quantize_input

    entries, two_i = s.num_tokens * s.top_k, 2 * s.inter
    x_q, x_scale = moe_kernel_quantize_input(A=s.x, A_scale=None, quant_dtype=FP8, per_act_token_quant=False,
                                             block_shape=BLOCK)
    h_q, h_scale = moe_kernel_quantize_input(A=torch.randn(entries, s.inter, device="cuda", dtype=s.x.dtype),
                                             A_scale=None, quant_dtype=FP8, per_act_token_quant=False,
                                             block_shape=BLOCK)
    sorted_ids, expert_ids, padded = moe_align_block_size(s.ids, config["BLOCK_SIZE_M"], s.experts)
    cache1 = torch.empty(s.num_tokens, s.top_k, two_i, device="cuda", dtype=s.x.dtype)
    cache3 = torch.empty(s.num_tokens, s.top_k, s.hidden, device="cuda", dtype=s.x.dtype)
    common = {"config": config, "compute_type": tl.bfloat16, "use_fp8_w8a8": True, "use_int8_w8a8": False,
              "use_int8_w8a16": False, "use_int4_w4a16": False, "per_channel_quant": False,
              "block_shape": BLOCK}

    def gate_up():
        invoke_fused_moe_triton_kernel(x_q, s.w13, cache1, x_scale, s.w13_scale, s.weights, sorted_ids,
                                       expert_ids, padded, False, s.top_k, **common)

    def down():
        invoke_fused_moe_triton_kernel(h_q, s.w2, cache3, h_scale, s.w2_scale, s.weights, sorted_ids,
                                       expert_ids, padded, True, 1, **common)

    return gate_up, down


def plain_gate_up(s: MoeShape, block_m: int, tiles: dict):
    """ATOM's kernel as one plain GEMM over w13's 2I rows: (launch, its [entries, 2I] output)."""
    sorted_ids, block_expert = s.aligned[block_m]
    (a, a_scale), entries = s.gate_up_input, s.num_tokens * s.top_k
    out = torch.empty(entries, 2 * s.inter, device="cuda", dtype=s.x.dtype)

    def run():
        moe.launch_moe_gemm(a, s.w13, None, out, None, sorted_ids, block_expert, entries, s.top_k, block_m,
                            tiles, a_scale=a_scale, w_scale=s.w13_scale, block_size=s.block_size)

    return run, out


def measure(model: str, tokens: int, rows: list) -> None:
    from vllm.model_executor.layers.fused_moe import fused_experts
    from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config
    from vllm.model_executor.layers.fused_moe.fused_moe import try_get_optimal_moe_config

    s = MoeShape(MOE_FP8_MODELS[model], tokens, FP8)
    key = moe.moe_shape_key(s.experts, s.hidden, s.inter, s.top_k, FP8)
    packaged = moe.moe_config(key, tokens, s.experts, s.top_k, s.x)
    vconfig = try_get_optimal_moe_config(s.w13.shape, s.w2.shape, s.top_k, "fp8_w8a8", tokens, block_shape=BLOCK)

    def add(what: str, tile: str, us: float, **extra) -> None:
        row = {"model": model, "tokens": tokens, "what": what, "tile": tile, "us": round(us, 1), **extra}
        rows.append(row)
        print(json.dumps(row), flush=True)

    quant_config = fp8_w8a8_moe_quant_config(w1_scale=s.w13_scale, w2_scale=s.w2_scale, block_shape=BLOCK)
    add("whole", "atom packaged", s.whole_op_us(packaged))
    add("whole", "vllm", graph_us(lambda: fused_experts(s.x, s.w13, s.w2, s.weights, s.ids,
                                                        quant_config=quant_config)))
    block_m = vconfig["BLOCK_SIZE_M"]
    for gated, name in ((True, "gate_up"), (False, "down")):
        variants = {"atom packaged": (packaged["BLOCK_M"], packaged[name]),
                    "atom vllm_tile": (block_m, vllm_tiles(vconfig, gated)),
                    "atom vllm_tile GROUP_M 8": (block_m, {**vllm_tiles(vconfig, gated), "GROUP_M": 8}),
                    "atom packaged GROUP_M 32": (packaged["BLOCK_M"], {**packaged[name], "GROUP_M": 32})}
        for tile, (m, tiles) in variants.items():
            add(name, f"{tile} BLOCK_M {m} {tiles}", graph_us(s.gemm(m, gated, tiles)))
    vllm_gate_up, vllm_down = vllm_gemms(s, vconfig)
    add("gate_up", f"vllm {vconfig}", graph_us(vllm_gate_up))
    add("down", f"vllm {vconfig}", graph_us(vllm_down))

    tiles = vllm_tiles(vconfig, False)
    s.gemm(block_m, True, vllm_tiles(vconfig, True))()  # fills s.hidden_states, the gated form's output
    run, out = plain_gate_up(s, block_m, tiles)
    run()
    gated_out = s.hidden_states.float()
    plain_act = torch.nn.functional.silu(out[:, :s.inter].float()) * out[:, s.inter:].float()
    diff = ((plain_act - gated_out).abs().max() / gated_out.abs().max()).item()
    add("gate_up_plain", f"atom vllm_tile BLOCK_M {block_m} {tiles}", graph_us(run), max_rel_diff=diff)
    add("silu_mul_quant", "silu_and_mul_quant_fp8, 128-groups", graph_us(lambda: silu_and_mul_quant_fp8(out, 128)))
    add("quant_hidden", "quantize_activations, 128-groups",
        graph_us(lambda: moe.quantize_activations(s.hidden_states, s.block_size, "triton")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="MODEL:TOKENS,... (models of MOE_FP8_MODELS)")
    args = parser.parse_args()
    torch.manual_seed(0)
    report = {"device": torch.cuda.get_device_name(), "rows": []}
    for spec in args.shapes.split(","):
        model, tokens = spec.split(":")
        measure(model, int(tokens), report["rows"])
        with open(args.out, "w") as f:
            json.dump(report, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
