"""The gated delta rule: the linear attention of Qwen3-Next's Gated DeltaNet layers.

Per value head, a state ``S`` [K, V] runs over the tokens of a sequence; for token ``t``::

    S = exp(g_t) * S
    S = S + k_t^T (beta_t * (v_t - k_t S))      # the delta rule: write the part S mispredicts
    o_t = q_t S

with ``q_t`` and ``k_t`` L2-normalised (``use_qk_l2norm``, eps 1e-6 inside the root as HF and FLA
have it) and ``q_t`` scaled by ``1 / sqrt(K)``; all of it in fp32, as HF's
``torch_recurrent_gated_delta_rule`` and ``torch_chunk_gated_delta_rule`` compute it.
Shapes: ``q``, ``k`` [T, HK, K]; ``v`` [T, HV, V]; ``g`` (log decay, <= 0) and ``beta`` [T, HV];
value head ``h`` reads query/key head ``h // (HV // HK)``. ``state`` holds one [HV, K, V] state per
sequence: row ``i`` for sequence ``i`` ([N, HV, K, V]), or, with ``state_slots`` [N], row
``state_slots[i]`` of a host's state cache ([slots, HV, K, V] at any strides, e.g. the transposed view
of SGLang's [slots, HV, V, K]; any float dtype).
The ops read it (where ``has_initial_state`` says so, zeros otherwise) and overwrite it with the
final state. The output has ``q``'s dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.registry import define_op
from atom_kernels.triton_utils import (
    cdiv,
    check_last_dim_contiguous,
    check_same_device,
    check_shape,
    check_state_seqs,
    locate_block,
    next_pow2,
)

L2NORM_EPS = tl.constexpr(1e-6)
CHUNK_SIZE = 64
# Launch settings (bench_gated_delta.py sweeps them). The state pass pipelines its chunk loop in two
# stages: 479 / 729 us (one stage: 530 / 828) at 16 x 1024 / 2 x 8192 tokens on an H200, 16-bit
# dots (gated-delta-h200.json.gz[2026-12-02-0c65880-sweep]). The prepare kernel takes one chunk.
PREPARE_WARPS = 4
STATE_BLOCK_V = 64
STATE_WARPS = 4
STATE_STAGES = 2
# w and u between the launches in the activations' 16-bit type, as FLA keeps them: 2.02 against 2.20 ms
# in fp32 at 16 x 1024 tokens, level at 2 x 8192 (gated-delta-h200.json.gz[cf4c7d6]).
WU_16BIT = True
# The inverse's dots for 16-bit activations on NVIDIA GPUs: one TF32 pass, 0.99 ms a layer against 2.52
# for tf32x3, w / u within 3.3e-4 of IEEE's (tf32x3: 8.1e-5; gated-delta-h200.json.gz[fc29ad0]). fp32
# activations keep tf32x3.
INVERSE_PRECISION_NVIDIA = "tf32"
# Rows of the inverse's forward-substitution blocks: 4 and two merges (12 dots a chunk) or 16 and one
# (20). 4 took the prepare launch from 936-941 to 807-810 us, w / u as far from IEEE
# (gated-delta-h200.json.gz[2026-12-02-c7c648b-sweep], [2026-12-02-inverse-emulation]).
INVERSE_SUB = 4
# The state pass's dots on 16-bit operands (fp32 sums), as FLA has them, not TF32, where BLOCK_V >= 64
# (at 32 with K 128 sm90 gave wrong values): 529 / 822 us against 1191 / 1390 on an H200, about as
# close to the fp32 reference (gated-delta-h200.json.gz[2026-12-02-state-pass-forms]).
STATE_DOT_16BIT = True
# The prepare launch's dots likewise, where BLOCK_V >= 64: 768 -> 424 us (H200), w / u 5.8e-3 from
# IEEE's, TF32 3.0e-3 (the 0c65880 sweep).
PREPARE_DOT_16BIT = True


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
    state_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Prefill/extend over packed sequences (``cu_seqlens`` [N + 1]): -> o [T, HV, V]; sequence
    ``i``'s state (row ``i`` of ``state``, or row ``state_slots[i]``) is read where
    ``has_initial_state`` [N] and overwritten with the final state."""


