"""Mixture-of-experts routing: hidden states -> fp32 router logits -> (weights fp32, expert ids
int32), both [T, top_k].

``grouped_topk`` is DeepSeek's group-limited routing: experts fall into ``num_expert_group`` groups,
the best ``topk_group`` groups are kept, and ``top_k`` experts are picked among them. With an
``e_score_correction_bias`` (DeepSeek-V3's noaux_tc) the bias steers the choice only: a group scores
the sum of its two best biased scores, and the returned weights are the unbiased scores. Semantics
follow HF transformers' ``DeepseekV3TopkRouter`` (sigmoid scoring) and vLLM's ``grouped_topk``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.registry import define_op
from atom_kernels.triton_utils import cdiv, check_last_dim_contiguous, next_pow2


@define_op
def router_logits(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """fp32 logits ``x @ weight.T + bias`` [T, E] of 16-bit or fp32 ``x`` [T, D] and ``weight``
    [E, D], accumulated in fp32. DeepSeek-V3 and GLM-4-MoE score experts in fp32: rounding the
    logits to bf16 flips near-tied experts."""


@define_op
def topk_softmax(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``top_k`` experts of each token by softmax probability: ``(weights fp32, ids int32)``,
    weights renormalised to sum to 1 when ``renormalize``."""


