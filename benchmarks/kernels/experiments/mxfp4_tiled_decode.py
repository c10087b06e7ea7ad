"""Where the tiled MXFP4 MoE GEMM loses its bandwidth at 16-256 tokens: decodings compared.

Usage: python3 benchmarks/kernels/experiments/mxfp4_tiled_decode.py OUT.json [--variants=A,B]

One plain MoE GEMM (sorted row blocks of one expert each, out = x @ W[e]^T) at gpt-oss-20b's gate/up
shape (N 5760, K 2880, 32 experts, top 4):

- ``dot_scaled``: packed bytes and e8m0 scales given to ``tl.dot_scaled``, weights on the right;
- ``registers``: the decoding the fused MoE ships (``atom_kernels.mxfp4.e2m1_pairs_to_bf16``),
  weights as the MMA's left operand, fed from registers, one MMA per K step, each step's bytes and
  codes loaded during the step before (as in d9df8fc and dbf212a's fused MoE; ``asm2_swapped``
  in the results: its two-MMA form of 3e901cf; ``asm`` / ``asm_swapped``: two slower decodings, four
  bytes a PTX block; their code is in 3e901cf's version of this file);
- ``registers_tiled16`` / ``registers_tiled64``: the same on weights stored tile-major, a question for
  the load-time layout: each chunk of 16 / 64 rows x 128 values (64 bytes a row) and its scales
  contiguous, so a program's tile of a K step is whole 1 / 4 KiB runs of memory instead of 64-byte
  pieces of rows 1440 bytes apart (K padded to a multiple of 128; BLOCK_K 128);
- ``bf16``: the weights decoded to bf16 in memory (bandwidth and values reference);
- ``atom_gate_up``: the shipped gated GEMM (``launch_moe_gemm``, clamped SwiGLU, this GPU's table);
- ``vllm``: vLLM 0.26's MXFP4 MoE GEMM as vLLM lays out and calls it (OpenAI's ``matmul_ogs``),
  where vLLM is installed; timed only (its rows come out in expert order).

Each: the fastest of a small tile grid (the library rows: their own tiles), CUDA-graph replays; bytes
= packed weights and scales of the experts touched. Routing: uniform top-4, and "concentrated" (all
tokens on 4 experts, as dummy weights route). Outputs are compared with the bf16 GEMM's. Results:
``mxfp4-tiled-decode-h200.json`` (its ``decode_check``: a check of the earlier decodings).
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mxfp4_decode_breakdown import graph_us, mxfp4_blocks  # noqa: E402

from atom_kernels.moe import launch_moe_gemm, moe_config, moe_shape_key  # noqa: E402
from atom_kernels.moe_align import moe_align_block_size_triton  # noqa: E402
from atom_kernels.moe_gemv import launch_mxfp4_gemv  # noqa: E402
from atom_kernels.mxfp4 import (  # noqa: E402
    REGISTER_DECODE_RESCALE,
    dequantize_mxfp4,
    e2m1_pairs_to_bf16,
    e8m0_to_decode_factor,
)

E, TOP_K, N, K = 32, 4, 5760, 2880
BF16 = torch.bfloat16


@triton.jit
def _register_tile(w_ptr, s_ptr, w_base, s_base, chunk_rows, expert, w_stride_e, N, K, k0, steps,
                   VARIANT: tl.constexpr, CHUNK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    """The packed bytes [BLOCK_N, BLOCK_K / 2] and scale codes [BLOCK_N, BLOCK_K / 32] of the K step at
    ``k0``: rows as stored (VARIANT 2, masked past K) or tile-major (3: past K the last step again)."""
    HALF: tl.constexpr = BLOCK_K // 2
    if VARIANT == 2:
        pairs = k0 // 2 + tl.arange(0, HALF)
        groups = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        packed = tl.load(w_base[:, None] + pairs[None, :], mask=(pairs < K // 2)[None, :], other=0)
        codes = tl.load(s_base[:, None] + groups[None, :], mask=(groups < K // 32)[None, :], other=127)
    else:
        rows = chunk_rows + tl.minimum(k0 // 128, steps - 1) * CHUNK_ROWS  # the step's chunk, by row
        packed = tl.load(w_ptr + expert * w_stride_e + rows[:, None] * HALF + tl.arange(0, HALF)[None, :])
        codes = tl.load(s_ptr + expert * N * steps * 4 + rows[:, None] * (BLOCK_K // 32)
                        + tl.arange(0, BLOCK_K // 32)[None, :])
    return packed, codes


@triton.jit
def _moe_gemm(x_ptr, w_ptr, s_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr, num_entries, N, K,
              w_stride_e, w_stride_n, VARIANT: tl.constexpr, CHUNK_ROWS: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[entry] = x[entry // 4] @ W[e]^T for the BLOCK_M sorted entries of this row block (one
    expert e) and BLOCK_N columns. VARIANT: 0 dot_scaled, 1 bf16 weights, 2 registers, 3 registers on
    tile-major weights (CHUNK_ROWS rows a chunk, BLOCK_K 128)."""
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = tl.program_id(0) // num_pid_n
    pid_n = tl.program_id(0) % num_pid_n
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return
    entries = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    row_valid = entries < num_entries
    x_rows = tl.where(row_valid, entries // 4, 0).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_rows = (cols % N).to(tl.int64)
    HALF: tl.constexpr = BLOCK_K // 2
    w_base = w_ptr + expert * w_stride_e + w_rows * w_stride_n
    s_base = s_ptr + expert * N * (K // 32) + w_rows * (K // 32)
    steps = tl.cdiv(K, 128)  # tile-major: K steps of 128 values a chunk
    chunk_rows = (w_rows // CHUNK_ROWS) * steps * CHUNK_ROWS + w_rows % CHUNK_ROWS
    if VARIANT >= 2:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        packed, codes = _register_tile(w_ptr, s_ptr, w_base, s_base, chunk_rows, expert, w_stride_e, N,
                                       K, 0, steps, VARIANT, CHUNK_ROWS, BLOCK_K)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + x_rows[:, None] * K + ks[None, :], mask=(ks < K)[None, :], other=0.0)
        pairs = k0 // 2 + tl.arange(0, HALF)
        pair_ok = pairs < K // 2
        if VARIANT == 0:
            packed = tl.load(w_base[None, :] + pairs[:, None], mask=pair_ok[:, None], other=0)
            groups = k0 // 32 + tl.arange(0, BLOCK_K // 32)
            codes = tl.load(s_base[:, None] + groups[None, :], mask=(groups < K // 32)[None, :],
                            other=0)
            acc = tl.dot_scaled(a, None, "bf16", packed, codes, "e2m1", acc, fast_math=True)
        elif VARIANT == 1:
            w = tl.load(w_base[None, :] + ks[:, None], mask=(ks < K)[:, None], other=0.0)
            acc = tl.dot(a, w, acc)
        else:
            a = tl.reshape(tl.permute(tl.reshape(a, [BLOCK_M, HALF, 2]), [0, 2, 1]), [BLOCK_M, BLOCK_K])
            # The next step's bytes and codes a step ahead (this kernel's loads are not pipelined by
            # the compiler; the fused MoE's codes are loaded so since dbf212a).
            next_packed, next_codes = _register_tile(w_ptr, s_ptr, w_base, s_base, chunk_rows, expert,
                                                     w_stride_e, N, K, k0 + BLOCK_K, steps, VARIANT,
                                                     CHUNK_ROWS, BLOCK_K)
            factors = e8m0_to_decode_factor(codes)
            factors = tl.reshape(tl.broadcast_to(factors[:, :, None], [BLOCK_N, BLOCK_K // 32, 16]),
                                 [BLOCK_N, HALF])
            lo, hi = e2m1_pairs_to_bf16(packed, factors)
            w_tile = tl.reshape(tl.permute(tl.join(lo, hi), [0, 2, 1]), [BLOCK_N, BLOCK_K])
            acc = tl.dot(w_tile, tl.trans(a), acc)
            packed, codes = next_packed, next_codes
    out_rows = entries.to(tl.int64)
    if VARIANT >= 2:
        acc = acc * REGISTER_DECODE_RESCALE
        mask = (cols < N)[:, None] & row_valid[None, :]
        tl.store(out_ptr + out_rows[None, :] * N + cols[:, None], acc.to(tl.bfloat16), mask=mask)
    else:
        mask = row_valid[:, None] & (cols < N)[None, :]
        tl.store(out_ptr + out_rows[:, None] * N + cols[None, :], acc.to(tl.bfloat16), mask=mask)


VARIANTS = {"dot_scaled": 0, "bf16": 1, "registers": 2, "registers_tiled16": 3, "registers_tiled64": 3}
CHUNK_ROWS = {"registers_tiled16": 16, "registers_tiled64": 64}


def tile_major(w: torch.Tensor, s: torch.Tensor, chunk_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed weights [E, N, K / 2] and scales [E, N, K / 32] rearranged into chunks of
    ``chunk_rows`` rows x 128 values, each chunk's bytes (then its scales) contiguous, the chunks of a
    row block in K order: [E, N / chunk_rows, steps, chunk_rows, 64] and [..., 4] (K padded to whole
    steps with zero bytes and scale code 127)."""
    steps = triton.cdiv(K, 128)
    experts, rows = w.shape[:2]
    w = torch.cat([w, w.new_zeros(experts, rows, steps * 64 - w.shape[2])], dim=2)
    s = torch.cat([s, s.new_full((experts, rows, steps * 4 - s.shape[2]), 127)], dim=2)
    split = (experts, rows // chunk_rows, chunk_rows, steps)
    return (w.view(*split, 64).permute(0, 1, 3, 2, 4).contiguous(),
            s.view(*split, 4).permute(0, 1, 3, 2, 4).contiguous())


def run_gemm(variant, x, w, s, out, sorted_ids, block_expert, num_entries, block_m, tiles):
    grid = (block_expert.shape[0] * triton.cdiv(N, tiles["BLOCK_N"]),)
    _moe_gemm[grid](x, w, s, out, sorted_ids, block_expert, num_entries, N, K, w.stride(0),
                    w.stride(1), VARIANT=VARIANTS[variant], CHUNK_ROWS=CHUNK_ROWS.get(variant, 16),
                    BLOCK_M=block_m, **tiles)


def vllm_gemm(x, w, s, ids):
    """vLLM's MXFP4 MoE GEMM on these weights and routing (raises without vLLM)."""
    # vLLM's module first: it makes its bundled copy of OpenAI's kernels importable as triton_kernels.
    from vllm.model_executor.layers.fused_moe.experts.gpt_oss_triton_kernels_moe import (
        make_routing_data,
    )
    from vllm.model_executor.layers.quantization.utils.mxfp4_utils import _swizzle_mxfp4

    ogs = importlib.import_module("triton_kernels.matmul_ogs")
    w_swizzled, flex, s_swizzled = _swizzle_mxfp4(w, s)
    precision = ogs.PrecisionConfig(weight_scale=s_swizzled, flex_ctx=ogs.FlexCtx(rhs_data=flex))
    weights = torch.full(ids.shape, 1.0 / TOP_K, device="cuda")
    routing, gather, _ = make_routing_data(ids.long(), weights, E)
    return lambda: ogs.matmul_ogs(x, w_swizzled, None, routing, gather_indx=gather,
                              precision_config=precision)


def atom_gate_up(x, w, s, ids):
    """The shipped gated MXFP4 GEMM with this GPU's tuned gate/up config (the matrix-vector path where
    that config says so)."""
    config = moe_config(moe_shape_key(E, K, N // 2, TOP_K, torch.uint8), x.shape[0], E, TOP_K, x)
    entries = ids.numel()
    out = torch.empty(entries, N // 2, device="cuda", dtype=BF16)
    swiglu = {"gated": True, "act": 3, "interleaved": True, "alpha": 1.702, "limit": 7.0}
    if config.get("GEMV"):
        return config, lambda: launch_mxfp4_gemv(x, w, s, None, out, ids.reshape(-1), None, TOP_K,
                                                 config["gate_up"], **swiglu)
    block_m = config["BLOCK_M"]
    sorted_ids, block_expert = moe_align_block_size_triton(ids, E, block_m)
    return config, lambda: launch_moe_gemm(
        x, w, None, out, None, sorted_ids, block_expert, entries, TOP_K, block_m, config["gate_up"],
        w_scale=s, mxfp4=True, expert_ids=ids.reshape(-1), **swiglu)


def time_library(case, name, build, gbytes):
    try:
        made = build()
        config, fn = made if isinstance(made, tuple) else (None, made)
        us = graph_us(fn)
        case["variants"][name] = {"best": {"us": round(us, 2), "config": config}}
        print(f"  {name:<12} {us:8.2f} us  {gbytes / (us * 1e-6):7.1f} GB/s (mxfp4 bytes)  {config}",
              flush=True)
    except Exception as error:  # noqa: BLE001
        case["variants"][name] = {"error": f"{type(error).__name__}: {error}"[:500]}
        print(f"  {name:<12} ERROR {case['variants'][name]['error']}", flush=True)


def main(out_path: str, variants: list[str]) -> None:
    torch.manual_seed(0)
    w, s = mxfp4_blocks(E, N, K)
    w_bf = torch.stack([dequantize_mxfp4(w[e], s[e], BF16) for e in range(E)])
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "shape": {"E": E, "N": N, "K": K, "top_k": TOP_K},
              "cases": {}}
    tile_grid = [{"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": nw, "num_stages": ns}
                 for bn in (64, 128) for bk in (128, 256) for nw, ns in ((4, 3), (8, 3), (4, 4))]
    cases = [(16, "uniform"), (64, "uniform"), (16, "concentrated"), (64, "concentrated"),
             (256, "uniform")]
    for tokens, routing in cases:
        x = torch.randn(tokens, K, device="cuda", dtype=BF16)
        if routing == "uniform":
            ids = torch.stack([torch.randperm(E, device="cuda")[:TOP_K] for _ in range(tokens)])
        else:
            ids = torch.arange(TOP_K, device="cuda").repeat(tokens, 1)
        ids = ids.to(torch.int32)
        entries = tokens * TOP_K
        distinct = int(torch.unique(ids).numel())
        rows_per_expert = entries / distinct
        block_m = 16 if rows_per_expert <= 16 else (32 if rows_per_expert <= 32 else 64)
        gbytes = distinct * (N * K // 2 + N * K // 32) / 1e9
        sorted_ids, block_expert = moe_align_block_size_triton(ids, E, block_m)
        ref = torch.zeros(entries, N, device="cuda", dtype=BF16)
        run_gemm("bf16", x, w_bf, s, ref, sorted_ids, block_expert, entries, block_m,
                 {"BLOCK_N": 64, "BLOCK_K": 64})
        key = f"{tokens}-{routing}"
        case = report["cases"][key] = {"distinct_experts": distinct, "BLOCK_M": block_m,
                                       "mxfp4_GB": round(gbytes, 4), "variants": {}}
        print(f"{key}: {distinct} experts, BLOCK_M {block_m}, {gbytes * 1e3:.1f} MB packed",
              flush=True)
        if "atom_gate_up" in variants:
            time_library(case, "atom_gate_up", lambda: atom_gate_up(x, w, s, ids), gbytes)
        if "vllm" in variants:
            time_library(case, "vllm", lambda: vllm_gemm(x, w, s, ids), gbytes)
        for variant in [v for v in VARIANTS if v in variants]:
            weights, scales = (w_bf, s) if variant == "bf16" else (w, s)
            if variant in CHUNK_ROWS:
                weights, scales = tile_major(w, s, CHUNK_ROWS[variant])
            timed = []
            for tiles in [t for t in tile_grid if variant not in CHUNK_ROWS or t["BLOCK_K"] == 128]:
                out = torch.zeros(entries, N, device="cuda", dtype=BF16)
                fn = lambda t=tiles, o=out: run_gemm(variant, x, weights, scales, o,  # noqa: E731
                                                     sorted_ids, block_expert, entries, block_m, t)
                try:
                    fn()
                    torch.cuda.synchronize()
                    err = (out.float() - ref.float()).abs().max().item()
                    timed.append({**tiles, "us": round(graph_us(fn), 2), "max_abs_err": err})
                except Exception as error:  # noqa: BLE001
                    timed.append({**tiles, "error": f"{type(error).__name__}: {error}"[:300]})
            ok = [t for t in timed if "us" in t]
            best = min(ok, key=lambda t: t["us"]) if ok else None
            case["variants"][variant] = {"best": best, "all": timed}
            if best:
                print(f"  {variant:<12} {best['us']:8.2f} us  {gbytes / (best['us'] * 1e-6):7.1f} GB/s"
                      f" (mxfp4 bytes)  err {best['max_abs_err']:.3g}  {best}", flush=True)
            else:
                print(f"  {variant:<12} no tile ran: {timed[0].get('error')}", flush=True)
        with open(out_path, "w") as f:
            json.dump(report, f, separators=(",", ":"))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    chosen = next((a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--variants=")),
                  [*VARIANTS, "atom_gate_up", "vllm"])
    main(args[0] if args else "mxfp4-tiled-decode.json", chosen)