@define_op
def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    use_qk_l2norm: bool = True,
    state_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode: one token per sequence (``q`` [N, HK, K], ...) -> o [N, HV, V]; one recurrent step
    of each sequence's state (row ``i`` of ``state``, or row ``state_slots[i]``), in place."""


def _check_args(op: str, q, k, v, g, beta, state: torch.Tensor, num_seqs: int,
                state_slots: torch.Tensor | None) -> None:
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
    state_rows = num_seqs if state_slots is None else state.shape[0]
    check_shape(op, "state", state, (state_rows, num_v_heads, head_k_dim, head_v_dim))
    if state_slots is not None:
        check_shape(op, "state_slots", state_slots, (num_seqs,))
        if state_slots.dtype.is_floating_point:
            raise ValueError(f"{op}: state_slots must hold integer row indices, got {state_slots.dtype}")
    check_same_device(q=q, k=k, v=v, g=g, beta=beta, state=state, state_slots=state_slots)


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


def _rows(state_slots: torch.Tensor | None, num_seqs: int) -> list[int]:
    """The state row of each sequence."""
    return list(range(num_seqs)) if state_slots is None else state_slots.tolist()


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
    state_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    num_seqs = check_state_seqs("gated_delta_rule", cu_seqlens, has_initial_state)
    _check_args("gated_delta_rule", q, k, v, g, beta, state, num_seqs, state_slots)
    out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    starts, initial = cu_seqlens.tolist(), has_initial_state.tolist()
    for seq, row in enumerate(_rows(state_slots, num_seqs)):
        tokens = slice(starts[seq], starts[seq + 1])
        start_state = state[row] if initial[seq] else torch.zeros_like(state[row])
        o, final_state = _recurrence(
            q[None, tokens], k[None, tokens], v[None, tokens], g[None, tokens], beta[None, tokens],
            start_state[None], use_qk_l2norm,
        )
        out[tokens] = o[0].to(q.dtype)
        state[row] = final_state[0].to(state.dtype)
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
    state_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    _check_args("gated_delta_rule_decode", q, k, v, g, beta, state, q.shape[0], state_slots)
    rows = torch.tensor(_rows(state_slots, q.shape[0]), dtype=torch.long, device=state.device)
    o, final_state = _recurrence(
        q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], state[rows], use_qk_l2norm
    )
    state[rows] = final_state.to(state.dtype)
    return o[:, 0].to(q.dtype)


@triton.jit
def _load_rows(ptr, rows, row_mask, stride_t, cols, col_mask):
    """[len(rows), BLOCK] rows as stored (masked entries 0)."""
    offs = rows.to(tl.int64)[:, None] * stride_t + cols[None, :]
    return tl.load(ptr + offs, mask=row_mask[:, None] & col_mask[None, :], other=0.0)


@triton.jit
def _inverse_norms(x, ROWS: tl.constexpr, USE_QK_L2NORM: tl.constexpr):
    """fp32 [ROWS]: each row's 1 / L2 norm when asked, else ones; the chunk kernels scale dot results
    by them, keeping q and k 16-bit (fewer registers)."""
    if USE_QK_L2NORM:
        return tl.rsqrt(tl.sum(x.to(tl.float32) * x.to(tl.float32), axis=1) + L2NORM_EPS)
    return tl.full([ROWS], 1.0, tl.float32)


@triton.jit
def _load_query_key(ptr, rows, row_mask, stride_t, cols, col_mask, USE_QK_L2NORM: tl.constexpr):
    """fp32 [1, BLOCK_K] row of q or k, L2-normalised when asked (masked entries 0)."""
    x = _load_rows(ptr, rows, row_mask, stride_t, cols, col_mask)
    return x.to(tl.float32) * _inverse_norms(x, 1, USE_QK_L2NORM)[:, None]


