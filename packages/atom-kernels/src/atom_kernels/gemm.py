"""fp8 GEMMs: ``out = dequant(a) @ dequant(b).T`` with a [M, K] activations, b [N, K] weights (the
nn.Linear layout), both fp8, and fp32 scales.

* ``fp8_scaled_mm``: a_scale [1] (per tensor) or [M, 1] (per token); b_scale [1] (per tensor) or
  [N, 1] / [N] (per channel). The scales multiply the fp32 accumulator once, in the epilogue.
* ``fp8_block_scaled_mm``: DeepSeek-V3-style blocks: a_scale [M, K / 128] (1 x 128 groups, from
  :func:`atom_kernels.per_group_quant_fp8`), b_scale [ceil(N / 128), K / 128] (128 x 128 blocks),
  applied per K step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.registry import define_op
from atom_kernels.triton_utils import cdiv, check_last_dim_contiguous, check_same_device, sm_count


@define_op
def fp8_scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``a @ b.T`` [M, N] for fp8 ``a`` [M, K], ``b`` [N, K]: per-tensor or per-token ``a_scale``
    times per-tensor or per-channel ``b_scale``."""


@define_op
def fp8_block_scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    block_size: int = 128,
) -> torch.Tensor:
    """``a @ b.T`` [M, N] with 1x128 activation groups (``a_scale`` [M, K / 128]) and 128x128 weight
    blocks (``b_scale`` [ceil(N / 128), K / 128])."""


def _column(scale: torch.Tensor, rows: int, name: str) -> torch.Tensor:
    """A per-tensor ([1]) or per-row ([rows] / [rows, 1]) scale as a fp32 [rows or 1, 1] column."""
    scale = scale.float().reshape(-1, 1)
    if scale.shape[0] not in (1, rows):
        raise ValueError(f"{name}: {scale.shape[0]} scales for {rows} rows")
    return scale


@fp8_scaled_mm.register("torch")
def fp8_scaled_mm_torch(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                        out_dtype: torch.dtype = torch.bfloat16, bias: torch.Tensor | None = None) -> torch.Tensor:
    out = (a.float() @ b.float().t()) * _column(a_scale, a.shape[0], "a_scale")
    out = out * _column(b_scale, b.shape[0], "b_scale").t()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)


def _expand_blocks(scale: torch.Tensor, rows: int, cols: int, block_rows: int, block_cols: int) -> torch.Tensor:
    return scale.float().repeat_interleave(block_rows, dim=0).repeat_interleave(block_cols, dim=1)[:rows, :cols]


@fp8_block_scaled_mm.register("torch")
def fp8_block_scaled_mm_torch(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                              out_dtype: torch.dtype = torch.bfloat16, block_size: int = 128) -> torch.Tensor:
    (m, k), n = a.shape, b.shape[0]
    a_deq = a.float() * _expand_blocks(a_scale, m, k, 1, block_size)
    b_deq = b.float() * _expand_blocks(b_scale, n, k, block_size, block_size)
    return (a_deq @ b_deq.t()).to(out_dtype)


