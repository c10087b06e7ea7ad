"""The gated delta rule: the linear attention of Qwen3-Next's Gated DeltaNet layers.

Per value head, a state ``S`` [K, V] runs over the tokens of a sequence; for token ``t``::

    S = exp(g_t) * S
    S = S + k_t^T (beta_t * (v_t - k_t S))      # the delta rule: write the part S mispredicts
    o_t = q_t S

with ``q_t`` and ``k_t`` L2-normalised (``use_qk_l2norm``, eps 1e-6 inside the root as HF and FLA
have it) and ``q_t`` scaled by ``1 / sqrt(K)``; all of it in fp32, as HF's
``torch_recurrent_gated_delta_rule`` and ``torch_chunk_gated_delta_rule`` compute it.
Shapes: ``q``, ``k`` [T, HK, K]; ``v`` [T, HV, V]; ``g`` (log decay, <= 0) and ``beta`` [T, HV];
value head ``h`` reads query/key head ``h // (HV // HK)``. ``state`` [N, HV, K, V] holds one state
per sequence; the ops read it (where ``has_initial_state`` says so, zeros otherwise) and overwrite it
with the final state. The output has ``q``'s dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.registry import define_op
from atom_kernels.triton_utils import (
    check_last_dim_contiguous,
    check_same_device,
    check_shape,
    check_state_seqs,
    next_pow2,
)

L2NORM_EPS = tl.constexpr(1e-6)
CHUNK_SIZE = 64


@define_op
def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor,
    has_initial_state: torch.Tensor,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """Prefill/extend over packed sequences (``cu_seqlens`` [N + 1]): -> o [T, HV, V]; ``state``
    [N, HV, K, V] is read where ``has_initial_state`` [N] and overwritten with the final state."""


@define_op
def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """Decode: one token per sequence (``q`` [N, HK, K], ...) -> o [N, HV, V]; one recurrent step
    of ``state`` [N, HV, K, V], in place."""


def _check_args(
    op: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    num_seqs: int,
) -> None:
    if q.dim() != 3 or v.dim() != 3:
        raise ValueError(
            f"{op}: q must be [num_tokens, num_k_heads, head_k_dim] and v [num_tokens, num_v_heads, "
            f"head_v_dim], got q {tuple(q.shape)} and v {tuple(v.shape)}"
        )
    num_tokens, num_k_heads, head_k_dim = q.shape
    num_v_heads, head_v_dim = v.shape[1:]
    if num_v_heads % num_k_heads:
        raise ValueError(f"{op}: {num_v_heads} value heads not a multiple of {num_k_heads} key heads")
    check_shape(op, "k", k, q.shape)
    check_shape(op, "v", v, (num_tokens, num_v_heads, head_v_dim))
    check_shape(op, "g", g, (num_tokens, num_v_heads))
    check_shape(op, "beta", beta, (num_tokens, num_v_heads))
    check_shape(op, "state", state, (num_seqs, num_v_heads, head_k_dim, head_v_dim))
    check_same_device(q=q, k=k, v=v, g=g, beta=beta, state=state)


def _recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    use_qk_l2norm: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference, token by token in fp32 over dim 1 of [B, L, H, D] inputs (``g``, ``beta``
    [B, L, HV]) from ``state`` [B, HV, K, V]: returns (o [B, L, HV, V] fp32, the final state)."""
    group = v.shape[2] // q.shape[2]
    q, k = (t.float().repeat_interleave(group, dim=2) for t in (q, k))
    if use_qk_l2norm:
        q, k = (t * torch.rsqrt((t * t).sum(-1, keepdim=True) + L2NORM_EPS.value) for t in (q, k))
    q = q * q.shape[-1] ** -0.5
    v, g, beta = v.float(), g.float(), beta.float()
    state = state.float()
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for t in range(q.shape[1]):
        state = state * g[:, t].exp()[:, :, None, None]
        predicted = torch.einsum("bhk,bhkv->bhv", k[:, t], state)
        delta = (v[:, t] - predicted) * beta[:, t, :, None]
        state = state + k[:, t, :, :, None] * delta[:, :, None, :]
        out[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t], state)
    return out, state


