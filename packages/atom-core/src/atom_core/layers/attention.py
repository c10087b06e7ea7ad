"""Attention front-end: the model-side layer that the host engine's attention plugs into.

Models call ``Attention(q, k, v)`` with RoPE already applied. What runs underneath is chosen by the
host integration through :func:`set_attention_factory`:

- vLLM: a ``vllm`` ``Attention`` layer, so vLLM allocates and binds the paged KV cache and builds
  metadata; with ATOM's platform active its impl is ATOM's paged attention (atom_vllm.attention).
- SGLang: a ``RadixAttention`` over SGLang's KV pool (atom_sglang).
- Standalone (tests, HF parity): causal attention over the sequences of the batch given by
  :func:`standalone_batch`, without a KV cache.

A checkpoint's per-layer KV-cache scales (atom_core.quantization.kv_cache) load into the layer's
``k_scale`` / ``v_scale`` (-1 where the checkpoint has none); after loading, the layer hands those it
got to a module whose class defines ``load_kv_cache_scales(k_scale=..., v_scale=...)``, the hosts'
attention, which applies them as the host applies its own models' scales. The standalone attention
keeps no cache and needs none.

Under torch.compile the layer calls the custom op ``torch.ops.atom.unified_attention``, which finds
its layer by name and writes into an output buffer allocated inside the graph: ATOM's compile backend
splits the graph at this op, and a host replaying the pieces as CUDA graphs sees stable addresses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

import atom_kernels
from atom_core.layers.linear import make_param
from atom_core.layers.splitting_op import define_splitting_op
from atom_core.quantization.kv_cache import kv_scale_loader


@dataclass(frozen=True)
class AttentionSpec:
    """Everything a backend needs to build its attention for one layer (per-rank head counts)."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    scale: float
    prefix: str
    layer_id: int
    sliding_window: int | None = None
    sinks: torch.Tensor | None = None


AttentionFactory = Callable[[AttentionSpec], nn.Module]
"""Builds a layer's attention module: ``module(q, k, v) -> [T, num_heads * head_size]``. A module
whose class sets ``writes_into_out = True`` also takes ``out=`` (that shape) and writes the result
there; under torch.compile the others' results are copied into the graph's buffer (one
hidden-sized copy per layer and step)."""


class StandaloneAttention(nn.Module):
    """Cache-less causal attention over the batch set by :func:`standalone_batch`."""

    writes_into_out = True

    def __init__(self, spec: AttentionSpec):
        super().__init__()
        self.spec = spec

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                out: torch.Tensor | None = None) -> torch.Tensor:
        s = self.spec
        cu = standalone_cu_seqlens(q.device)
        result = atom_kernels.varlen_attention(
            q.view(-1, s.num_heads, s.head_size),
            k.view(-1, s.num_kv_heads, s.head_size),
            v.view(-1, s.num_kv_heads, s.head_size),
            cu, cu, s.scale, True, s.sliding_window, s.sinks,
            out=None if out is None else out.view(-1, s.num_heads, s.head_size),
        )
        return result.reshape(q.shape[0], -1)


_factory: AttentionFactory = StandaloneAttention
_standalone_cu_seqlens: torch.Tensor | None = None


def set_attention_factory(factory: AttentionFactory) -> None:
    global _factory
    _factory = factory


def get_attention_factory() -> AttentionFactory:
    return _factory


def standalone_cu_seqlens(device: torch.device) -> torch.Tensor:
    """Cumulative sequence lengths of the batch set by :func:`standalone_batch`."""
    if _standalone_cu_seqlens is None:
        raise RuntimeError("standalone ATOM attention needs a batch: wrap the call in standalone_batch()")
    return _standalone_cu_seqlens.to(device)


@contextlib.contextmanager
def standalone_batch(seq_lens: list[int]) -> Iterator[None]:
    """Run standalone models on a flattened batch of sequences with these lengths."""
    global _standalone_cu_seqlens
    previous = _standalone_cu_seqlens
    _standalone_cu_seqlens = torch.tensor([0, *seq_lens], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    try:
        yield
    finally:
        _standalone_cu_seqlens = previous


_layers_by_name: dict[str, "Attention"] = {}


def unified_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, output: torch.Tensor,
                      layer_name: str) -> None:
    impl = _layers_by_name[layer_name].impl
    if getattr(impl, "writes_into_out", False):
        impl(q, k, v, out=output)
    else:
        output.copy_(impl(q, k, v))


define_splitting_op(unified_attention)


def _absent_kv_scale() -> nn.Parameter:
    """A KV-cache scale the checkpoint may fill (loaded values are positive; see the loader)."""
    scale = make_param((), kv_scale_loader, expected_shards=(), dtype=torch.float32)
    scale.data.fill_(-1.0)
    return scale


class CheckpointKvScales(nn.Module):
    """The ``k_scale`` / ``v_scale`` a checkpoint may give an attention layer (MHA or MLA), handed to
    the layer's ``impl`` after loading if it takes them (module docstring)."""

    impl: nn.Module

    def __init__(self):
        super().__init__()
        self.k_scale = _absent_kv_scale()
        self.v_scale = _absent_kv_scale()

    def after_loading(self) -> None:
        scales = {name: scale.detach() for name, scale in (("k_scale", self.k_scale), ("v_scale", self.v_scale))
                  if scale.item() > 0}
        if scales and hasattr(self.impl, "load_kv_cache_scales"):
            self.impl.load_kv_cache_scales(**scales)


class Attention(CheckpointKvScales):
    def __init__(self, spec: AttentionSpec):
        super().__init__()
        self.spec = spec
        self.impl = _factory(spec)
        # The latest model built in this process owns the name (tests build several models).
        _layers_by_name[spec.prefix] = self

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            return self.impl(q, k, v)
        output = q.new_empty(q.shape[0], self.spec.num_heads * self.spec.head_size)
        torch.ops.atom.unified_attention(q, k, v, output, self.spec.prefix)
        return output