# a_scale_stride_k is M for group-major activation scales (atom_kernels.quant.new_scales).
@triton.jit(do_not_specialize=["M", "a_scale_stride_k"])
def _fp8_gemm_kernel(
    a_ptr,
    b_ptr,
    out_ptr,
    a_scale_ptr,
    b_scale_ptr,
    bias_ptr,
    M,
    N,
    K,
    a_stride,
    b_stride,
    out_stride,
    a_scale_stride,
    a_scale_stride_k,
    b_scale_stride,
    partial_ptr,
    k_per_split,
    A_PER_ROW: tl.constexpr,
    B_PER_ROW: tl.constexpr,
    BLOCK_SCALED: tl.constexpr,
    SCALE_BLOCK: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SPLIT: tl.constexpr,
    SWAP_AB: tl.constexpr,
):
    """``SWAP_AB``: each K step computes the tile's transpose, weights x activations, so the weight tile
    is the MMA's M side and the rows its N side (see :func:`_gemm_config`)."""
    pid = tl.program_id(0)
    num_pid_m, num_pid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * num_pid_n)
    first_m = group * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * num_pid_n)) % group_size
    pid_n = (pid % (GROUP_M * num_pid_n)) // group_size

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_valid, col_valid = rows < M, cols < N
    a_rows = a_ptr + rows.to(tl.int64)[:, None] * a_stride
    if SWAP_AB:
        b_rows = b_ptr + cols.to(tl.int64)[:, None] * b_stride
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    else:
        b_cols = b_ptr + cols.to(tl.int64)[None, :] * b_stride
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    # Split K: program (tile, s) sums K columns [s * k_per_split, (s + 1) * k_per_split).
    k_first = tl.program_id(1) * k_per_split
    for k0 in range(k_first, tl.minimum(K, k_first + k_per_split), BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_rows + ks[None, :], mask=row_valid[:, None] & (ks < K)[None, :], other=0.0)
        if SWAP_AB:
            b = tl.load(b_rows + ks[None, :], mask=col_valid[:, None] & (ks < K)[None, :], other=0.0)
        else:
            b = tl.load(b_cols + ks[:, None], mask=(ks < K)[:, None] & col_valid[None, :], other=0.0)
        if BLOCK_SCALED:
            # BLOCK_K divides SCALE_BLOCK, so one K step lies inside one scale group.
            k_group = k0 // SCALE_BLOCK
            sa = tl.load(a_scale_ptr + rows * a_scale_stride + k_group * a_scale_stride_k, mask=row_valid,
                         other=0.0)
            sb = tl.load(
                b_scale_ptr + (cols // SCALE_BLOCK) * b_scale_stride + k_group,
                mask=col_valid,
                other=0.0,
            )
            if SWAP_AB:
                acc += tl.dot(b, tl.trans(a)) * sb[:, None] * sa[None, :]
            else:
                acc += tl.dot(a, b) * sa[:, None] * sb[None, :]
        elif SWAP_AB:
            acc += tl.dot(b, tl.trans(a))
        else:
            # A fresh dot per K step, added in fp32: Hopper's fp8 MMA accumulates with fewer bits than
            # fp32, so long K runs are promoted every BLOCK_K (as DeepGEMM does).
            acc += tl.dot(a, b)
    if SWAP_AB:
        acc = tl.trans(acc)
    if not BLOCK_SCALED:
        if A_PER_ROW:
            acc *= tl.load(a_scale_ptr + rows, mask=row_valid, other=0.0)[:, None]
        else:
            acc *= tl.load(a_scale_ptr)
        if B_PER_ROW:
            acc *= tl.load(b_scale_ptr + cols, mask=col_valid, other=0.0)[None, :]
        else:
            acc *= tl.load(b_scale_ptr)
    mask = row_valid[:, None] & col_valid[None, :]
    if SPLIT:
        # The scales are linear, so each split applies them; _split_k_sum_kernel adds the bias.
        partial = partial_ptr + (tl.program_id(1) * M + rows.to(tl.int64))[:, None] * N + cols[None, :]
        tl.store(partial, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_valid, other=0.0).to(tl.float32)[None, :]
        out = out_ptr + rows.to(tl.int64)[:, None] * out_stride + cols[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["M", "splits"])
def _split_k_sum_kernel(partial_ptr, out_ptr, bias_ptr, M, N, out_stride, splits,
                        HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[row] = the sum of the ``splits`` fp32 partial rows (in split order, so runs repeat bit for
    bit) + bias, cast to out's dtype. The split count is no constexpr: one compiled kernel serves
    every count, as the GEMM's SPLIT flag does (no compiles while serving new batch sizes)."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_valid = cols < N
    acc = tl.zeros([BLOCK_N], tl.float32)
    for split in range(splits):
        acc += tl.load(partial_ptr + (split * M + row).to(tl.int64) * N + cols, mask=col_valid, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_valid, other=0.0).to(tl.float32)
    tl.store(out_ptr + row.to(tl.int64) * out_stride + cols, acc.to(out_ptr.dtype.element_ty), mask=col_valid)


def _gemm_config(m: int, block_scaled: bool = True) -> dict[str, int]:
    """Tiles by M: decode-sized M streams the weights, prefill-sized M is compute bound.
    ``split_*``: how :func:`_split_k` cuts K for these tiles (fewest K steps a split, fewest K steps
    before splitting at all, programs an SM: see there, four for block-scaled 16-row tiles only)."""
    if m <= 32:
        # Operands swapped: the weight tile is the MMA's M side (64 columns), the rows its N side, which
        # wgmma takes 16 and 32 wide (unswapped: the older MMA at 16 rows, 32 padded to 64): 0.84 / 0.86 /
        # 0.88x the time at 1 / 16 / 32 rows, 1.13x at 64 (geomean of eight FP8 linears of Qwen3 and
        # DeepSeek-V3, H200, benchmarks/kernels/experiments/fp8-h200.json.gz[swap-ab]).
        return {
            "BLOCK_M": 16 if m <= 16 else 32,
            "BLOCK_N": 64,
            "BLOCK_K": 128,
            "GROUP_M": 1,
            "SWAP_AB": True,
            "num_warps": 4,
            "num_stages": 4,
            "split_min_steps": 8,
            "split_from_steps": 32,
            "split_programs_per_sm": 4 if m <= 16 and block_scaled else 2,
        }
    if m <= 64:
        return {
            "BLOCK_M": 64,
            "BLOCK_N": 64,
            "BLOCK_K": 128,
            "GROUP_M": 8,
            "SWAP_AB": False,
            "num_warps": 4,
            "num_stages": 4,
            "split_min_steps": 12,
        }
    # Four stages: 44.0 vs 50.2 us at M=128, 2015 vs 2103 at 8192 (token x channel, N=24576, K=4096,
    # H200, 2026-11); block-scaled the same either way.
    return {
        "BLOCK_M": 128,
        "BLOCK_N": 128,
        "BLOCK_K": 128,
        "GROUP_M": 8,
        "SWAP_AB": False,
        "num_warps": 8,
        "num_stages": 4,
        "split_min_steps": 8,
    }


# Split K when the output tiles leave SMs idle, up to this many programs an SM (unless the tiles say otherwise).
SPLIT_K_PROGRAMS_PER_SM = 2


def _split_k(tiles: int, k_steps: int, min_steps: int, device: torch.device, from_steps: int = 0,
             programs_per_sm: int = SPLIT_K_PROGRAMS_PER_SM) -> int:
    """How many K ranges each output tile is cut into: one when the tiles alone fill the GPU. Short
    wide layers (DeepSeek's kv_a_proj: 9 tiles of 56 K steps at decode) otherwise run on a few SMs one
    K step after another. Each split writes an fp32 partial of its tile, so splits of few K steps cost
    more than they save, the more so the more rows: ``min_steps`` per tile size (12 / 8 for 64- /
    128-row tiles) and two programs an SM came within 4 % of the best split count (geomean) over the
    FP8 linears of Qwen3-8B, Qwen3-30B-A3B and DeepSeek-V3 at 1-64 rows (and DeepSeek's kv_a widths at
    128-256), where a fixed minimum of 4 steps came to 7 % and up to 1.41x; unsplit, 1.63x and up to
    4x (H200, ``fp8-h200.json.gz[split-k]``). The swapped tiles of up to 32 rows take 8 steps and no split
    below ``from_steps`` = 32 K steps, where the sum kernel's launch costs more than the split saves
    (``fp8-h200.json.gz[swap-ab]``: K = 2048 unsplit 5.5-6.3 us, in two 6.4-8.0). Programs an SM, long-K
    layers with the quantization launch, four against two (``results/fp8-gemm-h200.json.gz``,
    ``[2026-11-29-148a1a1]`` against ``[2026-11-30-25d6097]``): at 16 rows four were faster (Qwen3-8B's
    down_proj 21.7 / 25.3 us, DeepSeek-V3's o_proj 40.0 / 47.5), at 32 rows two (28.5 / 27.0, 54.5 /
    49.8; a 32-row tile holds more shared memory and registers, so fewer fit an SM: not profiled). Per
    channel, four against two at 16 rows: 1.01x on geomean, 1.035-1.057x above 7000 K (``atom_channel_us``)."""
    sms = sm_count(device)
    if tiles >= sms or k_steps < from_steps:
        return 1
    return max(1, min(cdiv(programs_per_sm * sms, tiles), k_steps // min_steps))


def _split_rule(config: dict) -> tuple[int, int, int]:
    """Pops a tile config's ``split_*`` keys: :func:`_split_k`'s (min_steps, from_steps, programs_per_sm)."""
    return (config.pop("split_min_steps"), config.pop("split_from_steps", 0),
            config.pop("split_programs_per_sm", SPLIT_K_PROGRAMS_PER_SM))


def _launch_fp8_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    a_scale: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None,
    block_scaled: bool,
    scale_block: int,
    split_k: int | None = None,
    config: dict[str, int] | None = None,
) -> torch.Tensor:
    """``split_k`` None: chosen by :func:`_split_k`; a number (experiments, tests) forces it. ``config``
    None: :func:`_gemm_config`'s tiles; a dict of its keys (experiments, tests) replaces them."""
    check_same_device(a=a, b=b, a_scale=a_scale, b_scale=b_scale, bias=bias)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(
            f"fp8 gemm: a {tuple(a.shape)} and b {tuple(b.shape)} are not [M, K] x [N, K]"
        )
    if a.element_size() != 1 or b.element_size() != 1:
        raise ValueError(f"fp8 gemm: operands must be fp8, got {a.dtype} and {b.dtype}")
    check_last_dim_contiguous("a", a)
    check_last_dim_contiguous("b", b)
    (m, k), n = a.shape, b.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    config = {"SWAP_AB": False, **(config or _gemm_config(m, block_scaled))}
    min_steps, from_steps, programs_per_sm = _split_rule(config)
    if block_scaled:
        config["BLOCK_K"] = min(config["BLOCK_K"], scale_block)
        if scale_block % config["BLOCK_K"]:
            raise ValueError(
                f"fp8_block_scaled_mm: block_size {scale_block} must be a multiple of 128"
            )
    tiles = cdiv(m, config["BLOCK_M"]) * cdiv(n, config["BLOCK_N"])
    k_steps = cdiv(k, config["BLOCK_K"])
    if split_k is None:
        split_k = _split_k(tiles, k_steps, min_steps, a.device, from_steps, programs_per_sm)
    steps_per_split = max(1, cdiv(k_steps, max(1, min(split_k, k_steps))))
    split_k = max(1, cdiv(k_steps, steps_per_split))  # no empty split (one program a tile at K = 0)
    partial = torch.empty((split_k, m, n), dtype=torch.float32, device=a.device) if split_k > 1 else None
    _fp8_gemm_kernel[(tiles, split_k)](
        a, b, out, a_scale, b_scale, bias, m, n, k, a.stride(0), b.stride(0), out.stride(0),
        a_scale.stride(0) if block_scaled else 0, a_scale.stride(1) if block_scaled else 0,
        b_scale.stride(0) if block_scaled else 0, partial, steps_per_split * config["BLOCK_K"],
        A_PER_ROW=a_scale.numel() > 1, B_PER_ROW=b_scale.numel() > 1, BLOCK_SCALED=block_scaled,
        SCALE_BLOCK=scale_block, HAS_BIAS=bias is not None, SPLIT=split_k > 1, **config,
    )
    if split_k > 1:
        block_n = 1024
        _split_k_sum_kernel[(m, cdiv(n, block_n))](
            partial, out, bias, m, n, out.stride(0), split_k, HAS_BIAS=bias is not None, BLOCK_N=block_n
        )
    return out


@fp8_scaled_mm.register("triton")
def fp8_scaled_mm_triton(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                         out_dtype: torch.dtype = torch.bfloat16, bias: torch.Tensor | None = None) -> torch.Tensor:
    a_scale = _column(a_scale, a.shape[0], "a_scale").contiguous()
    b_scale = _column(b_scale, b.shape[0], "b_scale").contiguous()
    return _launch_fp8_gemm(a, b, a_scale, b_scale, out_dtype, bias, False, 128)


@fp8_block_scaled_mm.register("triton")
def fp8_block_scaled_mm_triton(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                               out_dtype: torch.dtype = torch.bfloat16, block_size: int = 128) -> torch.Tensor:
    (m, k), n = a.shape, b.shape[0]
    groups_k, groups_n = cdiv(k, block_size), cdiv(n, block_size)
    if a_scale.shape != (m, groups_k) or b_scale.shape != (groups_n, groups_k):
        raise ValueError(
            f"fp8_block_scaled_mm: a_scale {tuple(a_scale.shape)} != ({m}, {groups_k}) or "
            f"b_scale {tuple(b_scale.shape)} != ({groups_n}, {groups_k})"
        )
    # a_scale in any layout (group-major as the quantizers', or row-major); b_scale row-major.
    a_scale, b_scale = a_scale.float(), b_scale.float().contiguous()
    return _launch_fp8_gemm(a, b, a_scale, b_scale, out_dtype, None, True, block_size)


# torch._scaled_mm (cuBLASLt / CUTLASS in torch 2.11) against the Triton kernels on an H200 (benchmarks/
# kernels/experiments/fp8-h200.json.gz[block-library, library-widths, split-k]): mostly faster from 256 rows,
# mostly as fast or slower up to 64. It refuses row counts that are no multiple of 16: padded. Block-wise
# it does not split K: with under one 128 x 128 output tile per LIBRARY_SMS_PER_TILE SMs the Triton kernel
# ran faster (DeepSeek-V3's 2112 / 576 widths; Qwen3-30B-A3B's o_proj at 128 rows). Where K / 128 is no
# multiple of 4 (K 256, 384, 640, 768, 1280, 2304, 6400) its outputs were wrong; weight scales with
# 16-byte rows it refuses (torch 2.11), so it takes K of whole 512 columns.
LIBRARY_MIN_ROWS = 65
LIBRARY_ROW_MULTIPLE = 16
_LIBRARY_OUT_DTYPES = (torch.bfloat16, torch.float16)
LIBRARY_SMS_PER_TILE = 6


def _library_fits(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, k_multiple: int) -> bool:
    return (a.shape[0] >= LIBRARY_MIN_ROWS and out_dtype in _LIBRARY_OUT_DTYPES
            and a.shape[1] % k_multiple == 0 and b.shape[0] % LIBRARY_ROW_MULTIPLE == 0)


def _block_library_fits(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype) -> bool:
    """Whether torch's block-wise GEMM takes ``a`` x ``b``: see LIBRARY_SMS_PER_TILE."""
    tiles = cdiv(a.shape[0], 128) * cdiv(b.shape[0], 128)
    return _library_fits(a, b, out_dtype, 512) and LIBRARY_SMS_PER_TILE * tiles >= sm_count(a.device)


def _library_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                out_dtype: torch.dtype) -> torch.Tensor:
    """torch._scaled_mm of ``a`` [M, K] and ``b`` [N, K] with M padded to LIBRARY_ROW_MULTIPLE
    (zero rows, unit scales) and the padding cut off again; ``scale_a`` [M, *] stored M-major, as
    the block-wise recipe needs (the same layout for a row-wise [M, 1]): the quantizers' layout, so
    a copy only for other scales or padded rows."""
    rows, pad = a.shape[0], -a.shape[0] % LIBRARY_ROW_MULTIPLE
    scale_a = scale_a.t()
    if pad:
        a = torch.cat([a, a.new_zeros(pad, a.shape[1])])
        scale_a = torch.cat([scale_a, scale_a.new_ones(scale_a.shape[0], pad)], dim=1)
    scale_a = scale_a.contiguous().t()
    return torch._scaled_mm(a, b.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)[:rows]


@fp8_block_scaled_mm.register("torchlib")
def fp8_block_scaled_mm_torchlib(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                                 out_dtype: torch.dtype = torch.bfloat16, block_size: int = 128) -> torch.Tensor:
    if block_size != 128 or not _block_library_fits(a, b, out_dtype):
        return fp8_block_scaled_mm_triton(a, b, a_scale, b_scale, out_dtype, block_size)
    # The 1x128 x 128x128 recipe: activation scales [M, K/128] M-major (the quantizers' layout), weight
    # scales transposed to [K/128, ceil(N/128)].
    return _library_mm(a, b, a_scale.float(), b_scale.float().t(), out_dtype)


@fp8_scaled_mm.register("torchlib")
def fp8_scaled_mm_torchlib(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                           out_dtype: torch.dtype = torch.bfloat16, bias: torch.Tensor | None = None) -> torch.Tensor:
    if not _library_fits(a, b, out_dtype, 16):
        return fp8_scaled_mm_triton(a, b, a_scale, b_scale, out_dtype, bias)
    # Row-wise recipe: [M, 1] x [1, N] (a per-tensor scale broadcast to its rows or columns).
    scale_a = _column(a_scale, a.shape[0], "a_scale").expand(a.shape[0], 1).contiguous()
    scale_b = _column(b_scale, b.shape[0], "b_scale").expand(b.shape[0], 1).t().contiguous()
    out = _library_mm(a, b, scale_a, scale_b, out_dtype)
    return out if bias is None else out + bias