@gated_delta_rule.register("torch")
def gated_delta_rule_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor,
    has_initial_state: torch.Tensor,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    num_seqs = check_state_seqs("gated_delta_rule", cu_seqlens, has_initial_state)
    _check_args("gated_delta_rule", q, k, v, g, beta, state, num_seqs)
    out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    starts, initial = cu_seqlens.tolist(), has_initial_state.tolist()
    for seq in range(num_seqs):
        tokens = slice(starts[seq], starts[seq + 1])
        start_state = state[seq] if initial[seq] else torch.zeros_like(state[seq])
        o, final_state = _recurrence(
            q[None, tokens], k[None, tokens], v[None, tokens], g[None, tokens], beta[None, tokens],
            start_state[None], use_qk_l2norm,
        )
        out[tokens] = o[0].to(q.dtype)
        state[seq] = final_state[0].to(state.dtype)
    return out


@gated_delta_rule_decode.register("torch")
def gated_delta_rule_decode_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    _check_args("gated_delta_rule_decode", q, k, v, g, beta, state, q.shape[0])
    o, final_state = _recurrence(
        q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], state, use_qk_l2norm
    )
    state.copy_(final_state)
    return o[:, 0].to(q.dtype)


@triton.jit
def _load_query_key(ptr, rows, row_mask, stride_t, cols, col_mask, USE_QK_L2NORM: tl.constexpr):
    """fp32 [len(rows), BLOCK_K] rows of q or k, L2-normalised when asked (masked entries 0)."""
    offs = rows.to(tl.int64)[:, None] * stride_t + cols[None, :]
    x = tl.load(ptr + offs, mask=row_mask[:, None] & col_mask[None, :], other=0.0).to(tl.float32)
    if USE_QK_L2NORM:
        x = x * tl.rsqrt(tl.sum(x * x, axis=1) + L2NORM_EPS)[:, None]
    return x


@triton.jit
def _state_pointers(state_ptr, seq, head, num_v_heads, k_cols, v_cols, HEAD_K: tl.constexpr,
                    HEAD_V: tl.constexpr):
    """[BLOCK_K, BLOCK_V] pointers into a contiguous [N, HV, K, V] state."""
    base = (seq.to(tl.int64) * num_v_heads + head) * HEAD_K * HEAD_V
    return state_ptr + base + k_cols[:, None] * HEAD_V + v_cols[None, :]


