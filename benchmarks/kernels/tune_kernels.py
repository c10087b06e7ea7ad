"""Tune ATOM's Triton tile configs on this GPU and write the tables that ``atom_kernels.tuned`` reads.

    python benchmarks/kernels/tune_kernels.py --out-dir DIR [--ops moe,moe_fp8,moe_mxfp4,attention] [--jobs 16] \
        [--models M,...] [--tokens N,...]   # MoE ops: only these models, token counts
    python benchmarks/kernels/tune_kernels.py --dry-run [--ops ...]   # the plan; needs no GPU

* fused MoE, ``moe`` (bf16 experts of Qwen3-30B-A3B, DeepSeek-V2-Lite, DeepSeek-V3 and
  Qwen3-Next-80B-A3B) and ``moe_fp8`` (block-FP8 experts of Qwen3-30B-A3B-FP8 and DeepSeek-V3 at TP 1:
  fp8 weights with an fp32 scale per 128 x 128 block, bf16 activations quantized per token and 128
  channels): per token count, every row-block size BLOCK_M and, for each of the two GEMMs (gate_up with
  the activation, down), every tile candidate (split-K ones too up to SPLIT_K_MAX_TOKENS), from 64-row
  blocks the best tile again at other GROUP_M (kept if the whole op runs faster); the BLOCK_M whose two
  best GEMMs sum lowest wins.
  ``moe_mxfp4``: the MXFP4 experts of gpt-oss-20b and gpt-oss-120b (uint8 weights, two e2m1 values a
  byte, an e8m0 scale per 32 values); up to GEMV_MAX_TOKENS also the matrix-vector path, and the whole
  op's time decides between the two.
* attention (Qwen3-8B and Qwen3-30B-A3B heads): prefill (varlen, 16 x 1024 tokens) and extend
  (paged: 4 chunked-prefill extends of 512 new tokens over 2048 cached), every
  candidate of HEADS, BLOCK_M, BLOCK_N, warps, stages. Only the prefill picks go into the table;
  the extend picks are reported (see atom_kernels/tuned/README.md for why).

Every timing is a CUDA-graph replay (median of a few). Candidates compile first, in ``--jobs``
processes, into the shared Triton cache. Then the whole ops run with the new tables, next to the
built-in defaults, the packaged tables and, where vLLM is installed, its kernel (fused_experts, with its
block-FP8 W8A8 path for ``moe_fp8``, and on the dequantized bf16 weights for ``moe_mxfp4``: vLLM's MXFP4
MoE needs its own weight layout; FlashAttention 3), and their outputs are compared (MoE: also with ATOM's
torch reference); a MoE entry whose whole op ran over 2 % slower than with the packaged one is put back
(``kept_packaged``).
Writes DIR/fused_moe.json and DIR/attention.json and DIR/tune-report.json. A table keeps the shapes
and GPUs it had (a new one starts from the packaged table), so a run of some ops drops no entry of
the others. Point ``ATOM_TUNED_CONFIG_DIR`` at DIR to use the tables at once; copy them into
packages/atom-kernels/src/atom_kernels/tuned/ to ship them.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

import torch

BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn
SMEM_BYTES = 220 * 1024

MOE_MODELS = {  # experts, top_k, hidden, intermediate (as in bench_kernels.MODELS)
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "deepseek-v2-lite": (64, 6, 2048, 1408),
    "deepseek-v3": (256, 8, 7168, 2048),  # TP 1: 21 GiB of bf16 experts on the GPU
    "qwen3-next-80b-a3b": (512, 10, 2048, 512),
    # bf16 gpt-oss (its clamped SwiGLU and biases leave the GEMM tiles' cost as here): an H100 table,
    # none for the H200 yet (docs/performance.md, "SGLang on an H200")
    "gpt-oss-20b": (32, 4, 2880, 2880),
}
MOE_TOKENS = [1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
FP8_BLOCK = 128  # the scale block of both weights, and the activations' channel group
MOE_FP8_MODELS = {  # block-FP8 checkpoints, same columns
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "deepseek-v3": (256, 8, 7168, 2048),  # TP 1: 10.5 GiB of fp8 experts on the GPU
}
# Fewer sizes than bf16 below 1024 tokens; 8192 and 16384 since vLLM's offline prefill steps take
# 16384 tokens on an H200 (max_num_batched_tokens), which took the 4096 entry before.
MOE_FP8_TOKENS = [1, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384]
MXFP4 = torch.uint8  # the stored dtype of MXFP4 experts
MOE_MXFP4_MODELS = {  # gpt-oss: 32 / 128 experts, top 4, hidden = intermediate = 2880
    "gpt-oss-20b": (32, 4, 2880, 2880),
    "gpt-oss-120b": (128, 4, 2880, 2880),
}
MOE_MXFP4_TOKENS = [1, 4, 16, 64, 256, 1024, 4096, 16384]
MOE_OPS = {  # op: models, token counts, weight dtype
    "moe": (MOE_MODELS, MOE_TOKENS, BF16),
    "moe_fp8": (MOE_FP8_MODELS, MOE_FP8_TOKENS, FP8),
    "moe_mxfp4": (MOE_MXFP4_MODELS, MOE_MXFP4_TOKENS, MXFP4),
}
OPS = [*MOE_OPS, "attention"]
ATTENTION_MODELS = {
    "qwen3-8b": (32, 8, 128),
    "qwen3-30b-a3b": (32, 4, 128),
}  # heads, kv, dim
PREFILL = [1024] * 16
# ATOM's vLLM backend gives a step's decodes a launch of their own (decode tiles), so extend is
# tuned on the extend launch alone.
EXTEND = (4, 512, 2048)  # extends, new tokens per extend, context


# --- candidates ---


def moe_block_ms(num_tokens: int, experts: int, top_k: int) -> list[int]:
    rows_per_expert = num_tokens * top_k / experts
    return [m for m in (16, 32, 64, 128) if m == 16 or m <= 2 * rows_per_expert]


def moe_tiles(block_m: int, gated: bool, weight_dtype: torch.dtype) -> list[dict]:
    fp8 = weight_dtype == FP8
    # Block FP8: a K step must lie inside one scale block (launch_moe_gemm clamps BLOCK_K to a divisor
    # of it, so 256 would time 128 again); 1-byte operands leave room for deeper pipelines. BLOCK_N is
    # free: the kernel loads the weight scales of each output column.
    k_steps = [k for k in (64, 128, 256) if not fp8 or FP8_BLOCK % k == 0]
    stages_options = (3, 4, 5) if weight_dtype.itemsize == 1 else (2, 3, 4)
    tiles = []
    for n, k, warps, stages in itertools.product((64, 128, 256), k_steps, (4, 8), stages_options):
        operands = 2 if gated else 1
        # Activations are fp8 next to FP8 weights, else bf16; MXFP4 weights are half a byte a value.
        a_bytes, w_bytes = (1, 1) if fp8 else (2, 0.5 if weight_dtype == MXFP4 else 2)
        if stages * (block_m * k * a_bytes + operands * k * n * w_bytes) > SMEM_BYTES:
            continue
        if block_m * n * operands > 4096 * warps:  # fp32 accumulators past ~128 registers a thread
            continue
        tiles.append({"BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 1 if block_m <= 32 else 8, "num_warps": warps,
                      "num_stages": stages})
    return tiles


# Up to this many tokens the candidates include split-K tiles: there a GEMM has about one row block
# per routed expert, so only cutting K gives the GPU more programs than experts x column blocks.
SPLIT_K_MAX_TOKENS = 64


def moe_split_tiles(gated: bool, weight_dtype: torch.dtype) -> list[dict]:
    """Split-K candidates, for BLOCK_M 16: narrower columns, 4 warps, 2 to 8 splits."""
    fp8 = weight_dtype == FP8
    k_steps = [k for k in (64, 128, 256) if not fp8 or FP8_BLOCK % k == 0]
    w_bytes = 1 if fp8 else (0.5 if weight_dtype == MXFP4 else 2)
    operands = 2 if gated else 1
    return [
        {"BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 1, "num_warps": 4, "num_stages": stages,
         "SPLIT_K": split}
        for n, k, stages, split in itertools.product((32, 64, 128), k_steps, (3, 4), (2, 4, 8))
        if stages * (16 * k * 2 + operands * k * n * w_bytes) <= SMEM_BYTES
    ]


# Up to this many tokens MXFP4 experts also try the matrix-vector path (atom_kernels.moe_gemv): no sort,
# an entry a program row, CUDA-core FMAs on the decoded weights. Its candidates are keyed "gemv" where
# the tiled ones are keyed by BLOCK_M.
GEMV_MAX_TOKENS = 16
GEMV = "gemv"


def moe_gemv_tiles() -> list[dict]:
    """Matrix-vector candidates: up to 128 weight values a thread per K step."""
    return [
        {"BLOCK_N": n, "BLOCK_K": k, "num_warps": warps}
        for n, k, warps in itertools.product((8, 16, 32, 64), (128, 256, 512), (2, 4, 8))
        if n * k <= 128 * 32 * warps
    ]


# Row blocks from which the gate/up GEMM is also timed in its plain form (atom_kernels.moe.plain_gate_up:
# one GEMM over the 2I rows and a SiLU * mul (+ quant) launch, vLLM's form), for the SiLU models.
PLAIN_MIN_BLOCK_M = 64
NOT_SILU_MODELS = {"gpt-oss-20b"}  # clamped SwiGLU over interleaved rows with biases


# From 64-row blocks each GEMM's best tile is timed again at these GROUP_M (row blocks sharing a weight
# column block in L2): moe_tiles offers 8, vLLM's block-FP8 default is 32.
GROUP_M_MIN_BLOCK_M = 64
GROUP_M_RETRIES = (4, 16, 32)


def moe_candidates(
    num_tokens: int, experts: int, top_k: int, weight_dtype: torch.dtype, plain: bool = False
) -> dict[int | str, dict[str, list[dict]]]:
    """{BLOCK_M or GEMV: {"gate_up": tiles, "down": tiles}}: what is timed for one shape at
    ``num_tokens``; ``plain``: the plain gate/up form too."""
    split = num_tokens <= SPLIT_K_MAX_TOKENS
    candidates = {
        block_m: {
            name: moe_tiles(block_m, gated, weight_dtype)
            + (moe_split_tiles(gated, weight_dtype) if split and block_m == 16 else [])
            for name, gated in (("gate_up", True), ("down", False))
        }
        for block_m in moe_block_ms(num_tokens, experts, top_k)
    }
    if weight_dtype == MXFP4 and num_tokens <= GEMV_MAX_TOKENS:
        candidates[GEMV] = {"gate_up": moe_gemv_tiles(), "down": moe_gemv_tiles()}
    if weight_dtype != MXFP4:  # 16- and 32-row blocks: each tile swapped too (the weight tile on wgmma's M side)
        for block_m in {16, 32} & set(candidates):
            for tiles in candidates[block_m].values():
                tiles += [{**t, "SWAP_AB": True} for t in tiles]
    if plain and weight_dtype != MXFP4:
        for block_m in candidates.keys() - {GEMV}:
            if block_m >= PLAIN_MIN_BLOCK_M:
                candidates[block_m]["gate_up"] += plain_tiles(block_m, weight_dtype)
    return candidates


def plain_tiles(block_m: int, weight_dtype: torch.dtype) -> list[dict]:
    """The plain gate/up form's candidates: a plain GEMM's tiles."""
    return [{**t, "PLAIN": True} for t in moe_tiles(block_m, False, weight_dtype)]


def attention_candidates(group: int) -> list[dict]:
    out = []
    for heads, m, n, warps, stages in itertools.product(
        sorted({1, min(group, 16)}), (64, 128), (64, 128), (4, 8), (2, 3, 4)
    ):
        if stages * (m * 128 + 2 * n * 128) * 2 > SMEM_BYTES:
            continue
        out.append({"HEADS": heads, "BLOCK_M": m, "BLOCK_N": n, "num_warps": warps, "num_stages": stages})
    return out


# --- inputs ---


def rand(*shape, scale=1.0, dtype=BF16):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


@functools.cache
def moe_weights(
    experts: int, hidden: int, inter: int, weight_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """w13 [E, 2I, D], w2 [E, D, I] and their block scales (None for bf16), made once a model."""
    if weight_dtype not in (MXFP4, FP8):
        w13 = rand(experts, 2 * inter, hidden, scale=hidden**-0.5)
        return w13, rand(experts, hidden, inter, scale=inter**-0.5), None, None
    blocks = mxfp4_blocks if weight_dtype == MXFP4 else fp8_blocks
    (w13, w13_scale), (w2, w2_scale) = blocks(experts, 2 * inter, hidden), blocks(experts, hidden, inter)
    return w13, w2, w13_scale, w2_scale


def fp8_blocks(experts: int, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-FP8 weights [E, rows, cols]: unit-size fp8 values (drawn in bf16: in fp32, DeepSeek-V3's
    w13 would pass through 28 GiB), and per FP8_BLOCK x FP8_BLOCK block a scale of about 1 / sqrt(cols)."""
    w = torch.randn(experts, rows, cols, device="cuda", dtype=BF16).to(FP8)
    blocks = (experts, -(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
    return w, (0.5 + torch.rand(blocks, device="cuda")) * cols**-0.5


def mxfp4_blocks(experts: int, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 weights [E, rows, cols] as stored: uint8 [E, rows, cols / 2] of random e2m1 pairs and
    e8m0 scales [E, rows, cols / 32] of about 1 / (2 sqrt(cols)) (e2m1 codes average about 2)."""
    blocks = torch.randint(0, 256, (experts, rows, cols // 2), dtype=torch.uint8, device="cuda")
    center = 127 - round(math.log2(2 * cols**0.5))
    scales = torch.randint(center - 1, center + 2, (experts, rows, cols // 32), dtype=torch.uint8,
                           device="cuda")
    return blocks, scales


class MoeShape:
    """One MoE layer at ``num_tokens`` tokens: the whole op's inputs, and each GEMM's."""

    def __init__(self, dims: tuple[int, int, int, int], num_tokens: int, weight_dtype: torch.dtype):
        self.experts, self.top_k, self.hidden, self.inter = dims
        self.num_tokens = num_tokens
        e, d, i = self.experts, self.hidden, self.inter
        self.w13, self.w2, self.w13_scale, self.w2_scale = moe_weights(e, d, i, weight_dtype)
        self.block_size = FP8_BLOCK if weight_dtype == FP8 else 0
        self.mxfp4 = weight_dtype == MXFP4
        self.x = rand(num_tokens, d)
        logits = torch.randn(num_tokens, e, device="cuda")
        self.weights, self.ids = torch.topk(logits.softmax(-1), self.top_k)
        self.ids = self.ids.to(torch.int32)
        self.weights_flat = self.weights.reshape(-1).contiguous()
        entries = num_tokens * self.top_k
        self.hidden_states = torch.empty(entries, i, device="cuda", dtype=BF16)
        self.out = torch.empty(entries, d, device="cuda", dtype=BF16)
        self.split_outs: dict[int, torch.Tensor] = {}  # the down GEMM's fp32 partials by SPLIT_K
        self.gemv_out: torch.Tensor | None = None  # the matrix-vector down GEMM's fp32 rows
        self.aligned: dict[int, tuple] = {}
        if self.block_size:
            from atom_kernels.moe import quantize_activations

            # (fp8 input, scales) of each GEMM, as run_fused_moe quantizes them.
            self.gate_up_input = quantize_activations(self.x, FP8_BLOCK, "triton")
            self.down_input = quantize_activations(rand(entries, i), FP8_BLOCK, "triton")
        else:
            self.gate_up_input, self.down_input = (self.x, None), (self.hidden_states, None)

    def quant_args(self) -> dict:
        """fused_moe's FP8 / MXFP4 arguments (no scales and block 0 for bf16 weights)."""
        args = {"w13_scale": self.w13_scale, "w2_scale": self.w2_scale, "block_size": self.block_size}
        return args | ({"weight_format": "mxfp4"} if self.mxfp4 else {})

    def gemm(self, block_m: int | str, gated: bool, tiles: dict):
        """One GEMM's launch. The gate/up GEMM with what its form launches before the down GEMM: the
        quantization of its output with FP8 experts, or the plain form's SiLU * mul (+ quant) launch."""
        from atom_kernels import moe, moe_align

        if block_m == GEMV:
            return self.gemv(gated, tiles)
        if block_m not in self.aligned:
            self.aligned[block_m] = moe_align.moe_align_block_size_triton(
                self.ids, self.experts, block_m
            )
        sorted_ids, block_expert = self.aligned[block_m]
        entries = self.num_tokens * self.top_k
        if gated:
            (a, a_scale), w, w_scale = self.gate_up_input, self.w13, self.w13_scale
            out, weights, a_row_divisor = self.hidden_states, None, self.top_k
        else:
            (a, a_scale), w, w_scale = self.down_input, self.w2, self.w2_scale
            out, weights, a_row_divisor = self.out, self.weights_flat, 1
            if (split := tiles.get("SPLIT_K", 1)) > 1:
                if split not in self.split_outs:
                    self.split_outs[split] = torch.empty(entries * split, self.hidden,
                                                         device="cuda", dtype=torch.float32)
                out = self.split_outs[split]
        if gated and tiles.get("PLAIN"):
            gemm_tiles = {k: v for k, v in tiles.items() if k != "PLAIN"}
            return lambda: moe.plain_gate_up(a, a_scale, w, w_scale, self.block_size, sorted_ids, block_expert,
                                             entries, self.top_k, block_m, gemm_tiles, BF16)

        def run():
            moe.launch_moe_gemm(a, w, None, out, weights, sorted_ids, block_expert, entries, a_row_divisor,
                                block_m, tiles, gated=gated, a_scale=a_scale, w_scale=w_scale,
                                block_size=self.block_size, mxfp4=self.mxfp4)
            if gated and self.block_size:
                moe.quantize_activations(out, self.block_size, "triton")

        return run


    def whole_op_us(self, config: dict) -> float:
        """The fused MoE with ``config`` (atom_kernels.moe.run_fused_moe), timed as a CUDA graph."""
        from atom_kernels.moe import run_fused_moe

        args = (self.x, self.w13, self.w2, self.weights, self.ids, config)
        return graph_us(lambda: run_fused_moe(*args, **self.quant_args()))

    def gemv(self, gated: bool, tiles: dict):
        """One GEMM of the MXFP4 matrix-vector path (atom_kernels.moe_gemv)."""
        from atom_kernels.moe_gemv import launch_mxfp4_gemv

        expert_ids = self.ids.reshape(-1)
        if gated:
            args = (self.x, self.w13, self.w13_scale, None, self.hidden_states, expert_ids, None, self.top_k)
        else:
            if self.gemv_out is None:
                self.gemv_out = torch.empty(expert_ids.shape[0], self.hidden, device="cuda",
                                            dtype=torch.float32)
            args = (self.hidden_states, self.w2, self.w2_scale, None, self.gemv_out, expert_ids,
                    self.weights_flat, 1)
        return lambda: launch_mxfp4_gemv(*args, tiles, gated=gated)


class AttentionShape:
    def __init__(self, model: str, kind: str):
        self.heads, self.kv_heads, self.dim = ATTENTION_MODELS[model]
        self.group = self.heads // self.kv_heads
        self.kind = kind
        h, kv, d = self.heads, self.kv_heads, self.dim
        if kind == "prefill":
            total = sum(PREFILL)
            self.q, self.k, self.v = (
                rand(total, h, d),
                rand(total, kv, d),
                rand(total, kv, d),
            )
            self.cu = cu(PREFILL)
            self.max_len = max(PREFILL)
            self.flops = 2 * sum(n * n for n in PREFILL) * h * d
        else:
            seqs, new, context = EXTEND
            block = 16
            blocks = context // block
            self.table = torch.randperm(
                seqs * blocks, device="cuda", dtype=torch.int32
            ).view(seqs, blocks)
            self.k, self.v = (
                rand(seqs * blocks, block, kv, d),
                rand(seqs * blocks, block, kv, d),
            )
            q_lens = [new] * seqs
            self.q = rand(sum(q_lens), h, d)
            self.cu = cu(q_lens)
            self.lens = torch.full((seqs,), context, device="cuda", dtype=torch.int32)
            self.flops = 4 * seqs * new * (context - new / 2) * h * d
        self.out = torch.empty_like(self.q)

    def ours(self, config: dict | None):
        from atom_kernels.attention import launch_attention

        scale = self.dim**-0.5
        if self.kind == "prefill":
            return lambda: launch_attention(
                self.q, self.k, self.v, self.out, self.cu, scale, True, None, None,
                kv_start=self.cu, head_dim=self.dim, config=config,
            )
        return lambda: launch_attention(
            self.q, self.k, self.v, self.out, self.cu, scale, True, None, None,
            seq_lens=self.lens, block_table=self.table, head_dim=self.dim, config=config,
        )

    def fa3(self):
        from vllm.vllm_flash_attn import flash_attn_varlen_func as fa

        scale = self.dim**-0.5
        if self.kind == "prefill":
            return lambda: fa(
                self.q, self.k, self.v, self.max_len, self.cu, self.max_len,
                cu_seqlens_k=self.cu, softmax_scale=scale, causal=True, fa_version=3,
            )
        return lambda: fa(
            self.q, self.k, self.v, EXTEND[1], self.cu, EXTEND[2], seqused_k=self.lens,
            block_table=self.table, softmax_scale=scale, causal=True, fa_version=3,
        )


def cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor(
        [0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32
    )


# --- timing ---


def graph_us(fn, target_us: float = 2000.0, reps: int = 5) -> float:
    """Median microseconds per call, from CUDA-graph replays of enough calls to fill ``target_us``."""
    fn()
    torch.cuda.synchronize()
    start, end = (
        torch.cuda.Event(enable_timing=True),
        torch.cuda.Event(enable_timing=True),
    )
    start.record()
    fn()
    end.record()
    end.synchronize()
    iters = max(1, min(50, int(target_us / max(1.0, start.elapsed_time(end) * 1e3))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / iters)
    del graph
    return statistics.median(times)


def try_us(fn) -> float | None:
    try:
        return graph_us(fn)
    except Exception as error:  # noqa: BLE001  (a candidate that does not fit this GPU is skipped)
        if "OutOfResources" not in type(error).__name__ and "out of resource" not in str(error):
            print(f"    candidate failed: {type(error).__name__}: {error_cause(error)}")
        return None


# --- precompile in parallel ---


def compile_jobs(ops: list[str]) -> list[tuple]:
    jobs = []
    for op in ops:
        if op not in MOE_OPS:
            continue
        models, _, weight_dtype = MOE_OPS[op]
        for model, dims in models.items():
            for block_m in (16, 32, 64, 128):
                for gated in (True, False):
                    tiles = moe_tiles(block_m, gated, weight_dtype)
                    if block_m == 16:
                        tiles += moe_split_tiles(gated, weight_dtype)
                    if (gated and block_m >= PLAIN_MIN_BLOCK_M and model not in NOT_SILU_MODELS
                            and weight_dtype != MXFP4):
                        tiles += plain_tiles(block_m, weight_dtype)
                    jobs += [("moe", dims, weight_dtype, block_m, gated, t) for t in tiles]
                    if block_m == 16 and weight_dtype == MXFP4:
                        jobs += [("moe", dims, weight_dtype, GEMV, gated, t) for t in moe_gemv_tiles()]
    if "attention" in ops:
        for model, (h, kv, _) in ATTENTION_MODELS.items():
            for kind in ("prefill", "extend"):
                jobs += [
                    ("attention", model, kind, c) for c in attention_candidates(h // kv)
                ]
    return jobs


_worker_inputs: dict = {}


def error_cause(error: Exception) -> str:
    """The end of an error's message, where a Triton CompilationError names its cause (its start
    quotes the kernel's source)."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return " | ".join(lines[-3:])[:400]


def compile_one(job: tuple) -> None:
    """Run one candidate once at a small size to fill the cache. Sizes are not specialized, nor is
    the expert count: a MoE runs with top_k experts (16 workers with DeepSeek-V3's would not fit)."""
    try:
        if job[0] == "moe":
            _, (_, top_k, hidden, inter), weight_dtype, block_m, gated, tiles = job
            key = (top_k, hidden, inter, weight_dtype)
            if key not in _worker_inputs:
                _worker_inputs[key] = MoeShape((top_k, top_k, hidden, inter), 4, weight_dtype)
            _worker_inputs[key].gemm(block_m, gated, tiles)()
        else:
            _, model, kind, config = job
            key = (model, kind)
            if key not in _worker_inputs:
                _worker_inputs[key] = AttentionShape(model, kind)
            _worker_inputs[key].ours(config)()
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001  (the candidate is skipped again when it is timed)
        print(f"    compile failed: {job[:3]} {job[-1]}: {type(error).__name__}: {error_cause(error)}", flush=True)


def precompile(ops: list[str], jobs: int) -> None:
    todo = compile_jobs(ops)
    began = time.time()
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        pool.map(compile_one, todo, chunksize=4)
    print(
        f"compiled {len(todo)} candidates in {time.time() - began:.0f} s with {jobs} processes"
    )


# --- tuning ---


def tune_moe(report: dict, op: str) -> dict:
    from atom_kernels.moe import moe_shape_key

    models, token_counts, weight_dtype = MOE_OPS[op]
    table = {}
    for model, dims in models.items():
        experts, top_k, hidden, inter = dims
        key = moe_shape_key(experts, hidden, inter, top_k, weight_dtype)
        table[key] = {}
        for num_tokens in token_counts:
            shape = MoeShape(dims, num_tokens, weight_dtype)
            best = {}  # the tiled path's best (key "tiled") and the matrix-vector path's
            plain = model not in NOT_SILU_MODELS
            for block_m, gemm_tiles in moe_candidates(num_tokens, experts, top_k, weight_dtype, plain).items():
                firsts, picks = {}, {}
                for name, gated in (("gate_up", True), ("down", False)):
                    timed = [(us, t) for t in gemm_tiles[name]
                             if (us := try_us(shape.gemm(block_m, gated, t))) is not None]
                    firsts[name] = min(timed, key=lambda p: p[0])
                    picks[name] = regrouped(shape, block_m, gated, firsts[name])
                total = picks["gate_up"][0] + picks["down"][0]
                path = GEMV if block_m == GEMV else "tiled"
                if path not in best or total < best[path][0]:
                    best[path] = (total, block_m, picks, firsts)
            configs = {path: moe_entry(block_m, picks) for path, (_, block_m, picks, _) in best.items()}
            # The paths differ outside their GEMMs (the tiled one sorts the entries, and reduces split-K
            # partials): between them the whole op decides.
            path = "tiled"
            if len(configs) > 1:
                whole_op = {p: shape.whole_op_us(config) for p, config in configs.items()}
                path = min(whole_op, key=whole_op.get)
                print(f"{op} {model} tokens={num_tokens}: whole op {whole_op}")
            total, block_m, picks, firsts = best[path]
            if picks != firsts:
                # The GROUP_M retries won GEMM by GEMM: the whole op decides.
                ungrouped = moe_entry(block_m, firsts)
                whole_op = {"regrouped": shape.whole_op_us(configs[path]), "ungrouped": shape.whole_op_us(ungrouped)}
                print(f"{op} {model} tokens={num_tokens}: GROUP_M retries, whole op {whole_op}")
                if whole_op["ungrouped"] < whole_op["regrouped"]:
                    configs[path], picks = ungrouped, firsts
                    total = picks["gate_up"][0] + picks["down"][0]
            table[key][str(num_tokens)] = configs[path]
            print(
                f"{op} {model} tokens={num_tokens}: "
                f"{'GEMV' if block_m == GEMV else f'BLOCK_M={block_m}'} gemms {total:.1f} us"
            )
            report["moe_gemms"].append({"op": op, "model": model, "tokens": num_tokens, "gemms_us": total,
                                        **table[key][str(num_tokens)]})
            del shape
    return table


def moe_entry(block_m: int | str, picks: dict) -> dict:
    """A table entry: the row block (or GEMV) and each GEMM's tiles."""
    return {**({"GEMV": True} if block_m == GEMV else {"BLOCK_M": block_m}),
            "gate_up": picks["gate_up"][1], "down": picks["down"][1]}


def regrouped(shape: MoeShape, block_m: int | str, gated: bool, best: tuple[float, dict]) -> tuple[float, dict]:
    """``best`` (us, tiles) of one GEMM, or its tiles at another GROUP_M_RETRIES value that ran faster
    (compiled here: three kernels, not three per candidate in :func:`precompile`)."""
    if block_m == GEMV or block_m < GROUP_M_MIN_BLOCK_M:
        return best
    for group_m in GROUP_M_RETRIES:
        tiles = {**best[1], "GROUP_M": group_m}
        if (us := try_us(shape.gemm(block_m, gated, tiles))) is not None and us < best[0]:
            best = (us, tiles)
    return best


def tune_attention(report: dict) -> dict:
    from atom_kernels.attention import attention_shape_key

    table = {}
    for model, (heads, kv, dim) in ATTENTION_MODELS.items():
        for kind in ("prefill", "extend"):
            shape = AttentionShape(model, kind)
            timed = [(us, c) for c in attention_candidates(heads // kv) if (us := try_us(shape.ours(c))) is not None]
            us, config = min(timed, key=lambda p: p[0])
            print(f"attention {model} {kind}: {config} {us:.1f} us")
            if kind == "extend":
                # Reported, not written: tiles picked on long extends alone slow down launches that
                # hold short queries (atom_kernels/tuned/README.md), so extend keeps the built-in ones.
                report.setdefault("extend_picks", []).append({"model": model, "us": us, **config})
                continue
            table[attention_shape_key(False, dim, 0, heads // kv, BF16)] = {"0": config}
    return table


def comparison_row(
    times: dict, theirs_us: float | None, theirs: str, max_rel_diff: float | None, **fields
) -> dict:
    """One report row: built-in and tuned tiles against the reference kernel ``theirs`` (its time,
    ratios and difference None where it did not run)."""
    return {
        **fields,
        "default_us": times["default"],
        "packaged_us": times["packaged"],
        "tuned_us": times["tuned"],
        f"{theirs}_us": theirs_us,
        "ratio_default": None if theirs_us is None else times["default"] / theirs_us,
        "ratio_tuned": None if theirs_us is None else times["tuned"] / theirs_us,
        f"max_rel_diff_vs_{theirs}": max_rel_diff,
    }


def print_row(label: str, row: dict, theirs: str) -> None:
    line = f"{label}: default {row['default_us']:8.1f} packaged {row['packaged_us']:8.1f} tuned {row['tuned_us']:8.1f} "
    if row[f"{theirs}_us"] is None:
        line += f"{theirs} unavailable ({row[f'{theirs}_unavailable']})"
    else:
        line += (
            f"{theirs} {row[theirs + '_us']:8.1f} us  ratio {row['ratio_default']:.2f} -> "
            f"{row['ratio_tuned']:.2f}  diff {row['max_rel_diff_vs_' + theirs]:.1e}"
        )
    if "max_rel_diff_vs_reference" in row:
        line += f"  reference diff {row['max_rel_diff_vs_reference']:.1e}"
    print(line)


def vllm_fused_experts(s: MoeShape) -> tuple[float | None, torch.Tensor | None, str | None]:
    """vLLM's Triton fused MoE on ``s`` (its block-FP8 W8A8 path for FP8 weights, as vLLM 0.26.0 takes
    it: a quant_config; MXFP4 weights dequantized to bf16): (us, output, None), or (None, None, why)
    where it does not run."""
    try:
        from vllm.model_executor.layers.fused_moe import fused_experts
        from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config

        from atom_kernels.mxfp4 import dequantize_mxfp4

        quant_config, w13, w2 = None, s.w13, s.w2
        if s.mxfp4:
            w13, w2 = dequantize_mxfp4(w13, s.w13_scale, BF16), dequantize_mxfp4(w2, s.w2_scale, BF16)
        elif s.block_size:
            quant_config = fp8_w8a8_moe_quant_config(
                w1_scale=s.w13_scale, w2_scale=s.w2_scale, block_shape=[s.block_size] * 2
            )

        def run() -> torch.Tensor:
            return fused_experts(s.x, w13, w2, s.weights, s.ids, quant_config=quant_config)

        out = run()  # a failure here leaves no CUDA graph capture open
        return graph_us(run), out, None
    except Exception as error:  # noqa: BLE001  (the report says why, and the other rows go on)
        return None, None, f"{type(error).__name__}: {str(error)[:200]}"


def vllm_config_context() -> contextlib.AbstractContextManager:
    """vLLM's kernels read its current config; without vLLM (SGLang's environment) the comparisons
    run without their vLLM rows (``vllm_unavailable``)."""
    try:
        from vllm.config import VllmConfig, set_current_vllm_config
    except ImportError:
        return contextlib.nullcontext()
    return set_current_vllm_config(VllmConfig())


def compare_ops(report: dict, ops: list[str]) -> None:
    """The whole ops with the built-in defaults, the packaged tables, the new tables, and vLLM's kernel."""
    import atom_kernels as ak
    from atom_kernels import tuned

    packaged = tuned.PACKAGED_DIR

    def both(fn) -> dict:
        """Times and outputs of ``fn`` with no tables (the built-in defaults), the packaged ones, DIR's."""
        times = {}
        for label in ("default", "packaged", "tuned"):
            tuned.PACKAGED_DIR = Path("/nonexistent") if label == "default" else packaged
            os.environ["ATOM_TUNED_CONFIG_DIR"] = report["out_dir"] if label == "tuned" else ""
            tuned.clear_cache()
            times[label] = graph_us(fn)
            times[f"{label}_out"] = fn().clone()
        return times

    def rel(a, b) -> float:
        return (
            (a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6)
        ).item()

    for op in ops:
        if op not in MOE_OPS:
            continue
        models, token_counts, weight_dtype = MOE_OPS[op]
        for model, dims in models.items():
            for num_tokens in token_counts:
                s = MoeShape(dims, num_tokens, weight_dtype)
                args, quant = (s.x, s.w13, s.w2, s.weights, s.ids), s.quant_args()
                times = both(lambda a=args, q=quant: ak.fused_moe(*a, **q))
                reference = ak.fused_moe.impl("torch")(*args, **quant)
                theirs, theirs_out, unavailable = vllm_fused_experts(s)
                row = comparison_row(
                    times, theirs, "vllm",
                    None if theirs_out is None else rel(times["tuned_out"], theirs_out),
                    op=op, model=model, tokens=num_tokens,
                    max_rel_diff_vs_reference=rel(times["tuned_out"], reference),
                )
                if unavailable:
                    row["vllm_unavailable"] = unavailable
                report["fused_moe"].append(row)
                print_row(f"{op} {model} {num_tokens:6d}", row, "vllm")
    if "attention" in ops:
        for model in ATTENTION_MODELS:
            for kind in ("prefill", "extend"):
                s = AttentionShape(model, kind)
                times = both(lambda s=s: s.ours(None)())
                theirs = graph_us(s.fa3())
                row = comparison_row(times, theirs, "fa3", rel(times["tuned_out"], s.fa3()()),
                                     model=model, kind=kind)
                row["tuned_tflops"] = s.flops / times["tuned"] / 1e6
                report["attention"].append(row)
                print_row(f"attention {model} {kind}", row, "fa3")


# A new MoE entry whose whole op ran more than this many times slower than with the packaged table's
# keeps the packaged entry: the tuner picks by the two GEMMs' sum, the whole op decides what ships.
KEEP_PACKAGED_ABOVE = 1.02


def keep_packaged_where_slower(report: dict) -> None:
    """Puts the packaged entries back into DIR's fused_moe.json where :func:`compare_ops` timed the
    whole op slower with the new ones (marked ``kept_packaged`` in the report); a size the packaged
    table lacks is dropped, so its token counts keep the packaged entry they looked up."""
    from atom_kernels import tuned
    from atom_kernels.moe import moe_shape_key

    path = Path(report["out_dir"]) / "fused_moe.json"
    source = tuned.PACKAGED_DIR / path.name
    if not path.exists() or not source.exists():
        return
    packaged = json.loads(source.read_text()).get(report["device"], {})
    table = json.loads(path.read_text())
    for row in report["fused_moe"]:
        models, _, weight_dtype = MOE_OPS[row["op"]]
        experts, top_k, hidden, inter = models[row["model"]]
        key, size = moe_shape_key(experts, hidden, inter, top_k, weight_dtype), str(row["tokens"])
        if row["tuned_us"] <= KEEP_PACKAGED_ABOVE * row["packaged_us"]:
            continue
        old = packaged.get(key, {}).get(size)
        if old is None:
            del table[report["device"]][key][size]
        else:
            table[report["device"]][key][size] = old
        row["kept_packaged"] = True
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


def write_table(path: Path, device: str, entries: dict) -> None:
    """Add ``entries`` (shape key: sizes) to ``path``'s table for ``device``, keeping its other shapes,
    sizes and GPUs. A new file starts from the packaged table: copied into the package, it drops nothing."""
    from atom_kernels import tuned

    source = path if path.exists() else tuned.PACKAGED_DIR / path.name
    table = json.loads(source.read_text()) if source.exists() else {}
    for key, sizes in entries.items():
        table.setdefault(device, {}).setdefault(key, {}).update(sizes)
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


def print_plan(ops: list[str]) -> None:
    """What a run of ``ops`` times and compiles (for --dry-run: no GPU needed)."""
    from atom_kernels.moe import moe_shape_key

    for op in ops:
        if op not in MOE_OPS:
            continue
        models, token_counts, weight_dtype = MOE_OPS[op]
        for model, (experts, top_k, hidden, inter) in models.items():
            timings = {}
            for n in token_counts:
                candidates = moe_candidates(n, experts, top_k, weight_dtype, model not in NOT_SILU_MODELS)
                timings[n] = sum(len(t) for gemms in candidates.values() for t in gemms.values())
            regroupings = sum(2 * len(GROUP_M_RETRIES) for n in token_counts
                              for m in moe_block_ms(n, experts, top_k) if m >= GROUP_M_MIN_BLOCK_M)
            print(
                f"{op} {model} [{moe_shape_key(experts, hidden, inter, top_k, weight_dtype)}]: "
                f"{sum(timings.values())} timings; by token count {timings}; "
                f"{regroupings} GROUP_M retries of the best tiles"
            )
    if "attention" in ops:
        for model, (heads, kv, _) in ATTENTION_MODELS.items():
            print(f"attention {model}: {2 * len(attention_candidates(heads // kv))} timings")
    print(f"{len(compile_jobs(ops))} candidates to compile")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--models", help="tune the MoE ops for these models only (comma-separated)")
    parser.add_argument("--tokens", help="tune the MoE ops at these token counts only (comma-separated)")
    parser.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would be timed and compiled, and exit"
    )
    args = parser.parse_args()
    ops = args.ops.split(",")
    if unknown := set(ops) - set(OPS):
        parser.error(f"unknown ops {sorted(unknown)}; known: {','.join(OPS)}")
    if args.models:
        wanted = set(args.models.split(","))
        for op, (models, token_counts, weight_dtype) in MOE_OPS.items():
            MOE_OPS[op] = ({m: d for m, d in models.items() if m in wanted}, token_counts, weight_dtype)
    if args.tokens:
        wanted = {int(n) for n in args.tokens.split(",")}
        for op, (models, token_counts, weight_dtype) in MOE_OPS.items():
            MOE_OPS[op] = (models, [n for n in token_counts if n in wanted], weight_dtype)
    if args.dry_run:
        print_plan(ops)
        return
    if args.out_dir is None:
        parser.error("--out-dir is required (except with --dry-run)")
    if not torch.cuda.is_available():
        sys.exit("tune_kernels needs a CUDA GPU")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name()
    report = {
        "device": device,
        "out_dir": str(args.out_dir.resolve()),
        "moe_gemms": [],
        "fused_moe": [],
        "attention": [],
    }
    began = time.time()
    precompile(ops, args.jobs)
    torch.manual_seed(0)
    for op in ops:
        if op in MOE_OPS:
            write_table(args.out_dir / "fused_moe.json", device, tune_moe(report, op))
    if "attention" in ops:
        write_table(args.out_dir / "attention.json", device, tune_attention(report))
    report["tuning_s"] = time.time() - began
    with vllm_config_context():
        compare_ops(report, ops)
    keep_packaged_where_slower(report)
    report["total_s"] = time.time() - began
    (args.out_dir / "tune-report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"done in {report['total_s']:.0f} s")


if __name__ == "__main__":
    main()
