"""Fused mixture-of-experts layer: softmax top-k routing + stacked expert weights.

Expert weights are stacked per layer: ``w13_weight`` [E, 2 * I/tp, D] ([gate | up] rows) and
``w2_weight`` [E, D, I/tp]. Their shard ids are ``(expert, 0 | 1)`` for gate/up and ``expert`` for
down, so a per-expert checkpoint (``experts.{e}.gate_proj.weight``, ...) loads through one table.
"""

from __future__ import annotations

import torch
from torch import nn

import atom_kernels
from atom_core.distributed import divide, get_tp_group
from atom_core.layers.linear import copy_checked, make_param


class FusedMoE(nn.Module):
    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool, prefix: str = ""):
        super().__init__()
        self.prefix = prefix
        self.tp = get_tp_group()
        self.num_experts = num_experts
        self.top_k = top_k
        self.renormalize = renormalize
        self.local_intermediate = divide(intermediate_size, self.tp.world_size)
        experts = range(num_experts)
        self.w13_weight = make_param(
            (num_experts, 2 * self.local_intermediate, hidden_size),
            self.weight_loader,
            [(e, j) for e in experts for j in (0, 1)],
        )
        self.w2_weight = make_param(
            (num_experts, hidden_size, self.local_intermediate), self.weight_loader, experts
        )

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id) -> None:
        size, rank = self.local_intermediate, self.tp.rank
        if param is self.w13_weight:
            expert, half = shard_id
            target = param.data[expert].narrow(0, half * size, size)
            copy_checked(target, loaded.narrow(0, rank * size, size))
        else:
            copy_checked(param.data[shard_id], loaded.narrow(1, rank * size, size))

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        weights, ids = atom_kernels.topk_softmax(router_logits, self.top_k, self.renormalize)
        out = atom_kernels.fused_moe(x, self.w13_weight, self.w2_weight, weights, ids)
        if self.tp.world_size > 1:
            out = self.tp.all_reduce(out)
        return out
