"""AITER adapters of :mod:`atom_kernels.routing` (MoE routing): ``aiter`` imported per call."""

from __future__ import annotations

import torch

from atom_kernels.routing import grouped_topk, topk_softmax


def _routing_buffers(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (router_logits.shape[0], top_k)
    return (
        torch.empty(shape, dtype=torch.float32, device=router_logits.device),
        torch.empty(shape, dtype=torch.int32, device=router_logits.device),
    )


@topk_softmax.register("aiter")
def topk_softmax_aiter(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    import aiter

    weights, ids = _routing_buffers(router_logits, top_k)
    token_expert_indices = torch.empty_like(ids)
    aiter.topk_softmax(weights, ids, token_expert_indices, router_logits, renormalize)
    return weights, ids


@grouped_topk.register("aiter")
def grouped_topk_aiter(
    router_logits: torch.Tensor,
    top_k: int,
    num_expert_group: int,
    topk_group: int,
    renormalize: bool,
    scoring_func: str = "sigmoid",
    e_score_correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    import aiter

    weights, ids = _routing_buffers(router_logits, top_k)
    if e_score_correction_bias is not None:
        if scoring_func != "sigmoid":
            raise ValueError("grouped_topk (aiter): a correction bias needs sigmoid scoring")
        aiter.biased_grouped_topk(
            router_logits,
            e_score_correction_bias.to(router_logits.dtype),
            weights,
            ids,
            num_expert_group,
            topk_group,
            renormalize,
            routed_scaling_factor,
        )
    else:
        if scoring_func not in ("sigmoid", "softmax"):
            raise ValueError(
                f"grouped_topk: scoring_func must be 'sigmoid' or 'softmax', got {scoring_func!r}"
            )
        aiter.grouped_topk(
            router_logits,
            weights,
            ids,
            num_expert_group,
            topk_group,
            renormalize,
            scoring_func == "softmax",  # AITER's is_softmax
            routed_scaling_factor,
        )
    return weights, ids
