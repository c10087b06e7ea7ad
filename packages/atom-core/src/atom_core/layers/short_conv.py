"""The depthwise causal short convolution of a linear-attention layer: its weight, split across TP
ranks, and its op (:func:`atom_kernels.causal_conv1d`) applied with a caller's conv state."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

import atom_kernels
from atom_core.distributed import divide, get_tp_group
from atom_core.layers.linear import copy_checked, make_param


class ShortConvolution(nn.Module):
    """``weight`` [channels, 1, kernel_size], HF's ``nn.Conv1d(groups=channels)`` layout, no bias.

    The channels are ``sections`` laid end to end (Qwen3-Next: q, k and v of all heads); TP splits
    each section, so a rank holds its share of every section, in the same order.
    """

    def __init__(self, sections: Sequence[int], kernel_size: int, activation: str | None = "silu"):
        super().__init__()
        self.tp = get_tp_group()
        self.sections = tuple(sections)
        self.local_sections = tuple(divide(size, self.tp.world_size) for size in sections)
        self.channels = sum(self.local_sections)
        self.kernel_size = kernel_size
        self.activation = activation
        self.weight = make_param((self.channels, 1, kernel_size), self.weight_loader)

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if shard_id is not None:
            raise ValueError(f"a short-convolution weight got shard {shard_id!r}")
        if loaded.shape[0] != sum(self.sections):
            raise ValueError(f"checkpoint conv weight has {loaded.shape[0]} channels, expected "
                             f"{sum(self.sections)}")
        rank = self.tp.rank
        pieces = [section.narrow(0, rank * local, local)
                  for section, local in zip(loaded.split(self.sections), self.local_sections)]
        copy_checked(param.data, torch.cat(pieces))

    def prefill(self, x: torch.Tensor, cu_seqlens: torch.Tensor, conv_state: torch.Tensor,
                has_initial_state: torch.Tensor, state_slots: torch.Tensor | None = None) -> torch.Tensor:
        """``x`` [T, channels] of the packed sequences -> [T, channels]; each sequence's conv state
        [channels, kernel_size - 1] (row ``i`` of ``conv_state``, or row ``state_slots[i]``) is read
        where ``has_initial_state`` [N] and overwritten."""
        return atom_kernels.causal_conv1d(x, self.weight[:, 0], None, cu_seqlens, conv_state,
                                          has_initial_state, self.activation, state_slots)

    def decode(self, x: torch.Tensor, conv_state: torch.Tensor, state_slots: torch.Tensor) -> torch.Tensor:
        """One token per sequence, ``x`` [N, channels] -> [N, channels], shifted into row
        ``state_slots[i]`` of ``conv_state``."""
        return atom_kernels.causal_conv1d_decode(x, self.weight[:, 0], None, conv_state, self.activation,
                                                 state_slots)