@define_op
def grouped_topk(
    router_logits: torch.Tensor,
    top_k: int,
    num_expert_group: int,
    topk_group: int,
    renormalize: bool,
    scoring_func: str = "sigmoid",
    e_score_correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's group-limited routing (module doc): ``(weights fp32, ids int32)``, weights times
    ``routed_scaling_factor``; ``scoring_func`` is ``"sigmoid"`` or ``"softmax"``."""


@router_logits.register("torch")
def router_logits_torch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    return torch.nn.functional.linear(x.float(), weight.float(), None if bias is None else bias.float())


@router_logits.register("torchlib")
def router_logits_torchlib(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """16-bit operands straight into the tensor cores with an fp32 output (cuBLAS): the same
    products as the fp32 GEMM of their widened values (a product of two bf16 values is exact in
    fp32), without widening a [T, D] copy of ``x`` and without an fp32 GEMM on CUDA cores."""
    if x.dtype == torch.float32 or x.dtype != weight.dtype:
        return router_logits_torch(x, weight, bias)
    logits = torch.mm(x, weight.t(), out_dtype=torch.float32)
    return logits if bias is None else logits.add_(bias.float())


@topk_softmax.register("torch")
def topk_softmax_torch(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def _scores(router_logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    if scoring_func == "sigmoid":
        return router_logits.float().sigmoid()
    if scoring_func == "softmax":
        return torch.softmax(router_logits.float(), dim=-1)
    raise ValueError(
        f"grouped_topk: scoring_func must be 'sigmoid' or 'softmax', got {scoring_func!r}"
    )


@grouped_topk.register("torch")
def grouped_topk_torch(
    router_logits: torch.Tensor,
    top_k: int,
    num_expert_group: int,
    topk_group: int,
    renormalize: bool,
    scoring_func: str = "sigmoid",
    e_score_correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    scores = _scores(router_logits, scoring_func)
    num_tokens, num_experts = scores.shape
    choice = scores if e_score_correction_bias is None else scores + e_score_correction_bias.float()
    grouped = choice.view(num_tokens, num_expert_group, -1)
    if e_score_correction_bias is None:
        group_scores = grouped.max(dim=-1).values
    else:
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
    group_idx = group_scores.topk(topk_group, dim=-1).indices
    group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_idx, True)
    expert_mask = group_mask.repeat_interleave(num_experts // num_expert_group, dim=1)
    ids = choice.masked_fill(~expert_mask, float("-inf")).topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, ids.to(torch.int32)


# --- Triton -------------------------------------------------------------------------------------


@triton.jit
def _take_topk(values, experts, TOP_K: tl.constexpr, K_P2: tl.constexpr):
    """The TOP_K largest of each row of ``values`` [BLOCK_T, E_P2] (masked entries are -inf)."""
    slots = tl.arange(0, K_P2)[None, :]
    top_values = tl.zeros([values.shape[0], K_P2], tl.float32)
    top_ids = tl.zeros([values.shape[0], K_P2], tl.int32)
    for i in tl.static_range(TOP_K):
        best_value, best = tl.max(
            values, axis=1, return_indices=True, return_indices_tie_break_left=True
        )
        top_values = tl.where(slots == i, best_value[:, None], top_values)
        top_ids = tl.where(slots == i, best[:, None], top_ids)
        values = tl.where(experts == best[:, None], float("-inf"), values)
    return top_values, top_ids


@triton.jit(do_not_specialize=["num_tokens"])
def _topk_softmax_kernel(
    logits_ptr,
    weights_ptr,
    ids_ptr,
    num_tokens,
    num_experts,
    logits_stride,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    E_P2: tl.constexpr,
    K_P2: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    experts = tl.arange(0, E_P2)[None, :]
    mask = (tokens < num_tokens) & (experts < num_experts)
    logits = tl.load(
        logits_ptr + tokens.to(tl.int64) * logits_stride + experts, mask=mask, other=float("-inf")
    )
    logits = logits.to(tl.float32)
    row_max = tl.max(logits, axis=1)
    probs = tl.exp(logits - tl.where(row_max == float("-inf"), 0.0, row_max)[:, None])
    denom = tl.sum(probs, axis=1)
    probs = probs / tl.where(denom == 0.0, 1.0, denom)[:, None]
    probs = tl.where(experts < num_experts, probs, float("-inf"))
    top_values, top_ids = _take_topk(probs, experts, TOP_K, K_P2)
    slots = tl.arange(0, K_P2)[None, :]
    if RENORMALIZE:
        kept_sum = tl.sum(tl.where(slots < TOP_K, top_values, 0.0), axis=1)
        top_values = top_values / tl.where(kept_sum == 0.0, 1.0, kept_sum)[:, None]
    out_mask = (tokens < num_tokens) & (slots < TOP_K)
    tl.store(weights_ptr + tokens * TOP_K + slots, top_values, mask=out_mask)
    tl.store(ids_ptr + tokens * TOP_K + slots, top_ids, mask=out_mask)


def _routing_outputs(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    if router_logits.dim() != 2:
        raise ValueError(
            f"routing: router_logits must be [num_tokens, num_experts], got {tuple(router_logits.shape)}"
        )
    check_last_dim_contiguous("router_logits", router_logits)
    if not 0 < top_k <= router_logits.shape[1]:
        raise ValueError(
            f"routing: top_k {top_k} out of range for {router_logits.shape[1]} experts"
        )
    shape = (router_logits.shape[0], top_k)
    device = router_logits.device
    return torch.empty(shape, dtype=torch.float32, device=device), torch.empty(
        shape, dtype=torch.int32, device=device
    )


# Grouped top-k runs one row per program up to this many tokens, eight per program above it.
_GROUPED_ONE_ROW_TOKENS = 1024
# One token count per launch config of the routing kernels: a start-up warm-up that routes each
# count compiles every variant serving can launch (SGLang has no warm-up pass of its own at prefill
# sizes: Moonlight's first long prefill compiled the eight-row grouped top-k while serving).
ROUTING_WARM_UP_TOKENS = (1, _GROUPED_ONE_ROW_TOKENS + 1)


def _routing_launch(e_p2: int, num_tokens: int, grouped: bool) -> tuple[int, int]:
    """(rows per program, warps). Routing is a latency-bound chain of reductions over each row, so a
    row's reductions stay inside one warp and the rows spread over many programs. From an H200 sweep
    against vLLM's kernels (2026-11): top-k softmax over 128 experts took 2.4 us with 4 rows on 4
    warps, 6.1 us with 16 rows on 4 warps. Grouped top-k (measured before its [groups, members]
    rewrite) took 2.6-2.8 us with one row on one warp up to 256 tokens, 4.4-4.5 us with 16 rows on 4
    warps; packing rows won only from a few thousand tokens (9.9 vs 13.7 us at 8192)."""
    if grouped:
        return (1, 1) if num_tokens <= _GROUPED_ONE_ROW_TOKENS else (8, 4)
    return 4, max(1, min(4, e_p2 // 32))


@topk_softmax.register("triton")
def topk_softmax_triton(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    weights, ids = _routing_outputs(router_logits, top_k)
    num_tokens, num_experts = router_logits.shape
    if num_tokens == 0:
        return weights, ids
    e_p2 = next_pow2(num_experts)
    block_t, num_warps = _routing_launch(e_p2, num_tokens, grouped=False)
    _topk_softmax_kernel[(cdiv(num_tokens, block_t),)](
        router_logits,
        weights,
        ids,
        num_tokens,
        num_experts,
        router_logits.stride(0),
        TOP_K=top_k,
        RENORMALIZE=renormalize,
        BLOCK_T=block_t,
        E_P2=e_p2,
        K_P2=next_pow2(top_k),
        num_warps=num_warps,
    )
    return weights, ids


@triton.jit
def _router_scores(logits, row_max, denom, SIGMOID: tl.constexpr):
    """Sigmoid scores, or softmax probabilities from the row's max and normaliser."""
    if SIGMOID:
        return tl.sigmoid(logits)
    return tl.exp(logits - row_max) / denom


@triton.jit(do_not_specialize=["num_tokens"])
def _grouped_topk_kernel(
    logits_ptr,
    bias_ptr,
    weights_ptr,
    ids_ptr,
    num_tokens,
    num_experts,
    logits_stride,
    routed_scaling_factor,
    TOP_K: tl.constexpr,
    NUM_GROUPS: tl.constexpr,
    TOPK_GROUP: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    SIGMOID: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_T: tl.constexpr,
    E_P2: tl.constexpr,
    G_P2: tl.constexpr,
    S_P2: tl.constexpr,
    K_P2: tl.constexpr,
):
    """Each row is read twice from the same lines: as [experts] for the final top-k and as
    [groups, group members] so that every group's score is one reduction over the last axis."""
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
    rows = logits_ptr + tokens.to(tl.int64) * logits_stride
    experts = tl.arange(0, E_P2)[None, :]
    valid = experts < num_experts
    logits = tl.load(rows + experts, mask=(tokens < num_tokens) & valid, other=float("-inf"))
    logits = logits.to(tl.float32)
    row_max = tl.max(logits, axis=1)[:, None]
    row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    denom = 1.0
    if not SIGMOID:
        denom = tl.sum(tl.exp(logits - row_max), axis=1)[:, None]
    choice = _router_scores(logits, row_max, denom, SIGMOID)
    if HAS_BIAS:
        choice += tl.load(bias_ptr + experts, mask=valid, other=0.0).to(tl.float32)
    choice = tl.where(valid, choice, float("-inf"))

    group_size = num_experts // NUM_GROUPS
    groups = tl.arange(0, G_P2)[None, :, None]
    members = tl.arange(0, S_P2)[None, None, :]
    in_group = (groups < NUM_GROUPS) & (members < group_size)
    grouped = groups * group_size + members
    logits3 = tl.load(
        rows[:, :, None] + grouped, mask=(tokens[:, :, None] < num_tokens) & in_group, other=0.0
    ).to(tl.float32)
    key = _router_scores(logits3, row_max[:, :, None], denom, SIGMOID)
    if HAS_BIAS:
        key += tl.load(bias_ptr + grouped, mask=in_group, other=0.0).to(tl.float32)
    key = tl.where(in_group, key, float("-inf"))
    if HAS_BIAS:  # DeepSeek-V3 noaux_tc: a group scores the sum of its two best
        first, first_idx = tl.max(key, axis=2, return_indices=True, return_indices_tie_break_left=True)
        second = tl.max(tl.where(members == first_idx[:, :, None], float("-inf"), key), axis=2)
        group_scores = first + second
    else:
        group_scores = tl.max(key, axis=2)

    group_of = experts // group_size
    group_slots = tl.arange(0, G_P2)[None, :]
    kept = tl.zeros([BLOCK_T, E_P2], tl.int1)
    for _ in tl.static_range(TOPK_GROUP):
        _, best_group = tl.max(
            group_scores, axis=1, return_indices=True, return_indices_tie_break_left=True
        )
        kept = kept | (group_of == best_group[:, None])
        group_scores = tl.where(group_slots == best_group[:, None], float("-inf"), group_scores)

    _, top_ids = _take_topk(tl.where(kept, choice, float("-inf")), experts, TOP_K, K_P2)
    slots = tl.arange(0, K_P2)[None, :]
    out_mask = (tokens < num_tokens) & (slots < TOP_K)
    # The weights are the unbiased scores of the picked experts: read their logits again.
    top_logits = tl.load(rows + top_ids, mask=out_mask, other=float("-inf")).to(tl.float32)
    top_values = tl.where(out_mask, _router_scores(top_logits, row_max, denom, SIGMOID), 0.0)
    if RENORMALIZE:
        top_values = top_values / (tl.sum(top_values, axis=1)[:, None] + 1e-20)
    top_values = top_values * routed_scaling_factor
    tl.store(weights_ptr + tokens * TOP_K + slots, top_values, mask=out_mask)
    tl.store(ids_ptr + tokens * TOP_K + slots, top_ids, mask=out_mask)


@grouped_topk.register("triton")
def grouped_topk_triton(
    router_logits: torch.Tensor,
    top_k: int,
    num_expert_group: int,
    topk_group: int,
    renormalize: bool,
    scoring_func: str = "sigmoid",
    e_score_correction_bias: torch.Tensor | None = None,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    if scoring_func not in ("sigmoid", "softmax"):
        raise ValueError(
            f"grouped_topk: scoring_func must be 'sigmoid' or 'softmax', got {scoring_func!r}"
        )
    weights, ids = _routing_outputs(router_logits, top_k)
    num_tokens, num_experts = router_logits.shape
    if num_experts % num_expert_group or not 0 < topk_group <= num_expert_group:
        raise ValueError(
            f"grouped_topk: {num_experts} experts, {num_expert_group} groups, topk_group {topk_group}"
        )
    if num_tokens == 0:
        return weights, ids
    e_p2 = next_pow2(num_experts)
    block_t, num_warps = _routing_launch(e_p2, num_tokens, grouped=True)
    _grouped_topk_kernel[(cdiv(num_tokens, block_t),)](
        router_logits,
        e_score_correction_bias,
        weights,
        ids,
        num_tokens,
        num_experts,
        router_logits.stride(0),
        routed_scaling_factor,
        TOP_K=top_k,
        NUM_GROUPS=num_expert_group,
        TOPK_GROUP=topk_group,
        RENORMALIZE=renormalize,
        SIGMOID=scoring_func == "sigmoid",
        HAS_BIAS=e_score_correction_bias is not None,
        BLOCK_T=block_t,
        E_P2=e_p2,
        G_P2=next_pow2(num_expert_group),
        S_P2=next_pow2(num_experts // num_expert_group),
        K_P2=next_pow2(top_k),
        num_warps=num_warps,
    )
    return weights, ids