@triton.jit
def _state_pointers(state_ptr, slots_ptr, seq, head, state_stride_s, state_stride_h, state_stride_k,
                    state_stride_v, k_cols, v_cols, HAS_SLOTS: tl.constexpr):
    """[BLOCK_K, BLOCK_V] pointers into sequence ``seq``'s state: row ``seq`` of the state, or row
    ``slots[seq]``, at the state's strides (SGLang keeps each head's state as [V, K], vLLM as [K, V];
    Triton specializes a stride of 1, so the compiler sees which of the two is contiguous)."""
    if HAS_SLOTS:
        row = tl.load(slots_ptr + seq).to(tl.int64)
    else:
        row = seq.to(tl.int64)
    base = row * state_stride_s + head * state_stride_h
    return state_ptr + base + k_cols[:, None] * state_stride_k + v_cols[None, :] * state_stride_v


@triton.jit
def _columns(block, BLOCK: tl.constexpr, HEAD: tl.constexpr):
    """Column block ``block`` of BLOCK columns of a head of HEAD: the columns and which are in it."""
    cols = block * BLOCK + tl.arange(0, BLOCK)
    return cols, cols < HEAD


@triton.jit
def _chunk_rows(start, first, length, CHUNK: tl.constexpr):
    """A chunk of a sequence (rows ``start``.. of it ``length``) from its row ``first``: the rows
    within the chunk, which of them the sequence has, and their tokens."""
    rows = tl.arange(0, CHUNK)
    return rows, first + rows < length, start + first + rows


@triton.jit
def _chunk_decays(g_ptr, g_stride_t, tokens, row_mask, head):
    """Cumulative log decays G [CHUNK] within the chunk and their total G_last."""
    g = tl.load(g_ptr + tokens.to(tl.int64) * g_stride_t + head, mask=row_mask, other=0.0).to(tl.float32)
    return tl.cumsum(g, axis=0), tl.sum(g, axis=0)


@triton.jit
def _dot(a, b, PRECISION: tl.constexpr, OPERAND: tl.constexpr):
    """a b, summed in fp32, on operands cast to OPERAND (see *_DOT_16BIT)."""
    return tl.dot(a.to(OPERAND), b.to(OPERAND), input_precision=PRECISION)


