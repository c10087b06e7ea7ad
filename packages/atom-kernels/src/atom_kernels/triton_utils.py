"""Helpers shared by the Triton launchers of every op module.

On a machine without a GPU the Triton kernels run through Triton's interpreter; ``TRITON_INTERPRET=1``
must be set before this package is imported, because ``@triton.jit`` picks the interpreter when it
decorates a kernel. :func:`interpreting` says whether that happened.

Kernels mark their per-batch counts (rows, tokens, sequences; also the block-table width, which
depends on the configured context length) ``do_not_specialize``: Triton would otherwise compile a
new variant the first time a count is 1 or a multiple of 16, in the middle of serving, where a
compile stalls the engine for a second or more.
Pointers to batch metadata (sequence lengths, block tables) are likewise
``do_not_specialize_on_alignment`` where callers may pass slices at arbitrary offsets.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import torch
import triton
import triton.language as tl

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def interpreting() -> bool:
    """Whether the kernels of this process were built for Triton's CPU interpreter."""
    return INTERPRETING


def _patch_interpreter() -> None:
    """Make Triton 3.6.0's interpreter agree with the GPU on two points the kernels rely on.

    * Its ``create_dot`` multiplies bfloat16 operands as the uint16 words it stores them in, so a bf16
      ``tl.dot`` returns garbage (fp32, fp16 and fp8 are fine): widen bf16 operands to fp32 first.
    * Its float down-conversion truncates (fp32 -> bf16) or rounds half-up without carrying into the
      exponent (-> fp8, up to 50% off for ~2% of values), where the GPU rounds to nearest even:
      convert through torch, which rounds to nearest even, for the float types torch has.

    Delete once the interpreter does both itself (checked against 3.6.0).
    """
    from triton.runtime import interpreter

    if getattr(interpreter, "atom_kernels_patched", False):
        return
    torch_types = {
        tl.float32: torch.float32,
        tl.float16: torch.float16,
        tl.bfloat16: torch.bfloat16,
        tl.float8e4nv: torch.float8_e4m3fn,
        tl.float8e5: torch.float8_e5m2,
    }
    convert_float = interpreter._convert_float

    def rounded_convert_float(data, input_dtype, output_dtype, rounding_mode):
        src, dst = torch_types.get(input_dtype), torch_types.get(output_dtype)
        if (
            src is None
            or dst is None
            or rounding_mode not in (None, interpreter._ir.ROUNDING_MODE.RTNE)
        ):
            return convert_float(data, input_dtype, output_dtype, rounding_mode)
        words = torch.from_numpy(np.ascontiguousarray(data)).view(src).to(dst)
        return words.view(getattr(torch, f"uint{output_dtype.primitive_bitwidth}")).numpy()

    builder = interpreter.InterpreterBuilder
    create_dot = builder.create_dot

    def create_dot_widening_bf16(self, a, b, d, input_precision, max_num_imprecise_acc):
        def widen(x):
            if x.dtype.scalar != tl.bfloat16:
                return x
            widened = rounded_convert_float(x.data, tl.bfloat16, tl.float32, None)
            return interpreter.TensorHandle(widened.view(np.float32), tl.float32)

        return create_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    interpreter._convert_float = rounded_convert_float
    builder.create_dot = create_dot_widening_bf16
    interpreter.atom_kernels_patched = True


if INTERPRETING:
    _patch_interpreter()


# Host-side integer helpers in plain Python: triton.cdiv and triton.next_power_of_2 are constexpr
# functions in Triton 3.6, about 1.6 us a call from host code (0.03-0.05 us these), and the op
# wrappers call them on every launch.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()


def dot_precision(dtype: torch.dtype) -> str:
    """``input_precision`` for tl.dot on operands of ``dtype``: exact fp32 (no TF32) for fp32 inputs."""
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.cache
def num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``; a nominal 132 (H100/H200) on CPU for the interpreter."""
    if device.type != "cuda":
        return 132
    return num_sms(device.index if device.index is not None else torch.cuda.current_device())


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.stride(-1) != 1:
        raise ValueError(
            f"{name}: the last dim must be contiguous (stride 1), got strides {t.stride()}"
        )


def check_shape(op: str, name: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}, expected {tuple(expected)}")


def check_state_seqs(op: str, cu_seqlens: torch.Tensor, has_initial_state: torch.Tensor) -> int:
    """The number of sequences of a stateful varlen op (linear attention, its conv), checked
    between ``cu_seqlens`` [N + 1] and ``has_initial_state`` [N]."""
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 1:
        raise ValueError(f"{op}: cu_seqlens must be [num_seqs + 1], got {tuple(cu_seqlens.shape)}")
    num_seqs = cu_seqlens.shape[0] - 1
    check_shape(op, "has_initial_state", has_initial_state, (num_seqs,))
    return num_seqs


def check_same_device(**tensors: torch.Tensor | None) -> None:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    if len(set(devices.values())) > 1:
        raise ValueError(f"tensors on different devices: {devices}")


@triton.jit
def locate_block(starts_ptr, block, num_seqs, BLOCK: tl.constexpr):
    """(sequence, its first row, its row count, the block's first row within it) of row block
    ``block``, when sequence s's blocks are numbered from ``starts[s] // BLOCK + s`` (``starts`` are
    cumulative row offsets). Numbering blocks this way bounds their count by rows // BLOCK +
    num_seqs, so a launch grid needs no lengths read back from the GPU; a block past its sequence's
    end gets a first row >= the row count (its program has nothing to do)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(starts_ptr + mid) // BLOCK + mid <= block:
            lo = mid + 1
        else:
            hi = mid
    seq = lo - 1
    start = tl.load(starts_ptr + seq)
    length = tl.load(starts_ptr + seq + 1) - start
    return seq, start, length, (block - (start // BLOCK + seq)) * BLOCK
