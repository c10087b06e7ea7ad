"""Mixture-of-experts routing and the fused expert computation.

Expert weights use the stacked layout: ``w13`` [E, 2 * I, D] holds [gate | up] rows, ``w2`` [E, D, I].
Routing returns fp32 weights and int32 expert ids, both [num_tokens, top_k].
"""

from __future__ import annotations

import torch

from atom_kernels.activation import silu_and_mul_torch
from atom_kernels.registry import define_op

topk_softmax = define_op(
    "topk_softmax", "topk_softmax(router_logits, top_k, renormalize) -> (weights fp32, ids int32)"
)
fused_moe = define_op(
    "fused_moe",
    "fused_moe(x, w13, w2, topk_weights, topk_ids) -> sum_k w_k * down(silu_and_mul(gate_up_k(x)))",
)


@topk_softmax.register("torch")
def topk_softmax_torch(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


@fused_moe.register("torch")
def fused_moe_torch(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.reshape(-1)
    token_of = torch.arange(x.shape[0], device=x.device).repeat_interleave(topk_ids.shape[1])
    flat_weights = topk_weights.reshape(-1)
    for expert in flat_ids.unique().tolist():
        rows = (flat_ids == expert).nonzero().squeeze(1)
        tokens = token_of[rows]
        hidden = silu_and_mul_torch(x[tokens] @ w13[expert].t())
        expert_out = (hidden @ w2[expert].t()).float() * flat_weights[rows, None].float()
        out.index_add_(0, tokens, expert_out)
    return out.to(x.dtype)
