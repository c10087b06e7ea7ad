"""Tensor-parallel all-reduce hook.

The kernel library owns no process groups: the host engine (vLLM, SGLang, ATOM's own runner) installs
its all-reduce with :func:`set_all_reduce` once its distributed state exists, and layers call
:func:`all_reduce`. With nothing installed (world size 1) it returns its input unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

AllReduceFn = Callable[[torch.Tensor], torch.Tensor]

_all_reduce_fn: AllReduceFn | None = None


def set_all_reduce(fn: AllReduceFn | None) -> None:
    """Install the host's all-reduce (``x -> sum over ranks``); ``None`` restores the identity."""
    global _all_reduce_fn
    _all_reduce_fn = fn


def get_all_reduce() -> AllReduceFn | None:
    return _all_reduce_fn


def all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the tensor-parallel ranks through the installed hook; identity without one."""
    if _all_reduce_fn is None:
        return x
    return _all_reduce_fn(x)
