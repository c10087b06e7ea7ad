"""VllmConfig -> atom_core Config, as one pure function.

| ATOM Config field        | from vLLM                                         |
|--------------------------|---------------------------------------------------|
| model                    | model_config.model                                |
| hf_config, torch_dtype   | model_config.hf_config, model_config.dtype        |
| max_num_batched_tokens   | scheduler_config.max_num_batched_tokens           |
| max_num_seqs             | scheduler_config.max_num_seqs                     |
| max_model_len            | model_config.max_model_len                        |
| gpu_memory_utilization   | cache_config.gpu_memory_utilization               |
| tensor_parallel_size     | parallel_config.tensor_parallel_size              |
| kv_cache_block_size      | cache_config.block_size                           |
| num_kvcache_blocks       | cache_config.num_gpu_blocks (-1 until profiled)   |
| kv_cache_dtype           | cache_config.cache_dtype                          |
| enable_prefix_caching    | cache_config.enable_prefix_caching                |
| enable_expert_parallel   | parallel_config.enable_expert_parallel            |
| compilation level        | compilation_config.mode (0-3, same numbering), or |
|                          | additional_config["atom_compilation_level"]       |
| enforce_eager            | always True: CUDA graphs are vLLM's in plugin mode|
"""

from __future__ import annotations

from typing import Any

from atom_core.config import CompilationConfig, CompilationLevel, Config, PluginConfig
from atom_core.hosting.takeover import HostedModel, TakeoverDecision, decide_takeover


def hosted_model_from_vllm(vllm_config: Any) -> HostedModel:
    """What vLLM asks of the model, for the takeover decision (atom_core.hosting.takeover)."""
    model_config = vllm_config.model_config
    architectures = getattr(model_config, "architectures", None) or [""]
    return HostedModel(
        host="vLLM",
        architecture=architectures[0],
        hf_config=model_config.hf_config,
        dtype=model_config.dtype,
        quantization=model_config.quantization,
        lora=vllm_config.lora_config is not None,
        pipeline_parallel_size=vllm_config.parallel_config.pipeline_parallel_size,
        kv_cache_dtype=vllm_config.cache_config.cache_dtype,
        generates=model_config.runner_type == "generate" and model_config.convert_type == "none",
    )


def takeover_decision(vllm_config: Any) -> TakeoverDecision:
    return decide_takeover(hosted_model_from_vllm(vllm_config))


def atom_config_from_vllm(vllm_config: Any, use_atom_attention: bool = True) -> Config:
    model_config = vllm_config.model_config
    cache_config = vllm_config.cache_config
    scheduler_config = vllm_config.scheduler_config
    parallel_config = vllm_config.parallel_config
    num_blocks = cache_config.num_gpu_blocks
    # vLLM's CPU platform demotes its own compile to one Dynamo trace; ATOM compiles its models
    # itself, and `additional_config={"atom_compilation_level": N}` picks ATOM's level explicitly.
    additional = getattr(vllm_config, "additional_config", None) or {}
    level = additional.get("atom_compilation_level", vllm_config.compilation_config.mode or 0)
    return Config(
        model=model_config.model,
        hf_config=model_config.hf_config,
        torch_dtype=model_config.dtype,
        max_num_batched_tokens=scheduler_config.max_num_batched_tokens,
        max_num_seqs=scheduler_config.max_num_seqs,
        max_model_len=model_config.max_model_len,
        gpu_memory_utilization=cache_config.gpu_memory_utilization,
        tensor_parallel_size=parallel_config.tensor_parallel_size,
        enforce_eager=True,
        kv_cache_block_size=cache_config.block_size,
        num_kvcache_blocks=-1 if num_blocks is None else num_blocks,
        kv_cache_dtype=cache_config.cache_dtype,
        enable_prefix_caching=bool(cache_config.enable_prefix_caching),
        enable_expert_parallel=parallel_config.enable_expert_parallel,
        compilation_config=CompilationConfig(
            level=CompilationLevel(int(level))
        ),
        plugin_config=PluginConfig(
            model_config=model_config,
            rank=parallel_config.rank,
            is_plugin_mode=True,
            is_vllm=True,
            vllm_scheduler_config=scheduler_config,
            vllm_cache_config=cache_config,
            vllm_quant_config=vllm_config.quant_config,
            vllm_use_atom_attention=use_atom_attention,
        ),
    )
