"""A random Hugging Face checkpoint of full size for a model shape in benchmarks/models, for benchmarks:
bf16, or block FP8 where the shape's config declares it (``quant_method: fp8`` with ``weight_block_size``).

    python random_checkpoint.py --config ../models/deepseek-v2-lite.json --out DIR [--layers N] [--seed S]

(``--layers`` cuts a vision-language model's language model, in its ``text_config``.)

vLLM's dummy loader fills every parameter from U(-1e-3, 1e-3), seeded alike for each parameter, so a
MoE router's logits are near-ties and routing collapses onto a few experts, and onto different ones in
two engines whose parameter layouts differ (on an H200, vLLM alone's MoE at decode batch 256 read far
fewer experts than it could). Weights on disk drawn from N(0, 0.02) route over many experts, and both
engines load the same bytes.

The tensors are the ones HF transformers' ``save_pretrained`` writes for the config: the model class is
built on the meta device, tied weights dropped (``tie_word_embeddings``) and the state dict turned back
into the published layout (transformers 5, which vLLM 0.26 requires, fuses MoE experts in memory;
checkpoints keep one tensor per expert). Matrices N(0, 0.02), norm weights 1, biases (DeepSeek-V3's
``e_score_correction_bias`` too) and every other vector 0, each in the dtype HF gives it: bf16, or fp32
where HF keeps fp32. Made one tensor at a time, on the GPU when there is one, into shards of at most 4 GB.
A block-FP8 config gets every decoder projection quantized as the published checkpoints ship it (e4m3
weight and ``weight_scale_inv`` per block: atom_core.testing.fp8_checkpoints); embeddings, norms,
routers and ``lm_head`` stay bf16.
"""

import argparse
import json
import os

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
from transformers.core_model_loading import revert_weight_conversion
from transformers.modeling_utils import remove_tied_weights_from_state_dict

from atom_core.testing.fp8_checkpoints import QUANTIZED_WEIGHT, quantize_block_fp8

SHARD_BYTES = 4 * 2**30
STD = 0.02


def read_config(path: str, layers: int | None) -> dict:
    """The config to write: ``path``'s, cut to its first ``layers`` layers if given."""
    with open(path) as f:
        config = json.load(f)
    if "quantization_config" in config and fp8_block(config) is None:
        raise SystemExit(f"{path}: this writer makes bf16 and block-FP8 checkpoints only "
                         "(gpt-oss MXFP4: random_mxfp4_checkpoint.py)")
    if layers:
        language = config.get("text_config", config)
        language["num_hidden_layers"] = layers
        if "layer_types" in language:
            language["layer_types"] = language["layer_types"][:layers]
    return config


def fp8_block(config: dict) -> tuple[int, int] | None:
    """The FP8 weight block a config declares, or None (bf16)."""
    quantization = config.get("quantization_config", {})
    block = quantization.get("weight_block_size")
    return tuple(block) if quantization.get("quant_method") == "fp8" and block else None


def checkpoint_layout(config: dict) -> dict[str, torch.Tensor]:
    """Name -> meta tensor (shape and dtype) of every tensor a checkpoint of ``config`` holds, as
    ``save_pretrained`` names and shapes them."""
    hf_config = AutoConfig.for_model(**config)
    # A vision-language model (its language model under text_config) is written whole, vision tower too.
    model_class = AutoModelForImageTextToText if "text_config" in config else AutoModelForCausalLM
    with torch.device("meta"):
        model = model_class.from_config(hf_config, dtype=torch.bfloat16)
    state = model.state_dict()
    # Persistent buffers (DeepSeek-V3's e_score_correction_bias in transformers 5.12, SGLang's) are
    # checkpoint tensors but not parameters, which 5.12's tied-weight pass takes every entry to be.
    buffers = {name: state.pop(name) for name, _ in model.named_buffers() if name in state}
    return revert_weight_conversion(model, {**remove_tied_weights_from_state_dict(state, model), **buffers})


def random_tensor(name: str, meta: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Matrices N(0, 0.02) (on the generator's device); norm weights 1; biases (gpt-oss's per-expert
    ones are matrices) and other vectors 0."""
    if meta.dim() >= 2 and not name.endswith("bias"):
        tensor = torch.empty(meta.shape, dtype=meta.dtype, device=generator.device)
        return tensor.normal_(0, STD, generator=generator)
    fill = 1 if name.endswith("norm.weight") else 0
    return torch.full(meta.shape, fill, dtype=meta.dtype)


def checkpoint_tensors(name: str, meta: torch.Tensor, generator: torch.Generator,
                       block: tuple[int, int] | None) -> dict[str, torch.Tensor]:
    """The tensor ``name`` on the CPU, or with ``block`` and a decoder projection, its block-FP8 form
    and ``weight_scale_inv``."""
    tensor = random_tensor(name, meta, generator)
    if block and QUANTIZED_WEIGHT.match(name):
        weight, scale = quantize_block_fp8(tensor, block)
        return {name: weight.cpu(), f"{name.removesuffix('.weight')}.weight_scale_inv": scale.cpu()}
    return {name: tensor.cpu()}


def plan_shards(layout: dict[str, torch.Tensor], limit: int) -> list[list[str]]:
    """Tensor names grouped in order into shards of at most ``limit`` bytes (or one tensor)."""
    shards, size = [[]], 0
    for name, meta in layout.items():
        nbytes = meta.numel() * meta.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True, help="an HF config.json, e.g. ../models/deepseek-v2-lite.json")
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=None, help="the first N layers only (reduced depth)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config = read_config(args.config, args.layers)
    layout = checkpoint_layout(config)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device).manual_seed(args.seed)
    block = fp8_block(config)
    shards = plan_shards(layout, SHARD_BYTES)
    weight_map, total_size = {}, 0
    for number, names in enumerate(shards, 1):
        shard = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name in names:
            tensors.update(checkpoint_tensors(name, layout[name], generator, block))
        save_file(tensors, os.path.join(args.out, shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))
        total_size += sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
    with open(os.path.join(args.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total_size}, "weight_map": weight_map}, f, indent=1)
    print(f"wrote {len(weight_map)} tensors, {total_size / 1e9:.1f} GB in {len(shards)} shards, to {args.out}")


if __name__ == "__main__":
    main()
