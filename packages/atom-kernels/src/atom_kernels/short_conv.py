"""Depthwise causal short convolution with a carried state (the conv of Qwen3-Next's Gated DeltaNet).

Channel ``c`` of token ``t`` is ``act(bias[c] + sum_j weight[c, j] * input[t - (W - 1) + j, c])``
for a kernel of width ``W``: ``nn.Conv1d(groups=channels, padding=W - 1)`` cut to the sequence, as
HF's ``causal_conv1d_fn`` / ``causal_conv1d_update`` compute it. Inputs before a sequence's first
token come from its ``conv_state`` [channels, W - 1] (oldest first) where ``has_initial_state`` is
set, zeros otherwise: row ``i`` of ``conv_state`` [num_seqs, channels, W - 1] for sequence ``i``,
or, with ``state_slots`` [num_seqs], row ``state_slots[i]`` of a host's state cache (rows at any
stride); afterwards the state holds the sequence's last ``W - 1`` inputs (older state entries where
the sequence is shorter). Tokens are rows (``x`` [num_tokens, channels], the layout the input
projection writes); ``weight`` is [channels, W] (``conv1d.weight.squeeze(1)``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
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

ACTIVATIONS = (None, "silu")


@define_op
def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
    state_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Prefill/extend: ``x`` [T, C] packed sequences (``cu_seqlens`` [N + 1]) -> [T, C]; reads and
    updates each sequence's conv state in place (``has_initial_state`` [N] bool)."""


