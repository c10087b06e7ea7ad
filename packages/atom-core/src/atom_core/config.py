"""ATOM's own configuration, independent of the host engine.

In plugin mode the host's config is translated into a :class:`Config` once per process (see
``atom_vllm.config_translation`` / ``atom_sglang.config_translation``); models and layers read only
this object. ``enforce_eager`` is always True in plugin mode: CUDA graphs belong to the host.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch


class CompilationLevel(enum.IntEnum):
    NO_COMPILATION = 0
    DYNAMO_AS_IS = 1
    DYNAMO_ONCE = 2
    PIECEWISE = 3


@dataclass
class CompilationConfig:
    level: CompilationLevel = CompilationLevel.NO_COMPILATION
    cache_dir: str = ""


@dataclass
class PluginConfig:
    """What ATOM keeps of the host engine's own config objects (upstream's fields)."""

    model_config: Any = None
    rank: int = 0
    is_plugin_mode: bool = True
    is_vllm: bool = False
    is_sglang: bool = False
    vllm_scheduler_config: Any = None
    vllm_cache_config: Any = None
    vllm_quant_config: Any = None
    vllm_use_atom_attention: bool = True


@dataclass
class Config:
    model: str
    hf_config: Any = None
    torch_dtype: torch.dtype = torch.bfloat16
    max_num_batched_tokens: int = 16384
    max_num_seqs: int = 512
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    kv_cache_block_size: int = 16
    num_kvcache_blocks: int = -1
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = False
    enable_expert_parallel: bool = False
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)
    plugin_config: PluginConfig | None = None

    @property
    def rope_positions(self) -> int:
        """Positions the rotary tables cover: every position the host may send. That is
        ``max_model_len``, which hosts set past ``max_position_embeddings`` for YaRN and on a
        long-context override, and never less than ``max_position_embeddings``."""
        return max(self.hf_config.max_position_embeddings, self.max_model_len or 0)

    @property
    def is_plugin_mode(self) -> bool:
        return self.plugin_config is not None and self.plugin_config.is_plugin_mode


_current_config: Config | None = None


def set_current_atom_config(config: Config) -> None:
    global _current_config
    _current_config = config


def get_current_atom_config() -> Config:
    if _current_config is None:
        raise RuntimeError("no ATOM Config is set in this process (set_current_atom_config)")
    return _current_config
