"""Tensor-parallel group as seen by ATOM layers.

ATOM never creates process groups of its own: the host engine (vLLM, SGLang) installs its TP group
through :func:`set_tp_group`; standalone use is a single rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch


@dataclass(frozen=True)
class TPGroup:
    rank: int
    world_size: int
    all_reduce: Callable[[torch.Tensor], torch.Tensor]
    all_gather: Callable[[torch.Tensor, int], torch.Tensor]  # (tensor, dim) -> gathered

    @classmethod
    def from_host(cls, groups: ModuleType, ops: ModuleType | None = None) -> "TPGroup":
        """The TP group of a host: the rank and world size from ``groups``, the collectives from
        ``ops`` (default: ``groups``). vLLM's ``vllm.distributed`` exposes all four functions;
        SGLang defines them in ``sglang.srt.distributed.parallel_state`` and ``.communication_op``
        (its package re-exports the rank functions only up to 0.5.20)."""
        ops = ops or groups
        return cls(
            rank=groups.get_tensor_model_parallel_rank(),
            world_size=groups.get_tensor_model_parallel_world_size(),
            all_reduce=ops.tensor_model_parallel_all_reduce,
            all_gather=lambda x, dim: ops.tensor_model_parallel_all_gather(x, dim),
        )


def _identity_all_reduce(x: torch.Tensor) -> torch.Tensor:
    return x


def _identity_all_gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x


SINGLE_RANK = TPGroup(0, 1, _identity_all_reduce, _identity_all_gather)
_tp_group: TPGroup = SINGLE_RANK


def set_tp_group(group: TPGroup) -> None:
    global _tp_group
    _tp_group = group


def get_tp_group() -> TPGroup:
    return _tp_group


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by the tensor-parallel size {denominator}")
    return numerator // denominator
