"""Sorting MoE entries by expert: the first step of the Triton fused MoE (atom_kernels.moe).

Each (token, k) routing entry goes to a run of rows for its expert, every run padded to a multiple
of the GEMM's row block, so that every block of rows belongs to one expert.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.registry import define_op
from atom_kernels.triton_utils import cdiv, next_pow2


@define_op
def moe_align_block_size(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sorted_ids, block_expert)``: the (token, k) entries grouped by expert, each expert's run
    padded to a multiple of ``block_m``. ``sorted_ids`` holds entry indices ``token * top_k + k``
    (padding: ``topk_ids.numel()``); ``block_expert`` is the expert of each ``block_m`` rows (-1 past
    the last run). Sizes follow from the shapes alone (nothing is read back to the host); the order of
    entries within a run is backend-defined."""


@moe_align_block_size.register("torch")
def moe_align_block_size_torch(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    flat = topk_ids.reshape(-1).long()
    num_entries = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    order = torch.sort(flat, stable=True).indices
    sorted_experts = flat[order]
    rank = (
        torch.arange(num_entries, device=flat.device) - (counts.cumsum(0) - counts)[sorted_experts]
    )
    dest = (padded_end - padded)[sorted_experts] + rank
    capacity = align_capacity(num_entries, num_experts, block_m)
    sorted_ids = torch.full((capacity,), num_entries, dtype=torch.int32, device=flat.device)
    sorted_ids[dest] = order.to(torch.int32)
    block_starts = torch.arange(0, capacity, block_m, device=flat.device)
    block_expert = torch.searchsorted(padded_end, block_starts, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return sorted_ids, block_expert


def align_capacity(num_entries: int, num_experts: int, block_m: int) -> int:
    """Rows of the padded sort: every entry plus, per used expert, the padding of its last block."""
    capacity = num_entries + min(num_experts, num_entries) * (block_m - 1)
    return cdiv(capacity, block_m) * block_m


# The Triton sort runs in two launches, each over chunks of CHUNK entries in parallel:
# 1. _moe_count_kernel: each chunk's histogram of experts into its row of `counts`; the programs
#    also fill sorted_ids with the padding value.
# 2. _moe_scatter_kernel: each program sums the histogram rows itself (a few KB) into the expert runs,
#    padded to BLOCK_M, and the first row its chunk may write in each run. Then each entry takes its
#    chunk's next row for its expert (atomics on that chunk's own row of `next_free`, so the order
#    within a run is arbitrary; no GEMM row depends on its neighbours), and each block of BLOCK_M
#    rows finds its expert by binary search.
# With one chunk (up to CHUNK entries: decode batches), _moe_align_one_chunk_kernel runs both steps in
# one program. Not further: one program over 4096 entries (8 warps) took 21.0 us on an H200, three
# launches 15.4 us (Qwen3-30B-A3B, 512 tokens; H200, 2026-11).


@triton.jit
def _chunk_experts(ids_ptr, chunk, num_entries, CHUNK: tl.constexpr):
    """Chunk ``chunk`` of the routing entries: (entry indices, valid mask, expert ids)."""
    entries = chunk * CHUNK + tl.arange(0, CHUNK)
    valid = entries < num_entries
    return entries, valid, tl.load(ids_ptr + entries, mask=valid, other=0)


@triton.jit
def _count_chunk(
    ids_ptr, counts_ptr, sorted_ids_ptr, chunk, num_entries, capacity, fill_per_program,
    E_P2: tl.constexpr, CHUNK: tl.constexpr,
):
    """Step 1 for one chunk: its histogram row, and its share of the padding fill."""
    _, valid, experts = _chunk_experts(ids_ptr, chunk, num_entries, CHUNK)
    tl.store(counts_ptr + chunk * E_P2 + tl.arange(0, E_P2), tl.histogram(experts, E_P2, mask=valid))
    for start in range(chunk * fill_per_program, (chunk + 1) * fill_per_program, CHUNK):
        rows = start + tl.arange(0, CHUNK)
        tl.store(sorted_ids_ptr + rows, num_entries, mask=rows < capacity)


@triton.jit
def _scatter_chunk(
    ids_ptr, counts_ptr, next_free_ptr, run_end_ptr, sorted_ids_ptr, block_expert_ptr, chunk,
    num_chunks, num_entries, num_experts, num_blocks, blocks_per_program,
    BLOCK_M: tl.constexpr, E_P2: tl.constexpr, LOG2_E_P2: tl.constexpr, CHUNK: tl.constexpr,
    CHUNKS_TILE: tl.constexpr,
):
    """Step 2 for one chunk. Every program writes the same run_end; each reads back only what it
    wrote itself, after the barrier."""
    experts_row = tl.arange(0, E_P2)[None, :]
    total = tl.zeros([E_P2], tl.int32)
    before = tl.zeros([E_P2], tl.int32)
    for first in range(0, num_chunks, CHUNKS_TILE):
        chunks = first + tl.arange(0, CHUNKS_TILE)[:, None]
        tile = tl.load(counts_ptr + chunks * E_P2 + experts_row, mask=chunks < num_chunks, other=0)
        total += tl.sum(tile, axis=0)
        before += tl.sum(tl.where(chunks < chunk, tile, 0), axis=0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    run_end = tl.cumsum(padded, axis=0)
    tl.store(run_end_ptr + tl.arange(0, E_P2), run_end)
    tl.store(next_free_ptr + chunk * E_P2 + tl.arange(0, E_P2), run_end - padded + before)
    tl.debug_barrier()
    entries, valid, experts = _chunk_experts(ids_ptr, chunk, num_entries, CHUNK)
    rows = tl.atomic_add(next_free_ptr + chunk * E_P2 + experts, 1, mask=valid)
    tl.store(sorted_ids_ptr + rows, entries, mask=valid)
    # Block b belongs to the first expert whose run ends after its first row (-1: past every run).
    first_block = chunk * blocks_per_program
    for start in range(first_block, first_block + blocks_per_program, CHUNK):
        blocks = start + tl.arange(0, CHUNK)
        first_row = blocks * BLOCK_M
        lo = tl.zeros([CHUNK], tl.int32)
        hi = tl.full([CHUNK], E_P2, tl.int32)
        for _ in tl.static_range(LOG2_E_P2 + 1):
            active = lo < hi
            mid = (lo + hi) // 2
            ends_before = tl.load(run_end_ptr + mid, mask=active, other=0) <= first_row
            lo = tl.where(active & ends_before, mid + 1, lo)
            hi = tl.where(active & ~ends_before, mid, hi)
        owner = tl.where(lo < num_experts, lo, -1)
        tl.store(block_expert_ptr + blocks, owner, mask=blocks < num_blocks)


@triton.jit(do_not_specialize=["num_entries", "capacity", "fill_per_program"])
def _moe_count_kernel(
    ids_ptr, counts_ptr, sorted_ids_ptr, num_entries, capacity, fill_per_program,
    E_P2: tl.constexpr, CHUNK: tl.constexpr,
):
    _count_chunk(ids_ptr, counts_ptr, sorted_ids_ptr, tl.program_id(0), num_entries, capacity,
                 fill_per_program, E_P2, CHUNK)


@triton.jit(
    do_not_specialize=["num_chunks", "num_entries", "num_experts", "num_blocks", "blocks_per_program"]
)
def _moe_scatter_kernel(
    ids_ptr, counts_ptr, next_free_ptr, run_end_ptr, sorted_ids_ptr, block_expert_ptr, num_chunks,
    num_entries, num_experts, num_blocks, blocks_per_program,
    BLOCK_M: tl.constexpr, E_P2: tl.constexpr, LOG2_E_P2: tl.constexpr, CHUNK: tl.constexpr,
    CHUNKS_TILE: tl.constexpr,
):
    _scatter_chunk(ids_ptr, counts_ptr, next_free_ptr, run_end_ptr, sorted_ids_ptr, block_expert_ptr,
                   tl.program_id(0), num_chunks, num_entries, num_experts, num_blocks,
                   blocks_per_program, BLOCK_M, E_P2, LOG2_E_P2, CHUNK, CHUNKS_TILE)


@triton.jit(do_not_specialize=["num_entries", "num_experts", "capacity", "num_blocks"])
def _moe_align_one_chunk_kernel(
    ids_ptr, counts_ptr, next_free_ptr, run_end_ptr, sorted_ids_ptr, block_expert_ptr, num_entries,
    num_experts, capacity, num_blocks,
    BLOCK_M: tl.constexpr, E_P2: tl.constexpr, LOG2_E_P2: tl.constexpr, CHUNK: tl.constexpr,
):
    """Both steps for a single chunk, in one program; the barrier orders the histogram row and the
    padding fill before the scatter that reads or overwrites them."""
    _count_chunk(ids_ptr, counts_ptr, sorted_ids_ptr, 0, num_entries, capacity, capacity, E_P2, CHUNK)
    tl.debug_barrier()
    _scatter_chunk(ids_ptr, counts_ptr, next_free_ptr, run_end_ptr, sorted_ids_ptr, block_expert_ptr,
                   0, 1, num_entries, num_experts, num_blocks, num_blocks, BLOCK_M, E_P2, LOG2_E_P2,
                   CHUNK, 1)


@moe_align_block_size.register("triton")
def moe_align_block_size_triton(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    ids = topk_ids.reshape(-1)
    if ids.dtype != torch.int32:
        ids = ids.to(torch.int32)
    num_entries = ids.numel()
    capacity = align_capacity(num_entries, num_experts, block_m)
    num_blocks = capacity // block_m
    device = ids.device
    sorted_ids = torch.empty((capacity,), dtype=torch.int32, device=device)
    block_expert = torch.empty((num_blocks,), dtype=torch.int32, device=device)
    e_p2 = next_pow2(num_experts)
    # Two chunk sizes only (both compile during an engine's warm-up: decode-sized and max-sized).
    chunk = 1024 if num_entries <= 16384 else 4096
    num_chunks = max(1, cdiv(num_entries, chunk))
    counts = torch.empty((num_chunks, e_p2), dtype=torch.int32, device=device)
    next_free = torch.empty((num_chunks, e_p2), dtype=torch.int32, device=device)
    run_end = torch.empty((e_p2,), dtype=torch.int32, device=device)
    log2_e_p2 = e_p2.bit_length() - 1
    if num_chunks == 1:
        _moe_align_one_chunk_kernel[(1,)](
            ids, counts, next_free, run_end, sorted_ids, block_expert, num_entries, num_experts,
            capacity, num_blocks, BLOCK_M=block_m, E_P2=e_p2, LOG2_E_P2=log2_e_p2, CHUNK=chunk,
        )
        return sorted_ids, block_expert

    def per_program(n: int) -> int:  # n rows split over the programs, in whole chunks
        return cdiv(cdiv(n, num_chunks), chunk) * chunk

    _moe_count_kernel[(num_chunks,)](
        ids, counts, sorted_ids, num_entries, capacity, per_program(capacity), E_P2=e_p2, CHUNK=chunk
    )
    _moe_scatter_kernel[(num_chunks,)](
        ids, counts, next_free, run_end, sorted_ids, block_expert, num_chunks, num_entries,
        num_experts, num_blocks, per_program(num_blocks), BLOCK_M=block_m, E_P2=e_p2,
        LOG2_E_P2=log2_e_p2, CHUNK=chunk, CHUNKS_TILE=8,
    )
    return sorted_ids, block_expert


def warm_up_moe_align(num_experts: int, block_m: int, device: torch.device) -> None:
    """Compile every variant of the Triton align that ``block_m`` reaches: one chunk, several chunks
    of 1024 entries and several of 4096 (above 16384 entries, e.g. 8192 tokens at top-8 or more),
    so that a batch of that size does not compile one while serving. The expert ids are all 0."""
    for num_entries in (1, 2 * 1024, 16384 + 1):
        moe_align_block_size_triton(torch.zeros(num_entries, dtype=torch.int32, device=device), num_experts,
                                    block_m)
