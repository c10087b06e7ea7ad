"""Tensor-parallel linear layers (Megatron style) that own their weight sharding.

Each weight carries ``weight_loader(param, loaded_weight, shard_id)`` that slices a full checkpoint
tensor for this rank, and ``expected_shards``: the shard ids a complete checkpoint provides for it
(``(None,)`` for a plain tensor, ``("q", "k", "v")`` for fused QKV, ``(0, 1)`` for gate/up).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from atom_core.distributed import divide, get_tp_group


def make_param(shape: Sequence[int], loader, expected_shards=(None,),
               dtype: torch.dtype | None = None) -> nn.Parameter:
    param = nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)
    param.weight_loader = loader
    param.expected_shards = tuple(expected_shards)
    return param


def copy_checked(param_slice: torch.Tensor, loaded: torch.Tensor) -> None:
    if param_slice.shape != loaded.shape:
        raise ValueError(
            f"shape mismatch: checkpoint tensor {tuple(loaded.shape)} "
            f"vs parameter slice {tuple(param_slice.shape)}"
        )
    param_slice.copy_(loaded)


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    """Loader of an unsharded, replicated parameter."""
    if shard_id is not None:
        raise ValueError(f"an unsharded parameter got shard {shard_id!r}")
    copy_checked(param.data, loaded)


def rank_sharded_weight_loader(dim: int):
    """Loader of a parameter that holds this rank's equal slice of the checkpoint tensor along
    ``dim`` (per-head attention sinks, for example)."""

    def load(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if shard_id is not None:
            raise ValueError(f"a rank-sharded parameter got shard {shard_id!r}")
        tp = get_tp_group()
        size = divide(loaded.shape[dim], tp.world_size)
        copy_checked(param.data, loaded.narrow(dim, tp.rank * size, size))

    return load


class LinearBase(nn.Module):
    """y = x W^T (+ b). ``shard_dim`` is the weight dim split across TP ranks (None: replicated)."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool,
        shard_dim: int | None,
        prefix: str,
        expected_shards: Sequence = (None,),
    ):
        super().__init__()
        self.prefix = prefix
        self.tp = get_tp_group()
        self.shard_dim = shard_dim
        self.weight = make_param((output_size, input_size), self.weight_loader, expected_shards)
        # A row-parallel bias is added once, after the reduction: it is not sharded.
        self.bias = (
            make_param((output_size,), self.weight_loader, expected_shards) if bias else None
        )

    def _rank_slice(self, loaded: torch.Tensor, dim: int) -> torch.Tensor:
        size = divide(loaded.shape[dim], self.tp.world_size)
        return loaded.narrow(dim, self.tp.rank * size, size)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} takes one unsharded tensor, got shard {shard_id}")
        if self.shard_dim is not None and self.shard_dim < loaded.dim():
            loaded = self._rank_slice(loaded, self.shard_dim)
        copy_checked(param.data, loaded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False, prefix: str = ""):
        super().__init__(input_size, output_size, bias, None, prefix)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; each rank returns its slice (no gather)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, prefix: str = "",
                 expected_shards: Sequence = (None,)):
        tp_size = get_tp_group().world_size
        super().__init__(input_size, divide(output_size, tp_size), bias, 0, prefix, expected_shards)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one GEMM (gate|up); shard ids are their indices."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool = False,
                 prefix: str = ""):
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias, prefix,
                         expected_shards=range(len(output_sizes)))

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if shard_id is None:
            raise ValueError(f"{type(self).__name__} needs a shard id (0..{len(self.output_sizes) - 1})")
        tp_size = self.tp.world_size
        offset = sum(self.output_sizes[:shard_id]) // tp_size
        size = self.output_sizes[shard_id] // tp_size
        copy_checked(param.data.narrow(0, offset, size), self._rank_slice(loaded, 0))


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection. KV heads are replicated when there are fewer than TP ranks."""

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int,
                 total_num_kv_heads: int, bias: bool = False, prefix: str = ""):
        tp_size = get_tp_group().world_size
        self.head_size = head_size
        self.num_heads = divide(total_num_heads, tp_size)
        if total_num_kv_heads >= tp_size:
            self.num_kv_heads = divide(total_num_kv_heads, tp_size)
            self.kv_replicas = 1
        else:
            self.num_kv_heads = 1
            self.kv_replicas = divide(tp_size, total_num_kv_heads)
        local_out = (self.num_heads + 2 * self.num_kv_heads) * head_size
        super().__init__(hidden_size, local_out * tp_size, bias, prefix,
                         expected_shards=("q", "k", "v"))

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        q_size = self.num_heads * self.head_size
        kv_size = self.num_kv_heads * self.head_size
        rank = self.tp.rank
        if shard_id == "q":
            offset, size, index = 0, q_size, rank
        elif shard_id in ("k", "v"):
            offset = q_size if shard_id == "k" else q_size + kv_size
            size, index = kv_size, rank // self.kv_replicas
        else:
            raise ValueError(f"QKVParallelLinear shard id must be q, k or v, got {shard_id!r}")
        source = loaded.narrow(0, index * size, size)
        copy_checked(param.data.narrow(0, offset, size), source)


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial products are summed over the TP group."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, prefix: str = ""):
        tp_size = get_tp_group().world_size
        super().__init__(divide(input_size, tp_size), output_size, bias, 1, prefix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.tp.world_size > 1:
            y = self.tp.all_reduce(y)
        return y if self.bias is None else y + self.bias
