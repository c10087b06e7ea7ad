"""VllmConfig -> atom_core Config, as one pure function.

| ATOM Config field        | from vLLM                                         |
|--------------------------|---------------------------------------------------|
| model                    | model_config.model                                |
| hf_config, torch_dtype   | model_config.hf_text_config, model_config.dtype   |
|                          | (the language model's: vLLM's hf_config itself    |
|                          | for text models, its text_config for VLMs, with   |
|                          | the checkpoint's quantization_config)             |
| max_model_len            | model_config.max_model_len                        |
| compilation level        | compilation_config.mode (0-3, same numbering), or |
|                          | additional_config["atom_compilation_level"]       |
"""

from __future__ import annotations

from typing import Any

from atom_core.config import CompilationConfig, CompilationLevel, Config
from atom_core.hosting.hf_config import language_model_config
from atom_core.hosting.takeover import HostedModel, TakeoverDecision, decide_takeover


def hosted_model_from_vllm(vllm_config: Any) -> HostedModel:
    """What vLLM asks of the model, for the takeover decision (atom_core.hosting.takeover)."""
    model_config = vllm_config.model_config
    parallel = vllm_config.parallel_config
    architectures = getattr(model_config, "architectures", None) or [""]
    return HostedModel(
        host="vLLM",
        architecture=architectures[0],
        hf_config=language_model_config(model_config.hf_config, model_config.hf_text_config),
        dtype=model_config.dtype,
        quantization=model_config.quantization,
        lora=vllm_config.lora_config is not None,
        tensor_parallel_size=parallel.tensor_parallel_size,
        pipeline_parallel_size=parallel.pipeline_parallel_size,
        context_parallel_size=parallel.decode_context_parallel_size * parallel.prefill_context_parallel_size,
        data_parallel_size=parallel.data_parallel_size,
        expert_parallel=parallel.enable_expert_parallel,
        expert_load_balancing=parallel.enable_eplb,
        kv_cache_dtype=vllm_config.cache_config.cache_dtype,
        speculative_method=vllm_config.speculative_config.method if vllm_config.speculative_config else None,
        generates=model_config.runner_type == "generate" and model_config.convert_type == "none",
        device=vllm_config.device_config.device_type,
        model_impl=model_config.model_impl,
    )


def takeover_decision(vllm_config: Any) -> TakeoverDecision:
    return decide_takeover(hosted_model_from_vllm(vllm_config))


def atom_config_from_vllm(vllm_config: Any) -> Config:
    model_config = vllm_config.model_config
    # vLLM's CPU platform demotes its own compile to one Dynamo trace; ATOM compiles its models
    # itself, and `additional_config={"atom_compilation_level": N}` picks ATOM's level explicitly.
    additional = getattr(vllm_config, "additional_config", None) or {}
    level = additional.get("atom_compilation_level", vllm_config.compilation_config.mode or 0)
    return Config(
        model=model_config.model,
        hf_config=language_model_config(model_config.hf_config, model_config.hf_text_config),
        torch_dtype=model_config.dtype,
        max_model_len=model_config.max_model_len,
        compilation_config=CompilationConfig(level=CompilationLevel(int(level))),
    )