@triton.jit
def _gated_delta_rule_chunk_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    out_ptr,
    state_ptr,
    cu_seqlens_ptr,
    has_initial_state_ptr,
    num_v_heads,
    group,
    q_stride_t,
    q_stride_h,
    k_stride_t,
    k_stride_h,
    v_stride_t,
    v_stride_h,
    g_stride_t,
    beta_stride_t,
    out_stride_t,
    scale,
    HEAD_K: tl.constexpr,
    HEAD_V: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One program per (sequence, value head, block of value columns): the columns of S are
    independent, so it walks its sequence chunk by chunk, carrying its slice of S [K, BLOCK_V].

    Per chunk of C tokens with cumulative log decays G (the WY form of HF's chunked function):
    A = strictly-lower(diag(beta) k k^T * exp(G_i - G_j)), T = (I + A)^-1,
    u = T (beta v), w = T (beta exp(G) k), v' = u - w S,
    o = (exp(G) q) S + lower(q k^T * exp(G_i - G_j)) v',
    S = exp(G_last) S + (exp(G_last - G) k)^T v'.
    Padded rows of the last chunk have k = v = beta = g = 0 and so change nothing.
    """
    seq = tl.program_id(0)
    head = tl.program_id(1)
    key_head = head // group
    start = tl.load(cu_seqlens_ptr + seq)
    length = tl.load(cu_seqlens_ptr + seq + 1) - start
    k_cols = tl.arange(0, BLOCK_K)
    k_mask = k_cols < HEAD_K
    v_cols = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    v_mask = v_cols < HEAD_V
    state_ptrs = _state_pointers(state_ptr, seq, head, num_v_heads, k_cols, v_cols, HEAD_K, HEAD_V)
    state_mask = k_mask[:, None] & v_mask[None, :]
    has_initial = tl.load(has_initial_state_ptr + seq) != 0
    S = tl.load(state_ptrs, mask=state_mask & has_initial, other=0.0).to(tl.float32)

    rows = tl.arange(0, CHUNK)
    causal = rows[:, None] >= rows[None, :]
    strictly_lower = rows[:, None] > rows[None, :]
    for chunk_start in range(0, length, CHUNK):
        row_mask = chunk_start + rows < length
        tokens = start + chunk_start + rows
        q = _load_query_key(q_ptr + key_head * q_stride_h, tokens, row_mask, q_stride_t, k_cols,
                            k_mask, USE_QK_L2NORM) * scale
        k = _load_query_key(k_ptr + key_head * k_stride_h, tokens, row_mask, k_stride_t, k_cols,
                            k_mask, USE_QK_L2NORM)
        v_offs = tokens.to(tl.int64)[:, None] * v_stride_t + head * v_stride_h + v_cols[None, :]
        v = tl.load(v_ptr + v_offs, mask=row_mask[:, None] & v_mask[None, :], other=0.0)
        v = v.to(tl.float32)
        g = tl.load(g_ptr + tokens.to(tl.int64) * g_stride_t + head, mask=row_mask, other=0.0)
        beta = tl.load(beta_ptr + tokens.to(tl.int64) * beta_stride_t + head, mask=row_mask,
                       other=0.0).to(tl.float32)
        G = tl.cumsum(g.to(tl.float32), axis=0)
        G_last = tl.sum(g.to(tl.float32), axis=0)
        # exp of masked (i < j) differences would overflow: mask before exp.
        decay = tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf")))

        kk = tl.dot(k, tl.trans(k), input_precision="ieee")
        A = tl.where(strictly_lower, kk * decay * beta[:, None], 0.0)
        # T = (I + A)^-1 by forward substitution, one row per step: T_i = e_i - A_i T.
        T = tl.zeros([CHUNK, CHUNK], dtype=tl.float32)
        for i in range(CHUNK):
            a_i = tl.sum(tl.where(rows[:, None] == i, A, 0.0), axis=0)
            t_i = tl.where(rows == i, 1.0, -tl.sum(a_i[:, None] * T, axis=0))
            T = tl.where(rows[:, None] == i, t_i[None, :], T)
        u = tl.dot(T, v * beta[:, None], input_precision="ieee")
        w = tl.dot(T, k * (beta * tl.exp(G))[:, None], input_precision="ieee")
        v_new = u - tl.dot(w, S, input_precision="ieee")

        qk = tl.where(causal, tl.dot(q, tl.trans(k), input_precision="ieee") * decay, 0.0)
        o = tl.dot(q * tl.exp(G)[:, None], S, input_precision="ieee")
        o += tl.dot(qk, v_new, input_precision="ieee")
        out_offs = tokens.to(tl.int64)[:, None] * out_stride_t + head * HEAD_V + v_cols[None, :]
        tl.store(out_ptr + out_offs, o.to(out_ptr.dtype.element_ty),
                 mask=row_mask[:, None] & v_mask[None, :])

        k_to_end = k * tl.exp(G_last - G)[:, None]
        S = S * tl.exp(G_last) + tl.dot(tl.trans(k_to_end), v_new, input_precision="ieee")
    tl.store(state_ptrs, S.to(state_ptr.dtype.element_ty), mask=state_mask)


@triton.jit
def _gated_delta_rule_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    out_ptr,
    state_ptr,
    num_v_heads,
    group,
    q_stride_t,
    q_stride_h,
    k_stride_t,
    k_stride_h,
    v_stride_t,
    v_stride_h,
    g_stride_t,
    beta_stride_t,
    out_stride_t,
    scale,
    HEAD_K: tl.constexpr,
    HEAD_V: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One recurrent step per (sequence, value head, block of value columns)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    key_head = head // group
    k_cols = tl.arange(0, BLOCK_K)
    k_mask = k_cols < HEAD_K
    v_cols = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    v_mask = v_cols < HEAD_V
    state_ptrs = _state_pointers(state_ptr, seq, head, num_v_heads, k_cols, v_cols, HEAD_K, HEAD_V)
    state_mask = k_mask[:, None] & v_mask[None, :]
    S = tl.load(state_ptrs, mask=state_mask, other=0.0).to(tl.float32)

    token = seq + tl.arange(0, 1)
    valid = tl.full([1], 1, tl.int1)
    q = _load_query_key(q_ptr + key_head * q_stride_h, token, valid, q_stride_t, k_cols, k_mask,
                        USE_QK_L2NORM) * scale
    k = _load_query_key(k_ptr + key_head * k_stride_h, token, valid, k_stride_t, k_cols, k_mask,
                        USE_QK_L2NORM)
    q, k = tl.reshape(q, [BLOCK_K]), tl.reshape(k, [BLOCK_K])
    row = seq.to(tl.int64)
    v = tl.load(v_ptr + row * v_stride_t + head * v_stride_h + v_cols, mask=v_mask, other=0.0)
    g = tl.load(g_ptr + row * g_stride_t + head).to(tl.float32)
    beta = tl.load(beta_ptr + row * beta_stride_t + head).to(tl.float32)

    S = S * tl.exp(g)
    delta = (v.to(tl.float32) - tl.sum(k[:, None] * S, axis=0)) * beta
    S = S + k[:, None] * delta[None, :]
    o = tl.sum(q[:, None] * S, axis=0)
    tl.store(out_ptr + row * out_stride_t + head * HEAD_V + v_cols, o.to(out_ptr.dtype.element_ty),
             mask=v_mask)
    tl.store(state_ptrs, S.to(state_ptr.dtype.element_ty), mask=state_mask)


def _launch_arguments(
    op: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, tuple, dict, int]:
    """The output and what both kernels take: (out, positional arguments, constexprs, V blocks)."""
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        check_last_dim_contiguous(f"{op} {name}", t)
    if not state.is_contiguous():
        raise ValueError(f"{op}: state must be contiguous, got strides {state.stride()}")
    num_k_heads, head_k_dim = q.shape[1:]
    num_v_heads, head_v_dim = v.shape[1:]
    out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    arguments = (
        num_v_heads,
        num_v_heads // num_k_heads,
        *q.stride()[:2],
        *k.stride()[:2],
        *v.stride()[:2],
        g.stride(0),
        beta.stride(0),
        out.stride(0),
        head_k_dim**-0.5,
    )
    block_v = min(max(next_pow2(head_v_dim), 16), 64)
    constexprs = dict(
        HEAD_K=head_k_dim,
        HEAD_V=head_v_dim,
        BLOCK_K=max(next_pow2(head_k_dim), 16),  # tl.dot's smallest tile
        BLOCK_V=block_v,
    )
    return out, arguments, constexprs, triton.cdiv(head_v_dim, block_v)


@gated_delta_rule.register("triton")
def gated_delta_rule_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state: torch.Tensor,
    has_initial_state: torch.Tensor,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """The chunked form, CHUNK_SIZE tokens per step, fp32 throughout (tl.dot in IEEE fp32).

    Not tuned yet: one program per (sequence, head, 64 value columns) walks its chunks in order;
    T = (I + A)^-1 is built row by row (CHUNK_SIZE serial steps, where FLA inverts 16 x 16 diagonal
    blocks and merges them); fp32 dot products forgo TF32 and bf16 tensor cores; no autotuning of
    BLOCK_V, warps or stages; no split of long sequences' work beyond the value-column blocks. At
    K = V = 128 it compiles for sm_90 (to a 3.8 MB cubin); its registers and spills are unmeasured.
    """
    num_seqs = check_state_seqs("gated_delta_rule", cu_seqlens, has_initial_state)
    _check_args("gated_delta_rule", q, k, v, g, beta, state, num_seqs)
    check_same_device(q=q, cu_seqlens=cu_seqlens, has_initial_state=has_initial_state)
    out, arguments, constexprs, v_blocks = _launch_arguments("gated_delta_rule", q, k, v, g, beta,
                                                             state)
    if num_seqs > 0:
        _gated_delta_rule_chunk_kernel[(num_seqs, v.shape[1], v_blocks)](
            q, k, v, g, beta, out, state, cu_seqlens, has_initial_state, *arguments,
            USE_QK_L2NORM=use_qk_l2norm, CHUNK=CHUNK_SIZE, **constexprs,
        )
    return out


@gated_delta_rule_decode.register("triton")
def gated_delta_rule_decode_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    _check_args("gated_delta_rule_decode", q, k, v, g, beta, state, q.shape[0])
    out, arguments, constexprs, v_blocks = _launch_arguments(
        "gated_delta_rule_decode", q, k, v, g, beta, state
    )
    if q.shape[0] > 0:
        _gated_delta_rule_decode_kernel[(q.shape[0], v.shape[1], v_blocks)](
            q, k, v, g, beta, out, state, *arguments, USE_QK_L2NORM=use_qk_l2norm, **constexprs
        )
    return out
