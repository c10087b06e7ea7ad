"""SGLang ServerArgs + ModelConfig -> atom_core Config: one row per mapping rule."""

from types import SimpleNamespace

import pytest
import torch
from transformers import Qwen3Config

from atom_core.config import CompilationLevel
from atom_sglang.config_translation import atom_config_from_sglang, unpadded_hf_config

SERVER_ARGS = dict(
    chunked_prefill_size=2048,
    max_prefill_tokens=16384,
    max_running_requests=None,
    mem_fraction_static=None,
    tp_size=1,
    page_size=1,
    kv_cache_dtype="auto",
    disable_radix_cache=False,
    ep_size=1,
)


def hf_config(**overrides):
    settings = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
    return Qwen3Config(**{**settings, **overrides})


def model_config(hf):
    return SimpleNamespace(model_path="/models/tiny", hf_config=hf, dtype=torch.float16, context_len=4096)


# (server_args overrides, {Config attribute: expected value})
ROWS = [
    ({}, dict(model="/models/tiny", torch_dtype=torch.float16, max_model_len=4096,
              max_num_batched_tokens=2048, max_num_seqs=512, gpu_memory_utilization=0.9,
              tensor_parallel_size=1, kv_cache_block_size=1, num_kvcache_blocks=-1, kv_cache_dtype="auto",
              enable_prefix_caching=True, enable_expert_parallel=False, enforce_eager=True)),
    ({"chunked_prefill_size": -1}, dict(max_num_batched_tokens=16384)),
    ({"chunked_prefill_size": None}, dict(max_num_batched_tokens=16384)),
    ({"max_running_requests": 48}, dict(max_num_seqs=48)),
    ({"mem_fraction_static": 0.7}, dict(gpu_memory_utilization=0.7)),
    ({"tp_size": 4, "ep_size": 4}, dict(tensor_parallel_size=4, enable_expert_parallel=True)),
    ({"page_size": 64}, dict(kv_cache_block_size=64)),
    ({"kv_cache_dtype": "fp8_e4m3"}, dict(kv_cache_dtype="fp8_e4m3")),
    ({"disable_radix_cache": True}, dict(enable_prefix_caching=False)),
]


@pytest.mark.parametrize("overrides, expected", ROWS)
def test_translation_table(overrides, expected):
    hf = hf_config()
    mc = model_config(hf)
    config = atom_config_from_sglang(SimpleNamespace(**{**SERVER_ARGS, **overrides}), mc, hf, tp_rank=3)
    assert {name: getattr(config, name) for name in expected} == expected
    assert config.hf_config is hf
    assert config.compilation_config.level == CompilationLevel.NO_COMPILATION
    plugin = config.plugin_config
    assert (plugin.is_sglang, plugin.is_vllm, plugin.rank, plugin.model_config) == (True, False, 3, mc)
    assert config.is_plugin_mode


def test_cpu_padding_is_undone_on_a_copy():
    padded = hf_config(intermediate_size=128, original_intermediate_size=96, original_num_attention_heads=4)
    config = atom_config_from_sglang(SimpleNamespace(**SERVER_ARGS), model_config(padded), padded, tp_rank=0)
    assert config.hf_config.intermediate_size == 96
    assert padded.intermediate_size == 128  # SGLang's own config is left alone


def test_padded_heads_are_refused():
    with pytest.raises(NotImplementedError, match="padded 3 attention heads to 4"):
        unpadded_hf_config(hf_config(original_num_attention_heads=3))
