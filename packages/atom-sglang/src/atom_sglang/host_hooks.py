"""Plug SGLang's TP group and attention layer into atom-core (see atom_core.distributed/attention).

ATOM's attention front-end calls ``impl(q, k, v)``; SGLang's ``RadixAttention`` also needs the
``ForwardBatch``. The model wrapper binds the batch of the running forward in a context variable
(:func:`bind_forward_batch`) and :class:`RadixAttentionImpl` reads it there, so atom-core's model
code stays free of SGLang types.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING

import torch
from torch import nn

from atom_core.distributed import TPGroup, set_tp_group
from atom_core.layers.attention import AttentionSpec, set_attention_factory
from atom_sglang.attention.window import to_sglang_window

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

_current_forward_batch: ContextVar[ForwardBatch | None] = ContextVar(
    "atom_sglang_forward_batch", default=None
)


@contextlib.contextmanager
def bind_forward_batch(forward_batch: ForwardBatch) -> Iterator[None]:
    token = _current_forward_batch.set(forward_batch)
    try:
        yield
    finally:
        _current_forward_batch.reset(token)


def current_forward_batch() -> ForwardBatch:
    forward_batch = _current_forward_batch.get()
    if forward_batch is None:
        raise RuntimeError("ATOM attention ran outside an SGLang forward (no ForwardBatch bound)")
    return forward_batch


class RadixAttentionImpl(nn.Module):
    """ATOM attention as an SGLang ``RadixAttention``: SGLang owns the KV pool and the backend."""

    def __init__(self, spec: AttentionSpec):
        super().__init__()
        from sglang.srt.layers.radix_attention import RadixAttention

        self.attn = RadixAttention(
            spec.num_heads,
            spec.head_size,
            spec.scale,
            spec.num_kv_heads,
            spec.layer_id,
            sliding_window_size=to_sglang_window(spec.sliding_window),
            prefix=spec.prefix,
        )
        # The spec, not the sinks tensor itself: the sinks are a parameter of the model's attention
        # block, and an nn.Module attribute would register them a second time under this name.
        self.spec = spec

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        extra = {} if self.spec.sinks is None else {"sinks": self.spec.sinks}
        return self.attn(q, k, v, current_forward_batch(), **extra)


def _all_gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    from sglang.srt.distributed import tensor_model_parallel_all_gather

    return tensor_model_parallel_all_gather(x, dim)


def install_sglang_hooks() -> None:
    from sglang.srt.distributed import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
        tensor_model_parallel_all_reduce,
    )

    set_tp_group(
        TPGroup(
            rank=get_tensor_model_parallel_rank(),
            world_size=get_tensor_model_parallel_world_size(),
            all_reduce=tensor_model_parallel_all_reduce,
            all_gather=_all_gather,
        )
    )
    set_attention_factory(RadixAttentionImpl)
