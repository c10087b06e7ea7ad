"""VllmConfig -> atom_core Config: one row per translated field, on real VllmConfig objects."""

import pytest
import torch
from vllm.engine.arg_utils import EngineArgs

from atom_core.config import CompilationLevel
from atom_vllm.config_translation import atom_config_from_vllm

ENGINE_ARGS = [
    dict(dtype="float32", max_model_len=300, max_num_seqs=7, max_num_batched_tokens=640,
         block_size=32, enable_prefix_caching=False, gpu_memory_utilization=0.5,
         enforce_eager=True),
    dict(dtype="bfloat16", max_model_len=512, max_num_seqs=3, max_num_batched_tokens=128,
         block_size=16, enable_prefix_caching=True, gpu_memory_utilization=0.7,
         compilation_config={"mode": 2}),
    dict(dtype="float32", max_model_len=256, max_num_seqs=4, max_num_batched_tokens=256,
         block_size=16, enable_prefix_caching=True, gpu_memory_utilization=0.9,
         additional_config={"atom_compilation_level": 3}),
]

# (ATOM field, function of (vllm_config, engine kwargs) giving the expected value)
TABLE = [
    ("model", lambda v, kw: v.model_config.model),
    ("hf_config", lambda v, kw: v.model_config.hf_config),
    ("torch_dtype", lambda v, kw: getattr(torch, kw["dtype"])),
    ("max_num_batched_tokens", lambda v, kw: kw["max_num_batched_tokens"]),
    ("max_num_seqs", lambda v, kw: kw["max_num_seqs"]),
    ("max_model_len", lambda v, kw: kw["max_model_len"]),
    ("gpu_memory_utilization", lambda v, kw: kw["gpu_memory_utilization"]),
    ("tensor_parallel_size", lambda v, kw: 1),
    ("kv_cache_block_size", lambda v, kw: kw["block_size"]),
    ("num_kvcache_blocks", lambda v, kw: -1),  # not profiled yet when the model is built
    ("kv_cache_dtype", lambda v, kw: "auto"),
    ("enable_prefix_caching", lambda v, kw: kw["enable_prefix_caching"]),
    ("enable_expert_parallel", lambda v, kw: False),
    ("enforce_eager", lambda v, kw: True),  # always: CUDA graphs are vLLM's in plugin mode
    ("compilation_config.level",
     lambda v, kw: CompilationLevel(kw.get("additional_config", {}).get(
         "atom_compilation_level", kw.get("compilation_config", {}).get("mode", 0)))),
    ("plugin_config.model_config", lambda v, kw: v.model_config),
    ("plugin_config.rank", lambda v, kw: 0),
    ("plugin_config.is_plugin_mode", lambda v, kw: True),
    ("plugin_config.is_vllm", lambda v, kw: True),
    ("plugin_config.vllm_scheduler_config", lambda v, kw: v.scheduler_config),
    ("plugin_config.vllm_cache_config", lambda v, kw: v.cache_config),
    ("plugin_config.vllm_quant_config", lambda v, kw: v.quant_config),
    ("plugin_config.vllm_use_atom_attention", lambda v, kw: True),
]


def field(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.fixture(scope="module", params=range(len(ENGINE_ARGS)))
def translated(request, tiny_model_dir):
    kwargs = ENGINE_ARGS[request.param]
    vllm_config = EngineArgs(model=tiny_model_dir("Qwen3ForCausalLM"), **kwargs).create_engine_config()
    return vllm_config, kwargs, atom_config_from_vllm(vllm_config)


@pytest.mark.parametrize("name,expected", TABLE, ids=[row[0] for row in TABLE])
def test_field(translated, name, expected):
    vllm_config, kwargs, atom_config = translated
    assert field(atom_config, name) == expected(vllm_config, kwargs)


def test_attention_switch_is_recorded(translated):
    vllm_config, _, _ = translated
    config = atom_config_from_vllm(vllm_config, use_atom_attention=False)
    assert config.plugin_config.vllm_use_atom_attention is False