@triton.jit
def _merge_blocks(T, A, rows, eye, INNER: tl.constexpr, OUTER: tl.constexpr, PRECISION: tl.constexpr):
    """(I + A)^-1 within blocks of OUTER = 4 INNER rows, from T, its inverse within INNER-row blocks:
    with L the part of A between the INNER blocks of an OUTER block, N = T L is strictly block-lower
    and so nilpotent (N^4 = 0), and (I + A)^-1 = (I + N)^-1 T = (I - N + N^2 - N^3) T."""
    tl.static_assert(OUTER == 4 * INNER, "N^4 = 0 needs OUTER = 4 INNER")
    inner = (rows // INNER)[:, None] == (rows // INNER)[None, :]
    outer = (rows // OUTER)[:, None] == (rows // OUTER)[None, :]
    N = tl.dot(T, tl.where(outer & ~inner, A, 0.0), input_precision=PRECISION)
    N2 = tl.dot(N, N, input_precision=PRECISION)
    return tl.dot(eye - N + N2 - tl.dot(N, N2, input_precision=PRECISION), T, input_precision=PRECISION)


@triton.jit
def _unit_lower_inverse(A, rows, CHUNK: tl.constexpr, SUB: tl.constexpr, PRECISION: tl.constexpr):
    """(I + A)^-1 of a strictly lower [CHUNK, CHUNK] A: forward substitution inverts its diagonal
    blocks of SUB rows (every block's r-th row per step, T_r = e_r - D_r T, one dot), then merges of
    four blocks (:func:`_merge_blocks`) up to CHUNK rows; see INVERSE_SUB."""
    tl.static_assert((SUB == 16) or (SUB == 4), "INVERSE_SUB must be 16 or 4")
    tl.static_assert(CHUNK == 64, "the merges end at 64 rows")
    D = tl.where((rows // SUB)[:, None] == (rows // SUB)[None, :], A, 0.0)
    eye = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    T = eye
    for i in range(SUB):
        step = (rows % SUB) == i
        T = tl.where(step[:, None], eye - tl.dot(tl.where(step[:, None], D, 0.0), T, input_precision=PRECISION), T)
    if SUB == 4:
        T = _merge_blocks(T, A, rows, eye, 4, 16, PRECISION)
    return _merge_blocks(T, A, rows, eye, 16, CHUNK, PRECISION)


@triton.jit(do_not_specialize=["num_seqs"],
            do_not_specialize_on_alignment=["cu_seqlens_ptr", "g_ptr", "beta_ptr"])
def _gated_delta_chunk_prepare_kernel(
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    w_ptr,
    u_ptr,
    cu_seqlens_ptr,
    num_seqs,
    group,
    k_stride_t, k_stride_h, v_stride_t, v_stride_h, g_stride_t, beta_stride_t,
    w_stride_t, w_stride_h, u_stride_t, u_stride_h,
    HEAD_K: tl.constexpr,
    HEAD_V: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    INVERSE_PRECISION: tl.constexpr,
    INVERSE_SUB: tl.constexpr,
    DOT_16BIT: tl.constexpr,
):
    """The state-free part of a chunk, for every chunk of every sequence at once (one program per
    chunk and value head): with cumulative log decays G over the chunk,
    A = strictly-lower(diag(beta) k k^T * exp(G_i - G_j)), T = (I + A)^-1 (the WY form of HF's
    chunked function), u = T (beta v) and w = T (beta exp(G) k), written per token for the state
    pass. Padded rows of a sequence's last chunk have k = v = beta = g = 0."""
    head = tl.program_id(1)
    key_head = head // group
    seq, start, length, first = locate_block(cu_seqlens_ptr, tl.program_id(0), num_seqs, CHUNK)
    if first < length:
        rows, row_mask, tokens = _chunk_rows(start, first, length, CHUNK)
        k_cols, k_mask = _columns(0, BLOCK_K, HEAD_K)
        v_cols, v_mask = _columns(0, BLOCK_V, HEAD_V)
        k = _load_rows(k_ptr + key_head * k_stride_h, tokens, row_mask, k_stride_t, k_cols, k_mask)
        k_norm = _inverse_norms(k, CHUNK, USE_QK_L2NORM)
        beta = tl.load(beta_ptr + tokens.to(tl.int64) * beta_stride_t + head, mask=row_mask,
                       other=0.0).to(tl.float32)
        G, _ = _chunk_decays(g_ptr, g_stride_t, tokens, row_mask, head)
        strictly_lower = rows[:, None] > rows[None, :]
        # exp of masked (i <= j) differences could overflow: mask before exp.
        decay = tl.exp(tl.where(strictly_lower, G[:, None] - G[None, :], float("-inf")))
        operand: tl.constexpr = k_ptr.dtype.element_ty if DOT_16BIT else tl.float32
        kk = _dot(k, tl.trans(k), INVERSE_PRECISION, operand) * (k_norm[:, None] * k_norm[None, :])
        A = tl.where(strictly_lower, kk * decay * beta[:, None], 0.0)
        T = _unit_lower_inverse(A, rows, CHUNK, INVERSE_SUB, INVERSE_PRECISION)
        # u = T (beta v), w = T (beta exp(G) k / |k|), with the row factors on T's columns.
        v = _load_rows(v_ptr + head * v_stride_h, tokens, row_mask, v_stride_t, v_cols, v_mask)
        u = _dot(T * beta[None, :], v, DOT_PRECISION, operand)
        w = _dot(T * (beta * tl.exp(G) * k_norm)[None, :], k, DOT_PRECISION, operand)
        u_offs = tokens.to(tl.int64)[:, None] * u_stride_t + head * u_stride_h + v_cols[None, :]
        tl.store(u_ptr + u_offs, u.to(u_ptr.dtype.element_ty), mask=row_mask[:, None] & v_mask[None, :])
        w_offs = tokens.to(tl.int64)[:, None] * w_stride_t + head * w_stride_h + k_cols[None, :]
        tl.store(w_ptr + w_offs, w.to(w_ptr.dtype.element_ty), mask=row_mask[:, None] & k_mask[None, :])


@triton.jit
def _chunk_output(q, q_norm, k, k_norm, G, S, v_new, CHUNK: tl.constexpr, DOT_PRECISION: tl.constexpr,
                  OPERAND: tl.constexpr):
    """o = (exp(G) q) S + lower(q k^T * exp(G_i - G_j)) v' of a chunk, q and k times row factors."""
    causal = tl.arange(0, CHUNK)[:, None] >= tl.arange(0, CHUNK)[None, :]
    decay = tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf")))
    qk = _dot(q, tl.trans(k), DOT_PRECISION, OPERAND) * (q_norm[:, None] * k_norm[None, :])
    qk = tl.where(causal, qk * decay, 0.0)
    o = _dot(q, S, DOT_PRECISION, OPERAND) * (q_norm * tl.exp(G))[:, None]
    return o + _dot(qk, v_new, DOT_PRECISION, OPERAND)


@triton.jit(do_not_specialize_on_alignment=["slots_ptr", "cu_seqlens_ptr", "has_initial_state_ptr", "g_ptr"])
def _gated_delta_chunk_state_kernel(
    q_ptr,
    k_ptr,
    g_ptr,
    w_ptr,
    u_ptr,
    out_ptr,
    state_ptr,
    slots_ptr,
    cu_seqlens_ptr,
    has_initial_state_ptr,
    group,
    q_stride_t, q_stride_h, k_stride_t, k_stride_h, g_stride_t, w_stride_t, w_stride_h, u_stride_t,
    u_stride_h, out_stride_t, state_stride_s, state_stride_h, state_stride_k, state_stride_v, scale,
    HEAD_K: tl.constexpr,
    HEAD_V: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_16BIT: tl.constexpr,
):
    """The state pass: one program per (sequence, value head, block of value columns) walks its
    chunks in order, carrying its slice of S [K, BLOCK_V] (the columns of S are independent):
    v' = u - w S, o = (exp(G) q) S + lower(q k^T * exp(G_i - G_j)) v',
    S = exp(G_last) S + (exp(G_last - G) k)^T v'."""
    operand: tl.constexpr = q_ptr.dtype.element_ty if DOT_16BIT else tl.float32
    seq = tl.program_id(0)
    head = tl.program_id(1)
    key_head = head // group
    start = tl.load(cu_seqlens_ptr + seq)
    length = tl.load(cu_seqlens_ptr + seq + 1) - start
    k_cols, k_mask = _columns(0, BLOCK_K, HEAD_K)
    v_cols, v_mask = _columns(tl.program_id(2), BLOCK_V, HEAD_V)
    state_ptrs = _state_pointers(state_ptr, slots_ptr, seq, head, state_stride_s, state_stride_h, state_stride_k,
                                 state_stride_v, k_cols, v_cols, HAS_SLOTS)
    state_mask = k_mask[:, None] & v_mask[None, :]
    has_initial = tl.load(has_initial_state_ptr + seq) != 0
    S = tl.load(state_ptrs, mask=state_mask & has_initial, other=0.0).to(tl.float32)

    for chunk_start in range(0, length, CHUNK):
        _, row_mask, tokens = _chunk_rows(start, chunk_start, length, CHUNK)
        G, G_last = _chunk_decays(g_ptr, g_stride_t, tokens, row_mask, head)
        w = _load_rows(w_ptr + head * w_stride_h, tokens, row_mask, w_stride_t, k_cols, k_mask)
        u = _load_rows(u_ptr + head * u_stride_h, tokens, row_mask, u_stride_t, v_cols, v_mask)
        v_new = u.to(tl.float32) - _dot(w, S, DOT_PRECISION, operand)
        k = _load_rows(k_ptr + key_head * k_stride_h, tokens, row_mask, k_stride_t, k_cols, k_mask)
        q = _load_rows(q_ptr + key_head * q_stride_h, tokens, row_mask, q_stride_t, k_cols, k_mask)
        k_norm = _inverse_norms(k, CHUNK, USE_QK_L2NORM)
        q_norm = _inverse_norms(q, CHUNK, USE_QK_L2NORM) * scale
        o = _chunk_output(q, q_norm, k, k_norm, G, S, v_new, CHUNK, DOT_PRECISION, operand)
        out_offs = tokens.to(tl.int64)[:, None] * out_stride_t + head * HEAD_V + v_cols[None, :]
        tl.store(out_ptr + out_offs, o.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & v_mask[None, :])
        v_to_end = v_new * (k_norm * tl.exp(G_last - G))[:, None]
        S = S * tl.exp(G_last) + _dot(tl.trans(k), v_to_end, DOT_PRECISION, operand)
    tl.store(state_ptrs, S.to(state_ptr.dtype.element_ty), mask=state_mask)


@triton.jit(do_not_specialize_on_alignment=["slots_ptr", "g_ptr", "beta_ptr"])
def _gated_delta_rule_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    out_ptr,
    state_ptr,
    slots_ptr,
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
    state_stride_s,
    state_stride_h,
    state_stride_k,
    state_stride_v,
    scale,
    HEAD_K: tl.constexpr,
    HEAD_V: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    HAS_SLOTS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """One recurrent step per (sequence, value head, block of value columns)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    key_head = head // group
    k_cols, k_mask = _columns(0, BLOCK_K, HEAD_K)
    v_cols, v_mask = _columns(tl.program_id(2), BLOCK_V, HEAD_V)
    state_ptrs = _state_pointers(state_ptr, slots_ptr, seq, head, state_stride_s, state_stride_h, state_stride_k,
                                 state_stride_v, k_cols, v_cols, HAS_SLOTS)
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


def _check_layout(op: str, q, k, v, g, beta) -> None:
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        check_last_dim_contiguous(f"{op} {name}", t)


def _block_sizes(head_k_dim: int, head_v_dim: int) -> tuple[int, int]:
    """(BLOCK_K, BLOCK_V): all of K (at least tl.dot's smallest tile), V in blocks of up to
    STATE_BLOCK_V."""
    return max(next_pow2(head_k_dim), 16), min(max(next_pow2(head_v_dim), 16), STATE_BLOCK_V)


def _inverse_precision(k: torch.Tensor) -> str:
    """Dots for the chunk's inverse, whose rounding reaches every token of the chunk. On NVIDIA tensor
    cores: INVERSE_PRECISION_NVIDIA for 16-bit activations, three TF32 passes (about fp32) for fp32
    ones; IEEE fp32 elsewhere."""
    if not k.is_cuda or torch.version.hip is not None:
        return "ieee"
    return "tf32x3" if k.dtype == torch.float32 else INVERSE_PRECISION_NVIDIA


def _dot_precision(q: torch.Tensor) -> str:
    """TF32 tensor cores for 16-bit activations on GPUs, where their own rounding dominates TF32's;
    IEEE fp32 for fp32 activations (and in the interpreter, which ignores it)."""
    return "tf32" if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) else "ieee"


def prepare_chunks(k, v, g, beta, cu_seqlens, use_qk_l2norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked form's first launch: w [T, HV, K] and u [T, HV, V] of every chunk (fp32, or k's
    16-bit type with WU_16BIT)."""
    num_tokens, num_k_heads, head_k_dim = k.shape
    num_v_heads, head_v_dim = v.shape[1:]
    num_seqs = cu_seqlens.shape[0] - 1
    wu_dtype = k.dtype if WU_16BIT and k.dtype in (torch.bfloat16, torch.float16) else torch.float32
    w = torch.empty(num_tokens, num_v_heads, head_k_dim, dtype=wu_dtype, device=k.device)
    u = torch.empty(num_tokens, num_v_heads, head_v_dim, dtype=wu_dtype, device=k.device)
    block_v = max(next_pow2(head_v_dim), 16)
    _gated_delta_chunk_prepare_kernel[(num_tokens // CHUNK_SIZE + num_seqs, num_v_heads)](
        k, v, g, beta, w, u, cu_seqlens, num_seqs, num_v_heads // num_k_heads, *k.stride()[:2],
        *v.stride()[:2], g.stride(0), beta.stride(0), *w.stride()[:2], *u.stride()[:2],
        HEAD_K=head_k_dim, HEAD_V=head_v_dim, USE_QK_L2NORM=use_qk_l2norm, CHUNK=CHUNK_SIZE,
        BLOCK_K=_block_sizes(head_k_dim, head_v_dim)[0], BLOCK_V=block_v,
        DOT_PRECISION=_dot_precision(k), INVERSE_PRECISION=_inverse_precision(k),
        INVERSE_SUB=INVERSE_SUB, DOT_16BIT=PREPARE_DOT_16BIT and block_v >= 64,
        num_warps=PREPARE_WARPS, num_stages=1,
    )
    return w, u


def state_pass(q, k, g, w, u, cu_seqlens, state, has_initial_state, use_qk_l2norm: bool,
               state_slots: torch.Tensor | None) -> torch.Tensor:
    """The chunked form's state pass: the output, each sequence's state carried chunk by chunk."""
    num_k_heads, head_k_dim = q.shape[1:]
    num_v_heads, head_v_dim = u.shape[1:]
    num_seqs = cu_seqlens.shape[0] - 1
    out = torch.empty(u.shape, dtype=q.dtype, device=q.device)
    block_k, block_v = _block_sizes(head_k_dim, head_v_dim)
    _gated_delta_chunk_state_kernel[(num_seqs, num_v_heads, cdiv(head_v_dim, block_v))](
        q, k, g, w, u, out, state, state_slots, cu_seqlens, has_initial_state, num_v_heads // num_k_heads,
        *q.stride()[:2], *k.stride()[:2], g.stride(0), *w.stride()[:2], *u.stride()[:2],
        out.stride(0), *state.stride(), head_k_dim**-0.5, HEAD_K=head_k_dim, HEAD_V=head_v_dim,
        USE_QK_L2NORM=use_qk_l2norm, HAS_SLOTS=state_slots is not None, CHUNK=CHUNK_SIZE, BLOCK_K=block_k,
        BLOCK_V=block_v, DOT_PRECISION=_dot_precision(q), DOT_16BIT=STATE_DOT_16BIT and block_v >= 64,
        num_warps=STATE_WARPS, num_stages=STATE_STAGES,
    )
    return out


@gated_delta_rule.register("triton")
def gated_delta_rule_triton(q, k, v, g, beta, cu_seqlens, state: torch.Tensor, has_initial_state: torch.Tensor,
                            use_qk_l2norm: bool = True, state_slots: torch.Tensor | None = None) -> torch.Tensor:
    """The chunked form, CHUNK_SIZE tokens a chunk, in two launches: every chunk's state-free part at
    once (:func:`prepare_chunks`), then :func:`state_pass`, one program per (sequence, head, block of
    value columns) walking its chunks in order."""
    num_seqs = check_state_seqs("gated_delta_rule", cu_seqlens, has_initial_state)
    _check_args("gated_delta_rule", q, k, v, g, beta, state, num_seqs, state_slots)
    check_same_device(q=q, cu_seqlens=cu_seqlens, has_initial_state=has_initial_state)
    _check_layout("gated_delta_rule", q, k, v, g, beta)
    if num_seqs == 0 or q.shape[0] == 0:
        return torch.empty(v.shape, dtype=q.dtype, device=q.device)
    w, u = prepare_chunks(k, v, g, beta, cu_seqlens, use_qk_l2norm)
    return state_pass(q, k, g, w, u, cu_seqlens, state, has_initial_state, use_qk_l2norm, state_slots)


@gated_delta_rule_decode.register("triton")
def gated_delta_rule_decode_triton(q, k, v, g, beta, state: torch.Tensor, use_qk_l2norm: bool = True,
                                   state_slots: torch.Tensor | None = None) -> torch.Tensor:
    _check_args("gated_delta_rule_decode", q, k, v, g, beta, state, q.shape[0], state_slots)
    _check_layout("gated_delta_rule_decode", q, k, v, g, beta)
    num_k_heads, head_k_dim = q.shape[1:]
    num_v_heads, head_v_dim = v.shape[1:]
    out = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    block_k, block_v = _block_sizes(head_k_dim, head_v_dim)
    if q.shape[0] > 0:
        _gated_delta_rule_decode_kernel[(q.shape[0], num_v_heads, cdiv(head_v_dim, block_v))](
            q, k, v, g, beta, out, state, state_slots, num_v_heads // num_k_heads,
            *q.stride()[:2], *k.stride()[:2], *v.stride()[:2], g.stride(0), beta.stride(0),
            out.stride(0), *state.stride(), head_k_dim**-0.5,
            HEAD_K=head_k_dim, HEAD_V=head_v_dim, USE_QK_L2NORM=use_qk_l2norm,
            HAS_SLOTS=state_slots is not None, BLOCK_K=block_k, BLOCK_V=block_v,
        )
    return out