@define_op
def causal_conv1d_decode(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    activation: str | None = "silu",
    state_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode: one token per sequence, ``x`` [N, C] -> [N, C]; shifts it into each sequence's conv
    state in place."""


def _check_args(
    op: str,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    num_seqs: int,
    activation: str | None,
    state_slots: torch.Tensor | None,
) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation {activation!r} is not one of {ACTIVATIONS}")
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(
            f"{op}: x must be [num_tokens, channels] and weight [channels, kernel_size], got x "
            f"{tuple(x.shape)} and weight {tuple(weight.shape)}"
        )
    channels, kernel_size = weight.shape
    if kernel_size < 2:
        raise ValueError(f"{op}: weight kernel_size {kernel_size} < 2 leaves no state to carry")
    check_shape(op, "x", x, (x.shape[0], channels))
    state_rows = num_seqs if state_slots is None else conv_state.shape[0]
    check_shape(op, "conv_state", conv_state, (state_rows, channels, kernel_size - 1))
    if state_slots is not None:
        check_shape(op, "state_slots", state_slots, (num_seqs,))
        if state_slots.dtype.is_floating_point:
            raise ValueError(f"{op}: state_slots must hold integer row indices, got {state_slots.dtype}")
    if bias is not None:
        check_shape(op, "bias", bias, (channels,))
    check_same_device(x=x, weight=weight, bias=bias, conv_state=conv_state, state_slots=state_slots)


def _conv_sequences(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    starts: list[int],
    conv_state: torch.Tensor,
    initial: list[bool],
    activation: str | None,
    state_slots: torch.Tensor | None,
) -> torch.Tensor:
    """The reference: each sequence's inputs after its history, through ``F.conv1d`` in fp32."""
    channels, kernel_size = weight.shape
    out = torch.empty_like(x)
    rows = range(len(initial)) if state_slots is None else state_slots.tolist()
    for seq, row in enumerate(rows):
        tokens = slice(starts[seq], starts[seq + 1])
        history = (
            conv_state[row].float()
            if initial[seq]
            else conv_state.new_zeros(channels, kernel_size - 1, dtype=torch.float32)
        )
        inputs = torch.cat([history, x[tokens].float().T], dim=1)
        y = F.conv1d(inputs[None], weight.float()[:, None, :], groups=channels)[0].T
        if bias is not None:
            y = y + bias.float()
        if activation == "silu":
            y = F.silu(y)
        out[tokens] = y.to(x.dtype)
        conv_state[row] = inputs[:, -(kernel_size - 1) :].to(conv_state.dtype)
    return out


@causal_conv1d.register("torch")
def causal_conv1d_torch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
    state_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    num_seqs = check_state_seqs("causal_conv1d", cu_seqlens, has_initial_state)
    _check_args("causal_conv1d", x, weight, bias, conv_state, num_seqs, activation, state_slots)
    return _conv_sequences(
        x, weight, bias, cu_seqlens.tolist(), conv_state, has_initial_state.tolist(), activation,
        state_slots,
    )


@causal_conv1d_decode.register("torch")
def causal_conv1d_decode_torch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    activation: str | None = "silu",
    state_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    num_seqs = x.shape[0]
    _check_args("causal_conv1d_decode", x, weight, bias, conv_state, num_seqs, activation, state_slots)
    return _conv_sequences(
        x, weight, bias, list(range(num_seqs + 1)), conv_state, [True] * num_seqs, activation,
        state_slots,
    )


@triton.jit
def _load_inputs(
    x_ptr,
    x_stride_t,
    state_ptrs,
    state_stride_w,
    start,
    pos,
    pos_mask,
    cols,
    col_mask,
    has_initial,
    HISTORY: tl.constexpr,
):
    """fp32 [len(pos), BLOCK_C] inputs of one sequence at positions ``pos`` relative to its first
    token: ``x`` from position 0 on, the state (or zeros) at -HISTORY..-1."""
    in_x = (pos >= 0) & pos_mask
    x_offs = (start + pos).to(tl.int64)[:, None] * x_stride_t + cols[None, :]
    from_x = tl.load(x_ptr + x_offs, mask=in_x[:, None] & col_mask[None, :], other=0.0)
    in_state = (pos < 0) & pos_mask & has_initial
    state_offs = ((HISTORY + pos) * state_stride_w)[:, None]
    from_state = tl.load(
        state_ptrs[None, :] + state_offs, mask=in_state[:, None] & col_mask[None, :], other=0.0
    )
    return from_x.to(tl.float32) + from_state.to(tl.float32)


@triton.jit
def _store_tail(x_ptr, state_ptr, state_ptrs, x_stride_t, state_stride_w, start, length, has_initial, cols,
                col_mask, KERNEL_SIZE: tl.constexpr, BLOCK_W: tl.constexpr):
    """The sequence's last KERNEL_SIZE - 1 inputs (older state entries where it is shorter) into its
    state, in channels ``cols``."""
    HISTORY: tl.constexpr = KERNEL_SIZE - 1
    slots = tl.arange(0, BLOCK_W)
    slot_mask = slots < HISTORY
    tail = _load_inputs(
        x_ptr, x_stride_t, state_ptrs, state_stride_w, start, length - HISTORY + slots,
        slot_mask, cols, col_mask, has_initial, HISTORY,
    )
    tl.store(
        state_ptrs[None, :] + (slots * state_stride_w)[:, None],
        tail.to(state_ptr.dtype.element_ty),
        mask=slot_mask[:, None] & col_mask[None, :],
    )


@triton.jit
def _state_row_pointers(state_ptr, slots_ptr, seq, cols, state_stride_s, state_stride_c,
                        HAS_SLOTS: tl.constexpr):
    """Pointers to sequence ``seq``'s state [cols] at its oldest entry: row ``seq``, or ``slots[seq]``."""
    if HAS_SLOTS:
        row = tl.load(slots_ptr + seq).to(tl.int64)
    else:
        row = seq.to(tl.int64)
    return state_ptr + row * state_stride_s + cols * state_stride_c


@triton.jit
def _input_row(x_ptr, x_stride_t, state_ptrs, state_stride_w, start, pos, cols, col_mask, has_initial,
               HISTORY: tl.constexpr):
    """fp32 [BLOCK_C] input of one sequence at the one position ``pos`` (:func:`_load_inputs`)."""
    one = tl.arange(0, 1)
    return tl.sum(_load_inputs(x_ptr, x_stride_t, state_ptrs, state_stride_w, start, pos + one, one == 0, cols,
                               col_mask, has_initial, HISTORY), axis=0)


@triton.jit
def _bias_row(bias_ptr, cols, col_mask, HAS_BIAS: tl.constexpr, BLOCK_C: tl.constexpr):
    if HAS_BIAS:
        return tl.load(bias_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    return tl.zeros([BLOCK_C], dtype=tl.float32)


@triton.jit(do_not_specialize=["num_seqs"],
            do_not_specialize_on_alignment=["slots_ptr", "cu_seqlens_ptr", "has_initial_state_ptr"])
def _causal_conv1d_prefill_kernel(
    x_ptr, weight_ptr, bias_ptr, out_ptr, state_ptr, slots_ptr, cu_seqlens_ptr, has_initial_state_ptr,
    num_seqs, channels, x_stride_t, out_stride_t, weight_stride_c, state_stride_s, state_stride_c,
    state_stride_w, KERNEL_SIZE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SLOTS: tl.constexpr,
    SILU: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr, UNROLL: tl.constexpr,
):
    """Outputs only, one program per (block of BLOCK_T tokens of a sequence, channel block): every
    block at once, each walking its tokens one row at a time with the last inputs (up to three: kernel
    widths 2-4) carried in registers, so every input is read from memory once. The states are written
    afterwards (:func:`_conv_state_kernel`), so that no block reads a state another block has already
    overwritten."""
    HISTORY: tl.constexpr = KERNEL_SIZE - 1
    tl.static_assert(HISTORY <= 3, "the prefill kernel carries at most three inputs (kernel widths 2-4)")
    seq, start, length, first = locate_block(cu_seqlens_ptr, tl.program_id(0), num_seqs, BLOCK_T)
    if first < length:
        cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        col_mask = cols < channels
        has_initial = tl.load(has_initial_state_ptr + seq) != 0
        state_ptrs = _state_row_pointers(state_ptr, slots_ptr, seq, cols, state_stride_s, state_stride_c,
                                         HAS_SLOTS)
        weights = weight_ptr + cols * weight_stride_c
        w_last = tl.load(weights + HISTORY, mask=col_mask, other=0.0).to(tl.float32)
        # Inputs 1, 2 and 3 rows back (zeros past the kernel's width) and their weights.
        h1 = _input_row(x_ptr, x_stride_t, state_ptrs, state_stride_w, start, first - 1, cols, col_mask,
                        has_initial, HISTORY)
        w1 = tl.load(weights + HISTORY - 1, mask=col_mask, other=0.0).to(tl.float32)
        h2 = tl.zeros([BLOCK_C], dtype=tl.float32)
        h3 = tl.zeros([BLOCK_C], dtype=tl.float32)
        if KERNEL_SIZE >= 3:
            h2 = _input_row(x_ptr, x_stride_t, state_ptrs, state_stride_w, start, first - 2, cols, col_mask,
                            has_initial, HISTORY)
            w2 = tl.load(weights + HISTORY - 2, mask=col_mask, other=0.0).to(tl.float32)
        if KERNEL_SIZE >= 4:
            h3 = _input_row(x_ptr, x_stride_t, state_ptrs, state_stride_w, start, first - 3, cols, col_mask,
                            has_initial, HISTORY)
            w3 = tl.load(weights, mask=col_mask, other=0.0).to(tl.float32)
        bias = _bias_row(bias_ptr, cols, col_mask, HAS_BIAS, BLOCK_C)
        x_row = x_ptr + (start + first).to(tl.int64) * x_stride_t + cols
        out_row = out_ptr + (start + first).to(tl.int64) * out_stride_t + cols
        for _ in tl.range(0, tl.minimum(BLOCK_T, length - first), loop_unroll_factor=UNROLL):
            current = tl.load(x_row, mask=col_mask, other=0.0).to(tl.float32)
            # Oldest tap first, as the decode kernel sums them; only the kernel's taps (0 * inf is NaN).
            y = bias
            if KERNEL_SIZE >= 4:
                y += h3 * w3
            if KERNEL_SIZE >= 3:
                y += h2 * w2
            y += h1 * w1 + current * w_last
            if SILU:
                y = y * tl.sigmoid(y)
            tl.store(out_row, y.to(out_ptr.dtype.element_ty), mask=col_mask)
            x_row += x_stride_t
            out_row += out_stride_t
            h3 = h2
            h2 = h1
            h1 = current


@triton.jit(do_not_specialize_on_alignment=["slots_ptr", "cu_seqlens_ptr", "has_initial_state_ptr"])
def _conv_state_kernel(
    x_ptr, state_ptr, slots_ptr, cu_seqlens_ptr, has_initial_state_ptr, channels, x_stride_t,
    state_stride_s, state_stride_c, state_stride_w, KERNEL_SIZE: tl.constexpr, HAS_SLOTS: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr,
):
    """Each sequence's new state, one program per (sequence, channel block)."""
    seq = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < channels
    start = tl.load(cu_seqlens_ptr + seq)
    length = tl.load(cu_seqlens_ptr + seq + 1) - start
    has_initial = tl.load(has_initial_state_ptr + seq) != 0
    state_ptrs = _state_row_pointers(state_ptr, slots_ptr, seq, cols, state_stride_s, state_stride_c, HAS_SLOTS)
    _store_tail(x_ptr, state_ptr, state_ptrs, x_stride_t, state_stride_w, start, length, has_initial, cols,
                col_mask, KERNEL_SIZE, BLOCK_W)


@triton.jit(do_not_specialize_on_alignment=["slots_ptr"])
def _causal_conv1d_decode_kernel(
    x_ptr, weight_ptr, bias_ptr, out_ptr, state_ptr, slots_ptr, channels, x_stride_t, out_stride_t,
    weight_stride_c, state_stride_s, state_stride_c, state_stride_w, KERNEL_SIZE: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_SLOTS: tl.constexpr, SILU: tl.constexpr, BLOCK_C: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    """One token per sequence (token ``s`` is sequence ``s``), one program per (sequence, channel
    block): its output from the old state, then the state shifted by the token."""
    seq = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = cols < channels
    state_ptrs = _state_row_pointers(state_ptr, slots_ptr, seq, cols, state_stride_s, state_stride_c, HAS_SLOTS)
    acc = _bias_row(bias_ptr, cols, col_mask, HAS_BIAS, BLOCK_C)
    for j in tl.static_range(KERNEL_SIZE):
        tap = _input_row(x_ptr, x_stride_t, state_ptrs, state_stride_w, seq, j - (KERNEL_SIZE - 1), cols, col_mask,
                         True, KERNEL_SIZE - 1)
        acc += tap * tl.load(weight_ptr + cols * weight_stride_c + j, mask=col_mask, other=0.0).to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + seq.to(tl.int64) * out_stride_t + cols, acc.to(out_ptr.dtype.element_ty), mask=col_mask)
    _store_tail(x_ptr, state_ptr, state_ptrs, x_stride_t, state_stride_w, seq, 1, True, cols, col_mask,
                KERNEL_SIZE, BLOCK_W)


# The prefill launch's tiles: tokens and channels per program, its warps and loop unrolling
# (benchmarks/kernels/bench_gated_delta.py sweeps them). Walking rows with the inputs carried in
# registers, on the H200 per Qwen3-Next layer of 16k tokens (2026-12-02, 1024 channels): the output
# kernel 213-222 us at 64-256 tokens per program, the whole op 223-227 us at 128, 2.1-2.3x less than
# with the 32 x 128 tiles reading each input once per tap (464-528 us; a copy of the input: 137 us;
# benchmarks/results/gated-delta-h200.json.gz[2026-12-02-conv-rows]). In the sweep (20 settings) 512
# channels on 4 warps took 205-206 us against 233 at 1024 (256 tokens a program 203-204;
# [2026-12-02-c7c648b-sweep]).
PREFILL_BLOCK_T = 128
PREFILL_BLOCK_C = 512
PREFILL_WARPS = 4
PREFILL_UNROLL = 8
# Inputs the prefill kernel carries in registers: kernel widths up to 4 (Qwen3-Next's and Qwen3.5's);
# wider kernels run the torch reference.
PREFILL_MAX_WIDTH = 4


def _launch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    conv_state: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    activation: str | None,
    state_slots: torch.Tensor | None,
) -> torch.Tensor:
    """Both ops' launches; ``cu_seqlens is None`` is decode (token ``s`` is sequence ``s``)."""
    check_last_dim_contiguous("causal_conv1d x", x)
    check_last_dim_contiguous("causal_conv1d weight", weight)
    channels, kernel_size = weight.shape
    num_seqs = x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    out = torch.empty_like(x)
    if num_seqs == 0 or x.shape[0] == 0:
        return out
    block_c = min(next_pow2(channels), 128)
    channel_blocks = cdiv(channels, block_c)
    common = dict(KERNEL_SIZE=kernel_size, HAS_SLOTS=state_slots is not None)
    block_w = next_pow2(kernel_size - 1)
    if cu_seqlens is None:
        _causal_conv1d_decode_kernel[(num_seqs, channel_blocks)](
            x, weight, bias, out, conv_state, state_slots, channels, x.stride(0), out.stride(0), weight.stride(0),
            *conv_state.stride(), HAS_BIAS=bias is not None, SILU=activation == "silu", BLOCK_C=block_c,
            BLOCK_W=block_w, **common,
        )
        return out
    prefill_block_c = min(next_pow2(channels), PREFILL_BLOCK_C)
    _causal_conv1d_prefill_kernel[(x.shape[0] // PREFILL_BLOCK_T + num_seqs, cdiv(channels, prefill_block_c))](
        x, weight, bias, out, conv_state, state_slots, cu_seqlens, has_initial_state, num_seqs, channels,
        x.stride(0), out.stride(0), weight.stride(0), *conv_state.stride(), HAS_BIAS=bias is not None,
        SILU=activation == "silu", BLOCK_T=PREFILL_BLOCK_T, BLOCK_C=prefill_block_c, UNROLL=PREFILL_UNROLL,
        num_warps=PREFILL_WARPS,
        **common,
    )
    _conv_state_kernel[(num_seqs, channel_blocks)](
        x, conv_state, state_slots, cu_seqlens, has_initial_state, channels, x.stride(0), *conv_state.stride(),
        BLOCK_C=block_c, BLOCK_W=block_w, **common,
    )
    return out


@causal_conv1d.register("triton")
def causal_conv1d_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    cu_seqlens: torch.Tensor,
    conv_state: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
    state_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    num_seqs = check_state_seqs("causal_conv1d", cu_seqlens, has_initial_state)
    _check_args("causal_conv1d", x, weight, bias, conv_state, num_seqs, activation, state_slots)
    check_same_device(x=x, cu_seqlens=cu_seqlens, has_initial_state=has_initial_state)
    if weight.shape[1] > PREFILL_MAX_WIDTH:
        return causal_conv1d_torch(x, weight, bias, cu_seqlens, conv_state, has_initial_state, activation,
                                   state_slots)
    return _launch(x, weight, bias, cu_seqlens, conv_state, has_initial_state, activation, state_slots)


@causal_conv1d_decode.register("triton")
def causal_conv1d_decode_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_state: torch.Tensor,
    activation: str | None = "silu",
    state_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    _check_args("causal_conv1d_decode", x, weight, bias, conv_state, x.shape[0], activation, state_slots)
    return _launch(x, weight, bias, None, conv_state, None, activation, state_slots)
