"""Architectures ATOM implements: HF architecture name -> ATOM model class, whether it is MoE,
whether it serves MXFP4 experts, whether some of its layers keep a recurrent state per sequence
(which a host must cache: the class then has ``recurrent_state_shapes(hf_config, tp_size)``), and
whether the architecture is a vision-language model whose language model ATOM serves."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelEntry:
    module: str
    class_name: str
    is_moe: bool
    # MXFP4 checkpoints as published (gpt-oss) quantize GPT-OSS's stacked experts; no other family
    # has them in that layout.
    mxfp4_experts: bool = False
    # AMD Quark's MXFP4 (W4A4) checkpoints of the family (amd/DeepSeek-R1-0528-MXFP4,
    # amd/Kimi-K2-Thinking-MXFP4): their MLPs and experts; attention must be left unquantized.
    quark_mxfp4: bool = False
    recurrent_state: bool = False
    # The architecture is a vision-language model: ATOM's class is its language model, reading the
    # text config; the host keeps the vision tower and the multimodal processing.
    vision_language: bool = False
    # A MoE family's HF config key of each routed expert's intermediate size.
    expert_intermediate_key: str = "moe_intermediate_size"


SUPPORTED_ARCHITECTURES: dict[str, ModelEntry] = {
    "DeepseekV2ForCausalLM": ModelEntry("atom_core.models.deepseek_v2", "DeepseekV2ForCausalLM", True),
    "DeepseekV3ForCausalLM": ModelEntry("atom_core.models.deepseek_v2", "DeepseekV3ForCausalLM", True,
                                        quark_mxfp4=True),
    "Glm4MoeForCausalLM": ModelEntry("atom_core.models.glm4_moe", "Glm4MoeForCausalLM", True),
    "GptOssForCausalLM": ModelEntry("atom_core.models.gpt_oss", "GptOssForCausalLM", True,
                                       mxfp4_experts=True, expert_intermediate_key="intermediate_size"),
    "LlamaForCausalLM": ModelEntry("atom_core.models.llama", "LlamaForCausalLM", False),
    "MixtralForCausalLM": ModelEntry("atom_core.models.mixtral", "MixtralForCausalLM", True,
                                     expert_intermediate_key="intermediate_size"),
    "Qwen3ForCausalLM": ModelEntry("atom_core.models.qwen3", "Qwen3ForCausalLM", False),
    "Qwen3MoeForCausalLM": ModelEntry("atom_core.models.qwen3_moe", "Qwen3MoeForCausalLM", True),
    "Qwen3_5ForConditionalGeneration": ModelEntry("atom_core.models.qwen3_5", "Qwen3_5ForCausalLM", False,
                                                  recurrent_state=True, vision_language=True),
    "Qwen3_5MoeForConditionalGeneration": ModelEntry("atom_core.models.qwen3_5", "Qwen3_5MoeForCausalLM", True,
                                                     recurrent_state=True, vision_language=True),
    "Qwen3NextForCausalLM": ModelEntry("atom_core.models.qwen3_next", "Qwen3NextForCausalLM", True,
                                       recurrent_state=True),
}


def get_model_class(architecture: str) -> type:
    entry = SUPPORTED_ARCHITECTURES.get(architecture)
    if entry is None:
        raise KeyError(
            f"ATOM has no implementation of {architecture!r}; "
            f"supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}"
        )
    return getattr(importlib.import_module(entry.module), entry.class_name)
