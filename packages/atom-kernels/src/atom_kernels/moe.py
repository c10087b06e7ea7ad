"""Mixture-of-experts routing and the fused expert computation.

Expert weights use the stacked layout: ``w13`` [E, 2 * I, D] holds [gate | up] rows (interleaved
gate/up rows, GPT-OSS's checkpoint layout, with ``interleaved=True``), ``w2`` [E, D, I]. Routing
returns fp32 weights and int32 expert ids, both [num_tokens, top_k].

``grouped_topk`` is DeepSeek's group-limited routing: experts fall into ``num_expert_group`` groups,
the best ``topk_group`` groups are kept, and ``top_k`` experts are picked among them. With an
``e_score_correction_bias`` (DeepSeek-V3's noaux_tc) the bias steers the choice only: a group scores
the sum of its two best biased scores, and the returned weights are the unbiased scores. Semantics
follow HF transformers' ``DeepseekV3TopkRouter`` (sigmoid scoring) and vLLM's ``grouped_topk``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from atom_kernels.activation import (
    ACT_CLAMPED_SWIGLU,
    ACT_GELU,
    ACT_GELU_TANH,
    ACT_SILU,
    apply_gated_activation,
    clamped_swiglu_torch,
    gelu_and_mul_torch,
    silu_and_mul_torch,
)
from atom_kernels.moe_align import moe_align_block_size_triton
from atom_kernels.registry import define_op
from atom_kernels.triton_utils import check_last_dim_contiguous, dot_precision, next_pow2
from atom_kernels.tuned import all_tuned_configs, tuned_config

topk_softmax = define_op(
    "topk_softmax", "topk_softmax(router_logits, top_k, renormalize) -> (weights fp32, ids int32)"
)
grouped_topk = define_op(
    "grouped_topk",
    "grouped_topk(router_logits, top_k, num_expert_group, topk_group, renormalize, scoring_func, "
    "e_score_correction_bias, routed_scaling_factor) -> (weights fp32, ids int32)",
)
fused_moe = define_op(
    "fused_moe",
    "fused_moe(x, w13, w2, topk_weights, topk_ids) -> sum_k w_k * down(silu_and_mul(gate_up_k(x)))",
)

ACTIVATIONS = {
    "silu": ACT_SILU,
    "gelu": ACT_GELU,
    "gelu_tanh": ACT_GELU_TANH,
    "clamped_swiglu": ACT_CLAMPED_SWIGLU,
}


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


def _expert_activation(
    h: torch.Tensor, activation: str, alpha: float, limit: float, interleaved: bool
) -> torch.Tensor:
    if activation == "clamped_swiglu":
        return clamped_swiglu_torch(h, alpha, limit, interleaved)
    if interleaved:
        h = torch.cat([h[..., 0::2], h[..., 1::2]], dim=-1)
    if activation == "silu":
        return silu_and_mul_torch(h)
    if activation in ("gelu", "gelu_tanh"):
        return gelu_and_mul_torch(h, "tanh" if activation == "gelu_tanh" else "none")
    raise ValueError(f"fused_moe: unknown activation {activation!r}; known: {sorted(ACTIVATIONS)}")


@fused_moe.register("torch")
def fused_moe_torch(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    interleaved: bool = False,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
) -> torch.Tensor:
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.reshape(-1)
    token_of = torch.arange(x.shape[0], device=x.device).repeat_interleave(topk_ids.shape[1])
    flat_weights = topk_weights.reshape(-1)
    for expert in flat_ids.unique().tolist():
        rows = (flat_ids == expert).nonzero().squeeze(1)
        tokens = token_of[rows]
        gate_up = x[tokens] @ w13[expert].t()
        if w13_bias is not None:
            gate_up = gate_up + w13_bias[expert]
        hidden = _expert_activation(gate_up, activation, swiglu_alpha, swiglu_limit, interleaved)
        down = hidden @ w2[expert].t()
        if w2_bias is not None:
            down = down + w2_bias[expert]
        out.index_add_(0, tokens, down.float() * flat_weights[rows, None].float())
    return out.to(x.dtype)


# --- Triton routing -------------------------------------------------------------------------------


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


def _routing_launch(e_p2: int, num_tokens: int, grouped: bool) -> tuple[int, int]:
    """(rows per program, warps). Routing is a latency-bound chain of reductions over each row, so a
    row's reductions stay inside one warp and the rows spread over many programs. From an H200 sweep
    against vLLM's kernels (session 5): top-k softmax over 128 experts took 2.4 us with 4 rows on 4
    warps, 6.1 us with 16 rows on 4 warps. Grouped top-k (measured before its [groups, members]
    rewrite) took 2.6-2.8 us with one row on one warp up to 256 tokens, 4.4-4.5 us with 16 rows on 4
    warps; packing rows won only from a few thousand tokens (9.9 vs 13.7 us at 8192)."""
    if grouped:
        return (1, 1) if num_tokens <= 1024 else (8, 4)
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
    _topk_softmax_kernel[(triton.cdiv(num_tokens, block_t),)](
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
    _grouped_topk_kernel[(triton.cdiv(num_tokens, block_t),)](
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


# --- Triton fused MoE -----------------------------------------------------------------------------
#
# 1. moe_align_block_size (atom_kernels.moe_align) sorts the (token, k) entries by expert and pads
#    each expert's run to a multiple of BLOCK_M, so every BLOCK_M rows of the sorted order belong to
#    one expert.
# 2. _moe_gemm_kernel, gated: per block, x[token rows] @ w13[e]^T for the gate and the up halves at once,
#    the activation applied in the epilogue -> hidden [T * top_k, I].
# 3. _moe_gemm_kernel, plain: hidden rows @ w2[e]^T times the routing weight -> [T * top_k, D].
# 4. _moe_sum_kernel sums the top_k rows of each token.


@triton.jit(do_not_specialize=["num_entries"])
def _moe_gemm_kernel(
    a_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    topk_weights_ptr,
    sorted_ids_ptr,
    block_expert_ptr,
    num_entries,
    N,
    K,
    a_stride,
    w_stride_e,
    w_stride_n,
    bias_stride_e,
    out_stride,
    up_offset,
    gate_up_step,
    alpha,
    limit,
    A_ROW_DIVISOR: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MUL_ROUTED_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    # Grouped program order: GROUP_M row blocks share each weight column block while it is in L2.
    pid = tl.program_id(0)
    num_pid_m = tl.num_programs(0) // tl.cdiv(N, BLOCK_N)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_size
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_size

    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    entries = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    row_valid = entries < num_entries
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_valid = cols < N
    # Padding rows read row 0 and columns past N wrap around: the loads stay in bounds without
    # masks, and the store drops those rows and columns.
    a_rows = (
        a_ptr + tl.where(row_valid, entries // A_ROW_DIVISOR, 0).to(tl.int64)[:, None] * a_stride
    )
    w_expert = w_ptr + expert * w_stride_e
    # Gate/up row n of w13 is n * gate_up_step (+ up_offset for up): step 1 and offset I for the
    # stacked [gate | up] layout, step 2 and offset 1 for interleaved rows.
    w_rows = (cols % N) * gate_up_step
    w_cols = w_expert + w_rows.to(tl.int64)[None, :] * w_stride_n
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if GATED:
        up_cols = w_expert + (w_rows + up_offset).to(tl.int64)[None, :] * w_stride_n
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        if EVEN_K:
            a = tl.load(a_rows + ks[None, :])
            w = tl.load(w_cols + ks[:, None])
        else:
            a = tl.load(a_rows + ks[None, :], mask=(ks < K)[None, :], other=0.0)
            w = tl.load(w_cols + ks[:, None], mask=(ks < K)[:, None], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
        if GATED:
            if EVEN_K:
                w_up = tl.load(up_cols + ks[:, None])
            else:
                w_up = tl.load(up_cols + ks[:, None], mask=(ks < K)[:, None], other=0.0)
            acc_up = tl.dot(a, w_up, acc_up, input_precision=DOT_PRECISION)

    if HAS_BIAS:
        bias_row = bias_ptr + expert * bias_stride_e
        acc += tl.load(bias_row + cols * gate_up_step, mask=col_valid, other=0.0).to(tl.float32)[
            None, :
        ]
        if GATED:
            up_bias = tl.load(bias_row + cols * gate_up_step + up_offset, mask=col_valid, other=0.0)
            acc_up += up_bias.to(tl.float32)[None, :]
    if GATED:
        acc = apply_gated_activation(acc, acc_up, ACT, alpha, limit)
    if MUL_ROUTED_WEIGHT:
        acc = (
            acc
            * tl.load(topk_weights_ptr + entries, mask=row_valid, other=0.0).to(tl.float32)[:, None]
        )
    out = out_ptr + entries.to(tl.int64)[:, None] * out_stride + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & col_valid[None, :])


def default_moe_config(num_entries: int, num_experts: int) -> dict:
    """Tile sizes by the expected rows per expert, for GPUs with no tuned table: one row block size
    (it fixes the sort's padding) and the same tiles for both GEMMs."""
    rows_per_expert = num_entries / num_experts
    if rows_per_expert <= 16:
        block_m, tiles = 16, {"BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4}
    elif rows_per_expert <= 64:
        block_m, tiles = 32, {"BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 4, "num_warps": 4}
    else:
        block_m, tiles = 64, {"BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8}
    tiles["num_stages"] = 3
    return {"BLOCK_M": block_m, "gate_up": tiles, "down": tiles}


def moe_shape_key(num_experts: int, hidden: int, inter: int, top_k: int, dtype: torch.dtype) -> str:
    """The key of a fused-MoE shape in the tuned tables (atom_kernels.tuned)."""
    return f"E={num_experts},D={hidden},I={inter},top_k={top_k},dtype={str(dtype).split('.')[-1]}"


def moe_config(shape_key: str, num_tokens: int, num_experts: int, top_k: int, x: torch.Tensor) -> dict:
    """{"BLOCK_M", "gate_up": tiles, "down": tiles}: this GPU's tuned entry for ``shape_key``
    (:func:`moe_shape_key`), else the defaults."""
    tuned = tuned_config("fused_moe", shape_key, num_tokens, x.device)
    return tuned or default_moe_config(num_tokens * top_k, num_experts)


def launch_moe_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    topk_weights: torch.Tensor | None,
    sorted_ids: torch.Tensor,
    block_expert: torch.Tensor,
    num_entries: int,
    a_row_divisor: int,
    block_m: int,
    tiles: dict[str, int],
    *,
    gated: bool = False,
    act: int = ACT_SILU,
    interleaved: bool = False,
    alpha: float = 0.0,
    limit: float = math.inf,
) -> None:
    n, k = out.shape[1], a.shape[1]
    up_offset, step = (1, 2) if interleaved else (n, 1)
    if not gated:
        up_offset, step = 0, 1
    grid = (block_expert.shape[0] * triton.cdiv(n, tiles["BLOCK_N"]),)
    _moe_gemm_kernel[grid](
        a,
        w,
        bias,
        out,
        topk_weights,
        sorted_ids,
        block_expert,
        num_entries,
        n,
        k,
        a.stride(0),
        w.stride(0),
        w.stride(1),
        bias.stride(0) if bias is not None else 0,
        out.stride(0),
        up_offset,
        step,
        alpha,
        limit,
        A_ROW_DIVISOR=a_row_divisor,
        GATED=gated,
        ACT=act,
        HAS_BIAS=bias is not None,
        MUL_ROUTED_WEIGHT=topk_weights is not None,
        DOT_PRECISION=dot_precision(a.dtype),
        EVEN_K=k % tiles["BLOCK_K"] == 0,
        BLOCK_M=block_m,
        **tiles,
    )


@fused_moe.register("triton")
def fused_moe_triton(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    interleaved: bool = False,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
) -> torch.Tensor:
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"fused_moe: unknown activation {activation!r}; known: {sorted(ACTIVATIONS)}"
        )
    num_tokens, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    if w13.shape != (num_experts, 2 * inter, hidden) or w2.shape != (num_experts, hidden, inter):
        raise ValueError(
            f"fused_moe: x {tuple(x.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}"
        )
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != num_tokens:
        raise ValueError(
            f"fused_moe: topk_ids {tuple(topk_ids.shape)}, topk_weights {tuple(topk_weights.shape)}"
        )
    if w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise ValueError(f"fused_moe: weights {w13.dtype}/{w2.dtype} must match x {x.dtype}")
    for name, t in (("x", x), ("w13", w13), ("w2", w2)):
        check_last_dim_contiguous(name, t)
    top_k = topk_ids.shape[1]
    if num_tokens == 0:
        return torch.zeros_like(x)
    gemm_options = {
        "act": ACTIVATIONS[activation],
        "interleaved": interleaved,
        "alpha": swiglu_alpha,
        "limit": swiglu_limit,
        "w13_bias": w13_bias,
        "w2_bias": w2_bias,
    }
    key = moe_shape_key(num_experts, hidden, inter, top_k, x.dtype)
    if x.is_cuda and key not in _compiled_shapes and not torch.cuda.is_current_stream_capturing():
        # Compile every tuned config of this shape now (one token each), before serving starts,
        # rather than the first time a batch size falls into its bucket.
        _compiled_shapes.add(key)
        for config in all_tuned_configs("fused_moe", key, x.device):
            run_fused_moe(x[:1], w13, w2, topk_weights[:1], topk_ids[:1], config, **gemm_options)
    config = moe_config(key, num_tokens, num_experts, top_k, x)
    return run_fused_moe(x, w13, w2, topk_weights, topk_ids, config, **gemm_options)


_compiled_shapes: set[str] = set()


def run_fused_moe(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    config: dict,
    *,
    act: int = ACT_SILU,
    interleaved: bool = False,
    alpha: float = 1.702,
    limit: float = 7.0,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Triton fused MoE with a given tile config (:func:`moe_config`'s form); no checks."""
    num_tokens, hidden = x.shape
    num_experts, inter = w13.shape[0], w2.shape[2]
    top_k = topk_ids.shape[1]
    num_entries = num_tokens * top_k
    block_m = config["BLOCK_M"]
    sorted_ids, block_expert = moe_align_block_size_triton(topk_ids, num_experts, block_m)
    hidden_states = torch.empty((num_entries, inter), dtype=x.dtype, device=x.device)
    launch_moe_gemm(
        x,
        w13,
        w13_bias,
        hidden_states,
        None,
        sorted_ids,
        block_expert,
        num_entries,
        top_k,
        block_m,
        config["gate_up"],
        gated=True,
        act=act,
        interleaved=interleaved,
        alpha=alpha,
        limit=limit,
    )
    expert_out = torch.empty((num_entries, hidden), dtype=x.dtype, device=x.device)
    launch_moe_gemm(
        hidden_states,
        w2,
        w2_bias,
        expert_out,
        topk_weights.reshape(-1).contiguous(),
        sorted_ids,
        block_expert,
        num_entries,
        1,
        block_m,
        config["down"],
    )
    out = torch.empty_like(x)
    block_d = min(1024, next_pow2(hidden))
    _moe_sum_kernel[(num_tokens, triton.cdiv(hidden, block_d))](
        expert_out, out, hidden, TOP_K=top_k, BLOCK_D=block_d, num_warps=4
    )
    return out


@triton.jit
def _moe_sum_kernel(rows_ptr, out_ptr, hidden, TOP_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[t] = sum over k of rows[t * TOP_K + k] (fp32 accumulation), for one BLOCK_D slice."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = cols < hidden
    acc = tl.zeros([BLOCK_D], tl.float32)
    for k in tl.static_range(TOP_K):
        acc += tl.load(rows_ptr + (token * TOP_K + k) * hidden + cols, mask=mask, other=0.0).to(
            tl.float32
        )
    tl.store(out_ptr + token * hidden + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)
