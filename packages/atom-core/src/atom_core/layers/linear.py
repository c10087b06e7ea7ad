"""Tensor-parallel linear layers (Megatron style) that own their weight sharding.

Each weight carries ``weight_loader(param, loaded_weight, shard_id)`` that slices a full checkpoint
tensor for this rank, and ``expected_shards``: the shard ids a complete checkpoint provides for it
(``(None,)`` for a plain tensor, ``("q", "k", "v")`` for fused QKV, ``(0, 1)`` for gate/up).

A layer built under an FP8 quantization (atom_core.quantization.context) holds an fp8 ``weight``
and its scales under the checkpoint's names (``weight_scale_inv`` per block, or ``weight_scale`` per
output channel, plus ``input_scale`` for static activations). Every layer kind places a checkpoint
tensor the same way, through :meth:`LinearBase.row_plan`: which rows of the full tensor are this
rank's and where they go; block scales follow in units of blocks, and a per-tensor scale fills its
shard's channels.

Under an MXFP4 scheme (AMD Quark's W4A4 checkpoints) ``weight`` is uint8 [N, K / 2], two e2m1 values
a byte, with a uint8 e8m0 ``weight_scale`` [N, K / 32] (atom_core.quantization.mxfp4); a rank's
share of a row-parallel input dim is whole 32-value blocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from atom_core.distributed import divide, get_tp_group
from atom_core.quantization.context import layer_scheme
from atom_core.quantization.fp8 import (
    FP8_DTYPE,
    ActivationQuant,
    QuantizedActivation,
    dequantize_fp8,
    fp8_linear,
    fused_input_quant,
    weight_scale_shape,
)
from atom_core.quantization.mxfp4 import mxfp4_linear, mxfp4_param_shapes
from atom_core.quantization.scheme import Mxfp4Scheme


def input_quant_of(module: nn.Module) -> ActivationQuant | None:
    """The quantization in which ``module`` (an FP8 linear, or a block whose input goes straight into
    one: self-attention's QKV, the gated MLP's gate/up) takes its input pre-quantized from the layer
    before, its ``input_quant``; None where it takes the model dtype only."""
    return getattr(module, "input_quant", None)


def make_param(shape: Sequence[int], loader, expected_shards=(None,),
               dtype: torch.dtype | None = None) -> nn.Parameter:
    """An empty parameter with its loader; integer (packed) ones start at zero, as vLLM allocates
    its own: vLLM's dummy loader fills floating-point parameters only, so a dummy-weight load then
    gives vLLM alone and vLLM + ATOM the same weights."""
    integer = dtype is not None and not dtype.is_floating_point
    param = nn.Parameter((torch.zeros if integer else torch.empty)(tuple(shape), dtype=dtype),
                         requires_grad=False)
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
    """y = x W^T (+ b). ``shard_dim`` is the weight dim split across TP ranks (None: replicated).
    Subclasses place checkpoint rows through :meth:`row_plan`."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        bias: bool,
        shard_dim: int | None,
        prefix: str,
        expected_shards: Sequence = (None,),
        dequantize: bool = False,
    ):
        super().__init__()
        self.prefix = prefix
        self.tp = get_tp_group()
        self.shard_dim = shard_dim
        # The checkpoint's scheme for this layer; ``dequantize`` keeps the layer in the model dtype
        # and dequantizes an FP8 checkpoint weight at load (MLA's kv_b_proj, read as W_UK / W_UV).
        self.checkpoint_scheme = layer_scheme(prefix)
        self.scheme = None if dequantize else self.checkpoint_scheme
        if isinstance(self.checkpoint_scheme, Mxfp4Scheme):
            self._make_mxfp4_params(input_size, output_size, bias, expected_shards, dequantize)
            return
        dtype = None if self.scheme is None else FP8_DTYPE
        self.weight = make_param((output_size, input_size), self.weight_loader, expected_shards, dtype)
        # A row-parallel bias is added once, after the reduction: it is not sharded.
        self.bias = (
            make_param((output_size,), self.weight_loader, expected_shards) if bias else None
        )
        self.input_scale = None
        # Set for dynamic FP8: the layer before may quantize this layer's input (input_quant_of).
        self.input_quant = fused_input_quant(self.scheme)
        if self.checkpoint_scheme is not None:
            self._check_blocks(output_size, input_size)
            shape = weight_scale_shape(self.checkpoint_scheme, output_size, input_size)
            self.register_parameter(self.checkpoint_scheme.weight_scale_name, make_param(
                shape, self.weight_loader, expected_shards, torch.float32))
        if self.scheme is None and self.checkpoint_scheme is not None:
            if tuple(expected_shards) != (None,) or self.checkpoint_scheme.static_input:
                raise ValueError(f"{prefix}: only a single-tensor layer with dynamic activations "
                                 "can be dequantized at load")
            self.weight.accepts_fp8 = True
            self._pending_fp8: dict[str, torch.Tensor] = {}
        if self.scheme is not None:
            if self.scheme.static_input:
                # The largest of the fused shards' scales: loaded with max, so it starts at zero.
                self.input_scale = make_param((1,), self.weight_loader, expected_shards, torch.float32)
                self.input_scale.data.zero_()

    def _make_mxfp4_params(self, input_size: int, output_size: int, bias: bool, expected_shards: Sequence,
                           dequantize: bool) -> None:
        """Packed uint8 ``weight`` and ``weight_scale`` (module docstring); no activation fusion."""
        if dequantize:
            raise ValueError(f"{self.prefix}: an MXFP4 layer cannot be dequantized at load")
        block = self.checkpoint_scheme.block
        if input_size % block:
            raise ValueError(f"{self.prefix}: MXFP4 needs an input size (per TP rank: {input_size}) "
                             f"that is a multiple of {block}")
        for name, shape in mxfp4_param_shapes(self.checkpoint_scheme, output_size, input_size).items():
            self.register_parameter(name, make_param(shape, self.weight_loader, expected_shards, torch.uint8))
        self.bias = make_param((output_size,), self.weight_loader, expected_shards) if bias else None
        self.input_scale = self.input_quant = None

    def _check_blocks(self, output_size: int, input_size: int) -> None:
        """Block scales cannot straddle a TP split or a fused shard boundary."""
        block = self.checkpoint_scheme.weight_block
        shards = self.weight.expected_shards
        sharded = self.tp.world_size > 1 and self.shard_dim is not None
        sizes = []
        if len(shards) > 1 or (sharded and self.shard_dim == 0):
            sizes = [self.row_plan(shard)[1] for shard in shards]
        if self.scheme is not None:  # activations are quantized in groups of the block along K
            sizes.append(input_size)
        uneven = [size for size in sizes if block is not None and size % block]
        if uneven:
            raise ValueError(f"{self.prefix}: block-FP8 with block {block} needs input and shard sizes "
                             f"that are multiples of it, got {uneven} (TP {self.tp.world_size})")

    def _rank_slice(self, loaded: torch.Tensor, dim: int) -> torch.Tensor:
        size = divide(loaded.shape[dim], self.tp.world_size)
        return loaded.narrow(dim, self.tp.rank * size, size)

    def row_plan(self, shard_id) -> tuple[int, int, int]:
        """(first row in the parameter, row count, first row in the checkpoint tensor) of ``shard_id``."""
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} takes one unsharded tensor, got shard {shard_id}")
        rows = self.weight.shape[0]
        return 0, rows, self.tp.rank * rows if self.shard_dim == 0 else 0

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if self.checkpoint_scheme is not None and self.scheme is None:
            self._dequantize_when_complete(param, loaded)
        start, rows, source_start = self.row_plan(shard_id)
        if param is self.input_scale:
            param.data.copy_(torch.maximum(param.data, loaded.reshape(1)))
            return
        if param is not self.weight and loaded.numel() == 1 and param.dim() == 1 and self.checkpoint_scheme:
            param.data.narrow(0, start, rows).fill_(loaded.item())  # a per-tensor weight scale
            return
        if param is self.weight and loaded.dtype == FP8_DTYPE and self.scheme is None:
            return  # placed by _dequantize_when_complete
        unit = self.rows_per_entry(param)
        if param.dim() == 1:
            loaded = loaded.reshape(-1)  # per-channel scales ship as [N] or [N, 1]
        target = param.data.narrow(0, start // unit, math.ceil(rows / unit))
        source = loaded.narrow(0, source_start // unit, math.ceil(rows / unit))
        if self.shard_dim == 1 and param.dim() == 2:
            source = self._rank_slice(source, 1)
        copy_checked(target, source)

    def rows_per_entry(self, param: nn.Parameter) -> int:
        """Weight rows one row of ``param`` covers: 1, or a block-FP8 scale's block."""
        if param.dim() == 1 or param is self.weight or isinstance(self.checkpoint_scheme, Mxfp4Scheme):
            return 1
        return self.checkpoint_scheme.weight_block

    def _dequantize_when_complete(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """Keep the FP8 weight or its scale, whichever comes first; with both, load the dequantized
        weight."""
        scale = getattr(self, self.checkpoint_scheme.weight_scale_name)
        if param is not scale and (param is not self.weight or loaded.dtype != FP8_DTYPE):
            return  # the bias, or an unquantized checkpoint weight: loaded as they are
        self._pending_fp8["weight" if param is self.weight else "scale"] = loaded
        if len(self._pending_fp8) == 2:
            pending, self._pending_fp8 = self._pending_fp8, {}
            weight = dequantize_fp8(pending["weight"], pending["scale"],
                                    self.checkpoint_scheme.weight_block)
            self.weight_loader(self.weight, weight.to(self.weight.dtype))

    def matmul(self, x: torch.Tensor | QuantizedActivation, bias: torch.Tensor | None) -> torch.Tensor:
        if self.scheme is None:
            return F.linear(x, self.weight, bias)
        if isinstance(self.scheme, Mxfp4Scheme):
            return mxfp4_linear(x, self.scheme, self.weight, self.weight_scale, bias)
        return fp8_linear(x, self.scheme, self.weight, getattr(self, self.scheme.weight_scale_name),
                          self.input_scale, bias)

    def forward(self, x: torch.Tensor | QuantizedActivation) -> torch.Tensor:
        return self.matmul(x, self.bias)


class ReplicatedLinear(LinearBase):
    def __init__(self, input_size: int, output_size: int, bias: bool = False, prefix: str = ""):
        super().__init__(input_size, output_size, bias, None, prefix)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; each rank returns its slice (no gather)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, prefix: str = "",
                 expected_shards: Sequence = (None,), dequantize: bool = False):
        tp_size = get_tp_group().world_size
        super().__init__(input_size, divide(output_size, tp_size), bias, 0, prefix, expected_shards,
                         dequantize)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one GEMM (gate|up); shard ids are their indices."""

    def __init__(self, input_size: int, output_sizes: Sequence[int], bias: bool = False,
                 prefix: str = ""):
        self.output_sizes = list(output_sizes)
        super().__init__(input_size, sum(output_sizes), bias, prefix,
                         expected_shards=range(len(output_sizes)))

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        """A tuple of shard ids (atom_core.loader.Sections) is one checkpoint tensor holding those
        shards back to back: each part loads as its own shard. A block-FP8 scale holds one row per
        block of rows; a per-tensor scale serves every part."""
        if not isinstance(shard_id, tuple):
            super().weight_loader(param, loaded, shard_id)
            return
        if loaded.numel() == 1:
            parts = [loaded] * len(shard_id)
        else:
            unit = self.rows_per_entry(param)
            parts = loaded.split([math.ceil(self.output_sizes[s] / unit) for s in shard_id], 0)
        for shard, part in zip(shard_id, parts):
            super().weight_loader(param, part, shard)

    def row_plan(self, shard_id) -> tuple[int, int, int]:
        if shard_id is None:
            raise ValueError(f"{type(self).__name__} needs a shard id (0..{len(self.output_sizes) - 1})")
        tp_size = self.tp.world_size
        size = self.output_sizes[shard_id] // tp_size
        return sum(self.output_sizes[:shard_id]) // tp_size, size, self.tp.rank * size


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

    def row_plan(self, shard_id) -> tuple[int, int, int]:
        q_size = self.num_heads * self.head_size
        kv_size = self.num_kv_heads * self.head_size
        rank = self.tp.rank
        if shard_id == "q":
            return 0, q_size, rank * q_size
        if shard_id in ("k", "v"):
            offset = q_size if shard_id == "k" else q_size + kv_size
            return offset, kv_size, (rank // self.kv_replicas) * kv_size
        raise ValueError(f"QKVParallelLinear shard id must be q, k or v, got {shard_id!r}")


class RowParallelLinear(LinearBase):
    """Input features split across ranks; partial products are summed over the TP group, or, with
    ``reduce_results=False``, by the caller together with other partial sums (the bias then goes into
    rank 0's part, so that the sum carries it once)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False, prefix: str = "",
                 reduce_results: bool = True):
        tp_size = get_tp_group().world_size
        super().__init__(divide(input_size, tp_size), output_size, bias, 1, prefix)
        self.reduce_results = reduce_results

    def forward(self, x: torch.Tensor | QuantizedActivation) -> torch.Tensor:
        y = self.matmul(x, None)
        if self.tp.world_size > 1:
            if not self.reduce_results:
                return y if self.bias is None or self.tp.rank else y + self.bias
            y = self.tp.all_reduce(y)
        return y if self.bias is None else y + self.bias
