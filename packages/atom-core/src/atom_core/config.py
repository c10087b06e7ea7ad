"""ATOM's own configuration, independent of the host engine.

In plugin mode the host's config is translated into a :class:`Config` once per process (see
``atom_vllm.config_translation`` / ``atom_sglang.config_translation``); models and layers read only
this object. Parallel layout comes from the host's TP group (``atom_core.distributed``), CUDA
graphs and the KV cache from the host itself.
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


@dataclass
class Config:
    """The model ATOM builds: which checkpoint, its HF config and dtype, how many positions it
    serves, and how it is compiled. The hosts' scheduling, KV-cache and memory settings stay with
    the hosts."""

    model: str  # the checkpoint's path or hub name, as the host was given it
    hf_config: Any = None
    torch_dtype: torch.dtype = torch.bfloat16
    max_model_len: int | None = None
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)

    @property
    def rope_positions(self) -> int:
        """Positions the rotary tables cover: every position the host may send. That is
        ``max_model_len``, which hosts set past ``max_position_embeddings`` for YaRN and on a
        long-context override, and never less than ``max_position_embeddings``."""
        return max(self.hf_config.max_position_embeddings, self.max_model_len or 0)


_current_config: Config | None = None


def set_current_atom_config(config: Config) -> None:
    global _current_config
    _current_config = config


def get_current_atom_config() -> Config:
    if _current_config is None:
        raise RuntimeError("no ATOM Config is set in this process (set_current_atom_config)")
    return _current_config
