"""A random gpt-oss checkpoint of full size in the published MXFP4 layout, for benchmarks.

    python random_mxfp4_checkpoint.py --config ../models/gpt-oss-20b-mxfp4.json --out DIR [--layers N]

vLLM's dummy loader leaves integer parameters uninitialised (``torch.empty``), and its Hopper MXFP4
path swizzles the expert weights away from the parameters at load, so dummy MXFP4 weights are not
the same in two engines. A real checkpoint is: both engines load the same bytes, and greedy
agreement means something. Experts: random e2m1 codes (uniform bytes) with e8m0 scales of 2^-7, so a
2880-wide dot product of unit inputs stays near 1; every other weight bf16 N(0, 0.02), norms 1,
biases and sinks 0 (atom_core.testing.mxfp4_checkpoints documents the layout).
"""

import argparse
import json
import os

import torch
from safetensors.torch import save_file

from atom_core.testing.mxfp4_checkpoints import BLOCK, E8M0_BIAS, GPT_OSS_QUANTIZATION_CONFIG

SCALE_EXPONENT = -7


def layer_tensors(config: dict, layer: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    experts, heads, kv_heads, head_dim = (config["num_local_experts"], config["num_attention_heads"],
                                          config["num_key_value_heads"], config["head_dim"])

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    def zeros(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=torch.bfloat16)

    def expert_blocks(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = torch.randint(0, 256, (experts, rows, cols // BLOCK, BLOCK // 2), generator=generator,
                               dtype=torch.uint8)
        scales = torch.full((experts, rows, cols // BLOCK), E8M0_BIAS + SCALE_EXPONENT, dtype=torch.uint8)
        return blocks, scales

    p = f"model.layers.{layer}."
    gate_up_blocks, gate_up_scales = expert_blocks(2 * inter, hidden)
    down_blocks, down_scales = expert_blocks(hidden, inter)
    return {
        p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        p + "self_attn.q_proj.weight": normal(heads * head_dim, hidden),
        p + "self_attn.q_proj.bias": zeros(heads * head_dim),
        p + "self_attn.k_proj.weight": normal(kv_heads * head_dim, hidden),
        p + "self_attn.k_proj.bias": zeros(kv_heads * head_dim),
        p + "self_attn.v_proj.weight": normal(kv_heads * head_dim, hidden),
        p + "self_attn.v_proj.bias": zeros(kv_heads * head_dim),
        p + "self_attn.o_proj.weight": normal(hidden, heads * head_dim),
        p + "self_attn.o_proj.bias": zeros(hidden),
        p + "self_attn.sinks": torch.zeros(heads, dtype=torch.bfloat16),
        p + "mlp.router.weight": normal(experts, hidden),
        p + "mlp.router.bias": zeros(experts),
        p + "mlp.experts.gate_up_proj_blocks": gate_up_blocks,
        p + "mlp.experts.gate_up_proj_scales": gate_up_scales,
        p + "mlp.experts.gate_up_proj_bias": zeros(experts, 2 * inter),
        p + "mlp.experts.down_proj_blocks": down_blocks,
        p + "mlp.experts.down_proj_scales": down_scales,
        p + "mlp.experts.down_proj_bias": zeros(experts, hidden),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=None, help="the first N layers only (reduced depth)")
    args = parser.parse_args()
    config = json.load(open(args.config))
    config["quantization_config"] = GPT_OSS_QUANTIZATION_CONFIG
    if args.layers:
        config["num_hidden_layers"] = args.layers
        config["layer_types"] = config["layer_types"][: args.layers]
    os.makedirs(args.out, exist_ok=True)
    json.dump(config, open(os.path.join(args.out, "config.json"), "w"), indent=1)
    generator = torch.Generator().manual_seed(0)
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    weight_map = {}

    def write(shard: str, tensors: dict[str, torch.Tensor]) -> None:
        save_file(tensors, os.path.join(args.out, shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))

    write("embeddings.safetensors", {
        "model.embed_tokens.weight": (torch.randn(vocab, hidden, generator=generator) * 0.02).to(torch.bfloat16),
        "lm_head.weight": (torch.randn(vocab, hidden, generator=generator) * 0.02).to(torch.bfloat16),
        "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
    })
    for layer in range(config["num_hidden_layers"]):
        write(f"layer-{layer:03d}.safetensors", layer_tensors(config, layer, generator))
    index = {"metadata": {}, "weight_map": weight_map}
    json.dump(index, open(os.path.join(args.out, "model.safetensors.index.json"), "w"))
    print(f"wrote {len(weight_map)} tensors to {args.out}")


if __name__ == "__main__":
    main()
