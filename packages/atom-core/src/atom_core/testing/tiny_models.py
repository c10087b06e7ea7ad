"""Tiny random HF checkpoints built in code: config.json + model.safetensors + a trained tokenizer.

Used by the test suites and by the quick-start demo. The sizes are deliberately odd (hidden size not a
power of two, GQA, vocab not a multiple of 64) so that shape bugs show up. Weights are drawn with a
fixed seed and a larger-than-default std so that greedy decoding is not dominated by near-ties.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

# A small corpus for the BPE tokenizer; the content only needs to give a few hundred merges.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "ATOM serves large language models through vLLM and SGLang.",
    "Paged attention stores keys and values in fixed-size blocks.",
    "Mixture of experts routes every token to a few experts.",
    "Tensor parallelism splits each matrix across several devices.",
    "Rotary position embeddings rotate queries and keys by position.",
    "Once upon a time there was a tiny model that wanted to talk.",
    "def forward(self, input_ids, positions): return self.model(input_ids, positions)",
    "0123456789 + - * / = ( ) [ ] { } < > , . ; : ! ? ' \"",
] * 20

VOCAB_SIZE = 499

_BASE: dict[str, Any] = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=80,
    intermediate_size=136,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=1024,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)

# The Gated DeltaNet / full-attention layers of the hybrid models (Qwen3-Next, Qwen3.5): linear
# attention with 2 key and 4 value heads of different sizes (16 / 24), alternating with full attention.
HYBRID_LAYERS: dict[str, Any] = dict(
    num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=24,
    linear_conv_kernel_dim=4,
)

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen3ForCausalLM": dict(model_type="qwen3", rope_theta=10000.0),
    # Not implemented by ATOM: the fallback-to-vLLM tests use it.
    "Qwen2ForCausalLM": dict(model_type="qwen2", rope_theta=10000.0, hidden_size=128),
    "Qwen3MoeForCausalLM": dict(
        model_type="qwen3_moe",
        rope_theta=10000.0,
        num_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=48,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[1],
    ),
    # llama3 rope scaling with a short original context, so that the rescaled wavelengths (16 to 64
    # positions) matter at test lengths; q/k/v/o and MLP biases.
    "LlamaForCausalLM": dict(
        model_type="llama",
        attention_bias=True,
        mlp_bias=True,
        rope_parameters=dict(
            rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
            high_freq_factor=4.0, original_max_position_embeddings=64,
        ),
    ),
    # Every layer slides over 16 tokens (shorter than the longer test prompts).
    "MixtralForCausalLM": dict(
        model_type="mixtral",
        rope_theta=10000.0,
        intermediate_size=48,
        num_local_experts=6,
        num_experts_per_tok=2,
        sliding_window=16,
    ),
    # Partial rotary (half the head), QK-norm, q/k/v bias, first layer dense, shared expert, sigmoid
    # routing over 4 groups (best 2 kept) steered by e_score_correction_bias, routed scaling.
    "Glm4MoeForCausalLM": dict(
        model_type="glm4_moe",
        rope_theta=10000.0,
        partial_rotary_factor=0.5,
        use_qk_norm=True,
        attention_bias=True,
        first_k_dense_replace=1,
        n_routed_experts=8,
        num_experts_per_tok=3,
        moe_intermediate_size=48,
        n_shared_experts=1,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        num_nextn_predict_layers=0,
    ),
    # MLA without q LoRA (as DeepSeek-V2-Lite): kv_lora_rank 40, per head nope 16 + rope 8 and v 20
    # (q/k and v head dims differ); first layer dense; softmax routing limited to the best 2 of 4
    # expert groups, 2 shared experts, routed scaling; YaRN rope with DeepSeek's mscale (the 4x
    # interpolated low frequencies matter at test lengths). num_key_value_heads = heads: HF repeats
    # the expanded heads otherwise.
    "DeepseekV2ForCausalLM": dict(
        model_type="deepseek_v2",
        num_key_value_heads=4,
        q_lora_rank=None,
        kv_lora_rank=40,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        head_dim=8,  # HF's name for the rope dim of MLA configs
        v_head_dim=20,
        first_k_dense_replace=1,
        n_routed_experts=8,
        num_experts_per_tok=3,
        moe_intermediate_size=48,
        n_shared_experts=2,
        topk_method="group_limited_greedy",
        n_group=4,
        topk_group=2,
        norm_topk_prob=False,
        routed_scaling_factor=1.5,
        rope_parameters=dict(
            rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=256,
            mscale=0.707, mscale_all_dim=0.707, beta_fast=32.0, beta_slow=1.0,
        ),
    ),
    # DeepSeek-V3 / Kimi-K2 style: q LoRA (rank 48), sigmoid noaux_tc routing over 4 groups (best 2)
    # steered by e_score_correction_bias, renormalised and scaled, 1 shared expert, interleaved
    # rope pairs; YaRN whose mscale != mscale_all_dim, so cos/sin carry a magnitude as well.
    "DeepseekV3ForCausalLM": dict(
        model_type="deepseek_v3",
        num_key_value_heads=4,
        q_lora_rank=48,
        kv_lora_rank=40,
        qk_nope_head_dim=16,
        qk_rope_head_dim=8,
        head_dim=8,  # HF's name for the rope dim of MLA configs
        v_head_dim=20,
        first_k_dense_replace=1,
        n_routed_experts=8,
        num_experts_per_tok=3,
        moe_intermediate_size=48,
        n_shared_experts=1,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
        num_nextn_predict_layers=0,
        rope_interleave=True,
        rope_parameters=dict(
            rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=256,
            mscale=1.0, mscale_all_dim=0.8, beta_fast=32.0, beta_slow=1.0,
        ),
    ),
    # Sliding (window 8) and full attention alternate; sinks; q/k/v/o bias; router bias; experts
    # with biases and a clamped SwiGLU whose limit (0.5) the activations reach; yarn rope.
    "GptOssForCausalLM": dict(
        model_type="gpt_oss",
        intermediate_size=48,
        num_local_experts=6,
        num_experts_per_tok=2,
        sliding_window=8,
        swiglu_limit=0.5,
        rope_parameters=dict(
            rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0, beta_slow=1.0,
            truncate=False, original_max_position_embeddings=32,
        ),
    ),
    # Gated DeltaNet and gated full attention per layer_types; 2 key / 4 value heads of different
    # sizes (16 / 24); partial rotary (a quarter of the head); a shared expert with its sigmoid gate;
    # layer 2 dense.
    "Qwen3NextForCausalLM": dict(
        model_type="qwen3_next",
        rope_theta=10000.0,
        partial_rotary_factor=0.25,
        **HYBRID_LAYERS,
        num_experts=6,
        num_experts_per_tok=2,
        moe_intermediate_size=48,
        shared_expert_intermediate_size=40,
        norm_topk_prob=True,
        mlp_only_layers=[2],
    ),
    # Qwen3.5's language model: Qwen3-Next's hybrid with unfused Gated DeltaNet projections, a dense
    # MLP and interleaved M-RoPE over half the head (8 frequencies: 3 time, 3 height, 2 width).
    "Qwen3_5ForCausalLM": dict(
        model_type="qwen3_5_text",
        **HYBRID_LAYERS,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5,
                             mrope_section=[3, 3, 2], mrope_interleaved=True),
    ),
}
# Qwen3.5-MoE's: the same with 6 experts (top 2) and a gated shared expert on every layer.
TINY_CONFIGS["Qwen3_5MoeForCausalLM"] = dict(
    TINY_CONFIGS["Qwen3_5ForCausalLM"], model_type="qwen3_5_moe_text", num_experts=6, num_experts_per_tok=2,
    moe_intermediate_size=48, shared_expert_intermediate_size=40,
)


def tiny_hf_config(architecture: str, **overrides: Any):
    from atom_core.testing.hf_classes import transformers_config_class

    settings = {**_BASE, **TINY_CONFIGS[architecture], **overrides}
    model_type = settings.pop("model_type")
    config_class = transformers_config_class(model_type)
    if model_type == "gpt_oss" and not hasattr(config_class(), "swiglu_limit"):
        # transformers before 5.19 (5.17 on the GPU image, vLLM 0.31's bound) fixes GPT-OSS's SwiGLU
        # limit at the published 7.0 in its experts and ignores the config's: there the tiny model
        # takes 7.0, so that HF's reference stays the model its config.json describes.
        settings["swiglu_limit"] = 7.0
    config = config_class(**settings)
    config.architectures = [architecture]
    return config


def build_tokenizer(out_dir: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        unk_token="<unk>",
    )
    fast.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    fast.save_pretrained(out_dir)


def build_tiny_model(architecture: str, out_dir: str, seed: int = 0, std: float = 0.1,
                     random_norms: bool = False, **overrides: Any) -> str:
    """Write a tiny random ``architecture`` checkpoint to ``out_dir`` (fp32) and return the path.
    ``random_norms``: norm weights too get noise of ``std`` around HF's init (ones, or zeros for
    zero-centred norms), so that a test sees how they are loaded and applied."""
    from transformers import AutoModelForCausalLM

    config = tiny_hf_config(architecture, **overrides)
    config.initializer_range = std
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # HF initialises biases (GLM's e_score_correction_bias included) to zero: random ones make the
    # parity tests check that they are loaded and applied.
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith("bias"):
                tensor.normal_(0.0, std)
            elif random_norms and name.endswith("norm.weight"):
                tensor.add_(torch.randn_like(tensor) * std)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    build_tokenizer(out_dir)
    # Generation stops only on the caller's max_tokens: parity tests compare fixed-length outputs.
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"do_sample": False, "bos_token_id": 1, "eos_token_id": None}, f)
    return out_dir
