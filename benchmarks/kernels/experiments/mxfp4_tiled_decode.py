"""Where the tiled MXFP4 MoE GEMM loses its bandwidth at 16-256 tokens: decoding variants compared.

Usage: python3 benchmarks/kernels/experiments/mxfp4_tiled_decode.py OUT.json [--quick] [--variants=A,B]

One plain MoE GEMM (sorted row blocks of one expert each, out = x @ W[e]^T, no activation) at the
gpt-oss-20b gate/up shape (N 5760, K 2880, 32 experts, top 4), written several ways:

- ``dot_scaled``: the packed bytes and e8m0 scales handed to ``tl.dot_scaled`` (what
  ``atom_kernels.moe`` shipped alone before register decoding, and keeps for row blocks of 64),
  weights as the dot's right operand;
- ``asm``: each byte decoded in registers by :func:`decode_e2m1_pairs` (bit moves plus one bf16x2
  multiply by the block scale), the low nibbles meeting A's even columns, the high ones its odd
  columns; weights as the right operand;
- ``asm_swapped``: the same decode, weights as the *left* operand: the output tile is computed
  transposed, so the decoded weights are the MMA's wide side and the tokens its narrow side;
- ``asm2_swapped``: the decoding the fused MoE now ships (``atom_kernels.mxfp4.e2m1_pairs_to_bf16``:
  two bytes an instruction block, the block scales turned into bf16 factors once per 32 values) with
  the weights as the left operand; its decoded tiles feed the MMA straight from registers;
- ``bf16``: the same GEMM on the weights decoded to bf16 in memory (bandwidth and values reference);
- ``atom_gate_up``: the shipped gated GEMM (``atom_kernels.moe.launch_moe_gemm``, GPT-OSS's clamped
  SwiGLU, the tuned tiles of this GPU), same weight bytes, half the output columns;
- ``vllm``: vLLM's MXFP4 MoE GEMM as vLLM 0.26 lays out and calls it (OpenAI's Triton kernels,
  ``matmul_ogs`` on weights swizzled for Hopper), where vLLM is installed; its rows come out in expert
  order, so it is timed only.

For each, the fastest of a small tile grid (the library rows: their own tiles); time by CUDA-graph
replay; bytes = the packed weights and scales of the experts the routing touches. Routing: uniform top-4 draws, and "concentrated" (every
token on the same 4 experts, as vLLM's dummy weights route). Each variant's output is compared with
the bf16 GEMM's before timing.
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

# Per 32-bit register: 4 packed bytes (elements 0-3 of the input) and their 4 scale codes. Out: the
# low nibbles' bf16 values ($0: elements 0-1, $1: 2-3) and the high nibbles' ($2, $3). A nibble's
# sign goes to bit 15 and its 3 magnitude bits to bits 8-6, so the bf16 reads 2 ** -126 times the
# e2m1 value (exactly, the subnormal 0.5 included); one multiply by 2 ** (code - 1) = 2 ** 126 times
# the block scale then gives the decoded value. Codes above 128 do not fit one bf16 factor: their
# remainder 2 ** (code - 128) is a second multiply, taken only where such a code occurs.
_DECODE_ASM = tl.constexpr("""
{
.reg .b32 t0, t1, c0, c1, f0, f1, g0, g1, x, y, k128;
.reg .pred p0, p1;
mov.b32 k128, 0x00800080;
prmt.b32 t0, $4, 0, 0x4140;
prmt.b32 t1, $4, 0, 0x4342;
prmt.b32 c0, $5, 0, 0x4140;
prmt.b32 c1, $5, 0, 0x4342;
min.u16x2 f0, c0, k128;
min.u16x2 f1, c1, k128;
add.u32 f0, f0, 0x007E007E;
add.u32 f1, f1, 0x007E007E;
shl.b32 f0, f0, 7;
shl.b32 f1, f1, 7;
shl.b32 x, t0, 6;
and.b32 x, x, 0x01C001C0;
shl.b32 y, t0, 12;
and.b32 y, y, 0x80008000;
or.b32 x, x, y;
mul.rn.bf16x2 $0, x, f0;
shl.b32 x, t1, 6;
and.b32 x, x, 0x01C001C0;
shl.b32 y, t1, 12;
and.b32 y, y, 0x80008000;
or.b32 x, x, y;
mul.rn.bf16x2 $1, x, f1;
shl.b32 x, t0, 2;
and.b32 x, x, 0x01C001C0;
shl.b32 y, t0, 8;
and.b32 y, y, 0x80008000;
or.b32 x, x, y;
mul.rn.bf16x2 $2, x, f0;
shl.b32 x, t1, 2;
and.b32 x, x, 0x01C001C0;
shl.b32 y, t1, 8;
and.b32 y, y, 0x80008000;
or.b32 x, x, y;
mul.rn.bf16x2 $3, x, f1;
max.u16x2 g0, c0, k128;
max.u16x2 g1, c1, k128;
setp.ne.u32 p0, g0, k128;
setp.ne.u32 p1, g1, k128;
sub.u32 g0, g0, 0x00010001;
sub.u32 g1, g1, 0x00010001;
shl.b32 g0, g0, 7;
shl.b32 g1, g1, 7;
@p0 mul.rn.bf16x2 $0, $0, g0;
@p0 mul.rn.bf16x2 $2, $2, g0;
@p1 mul.rn.bf16x2 $1, $1, g1;
@p1 mul.rn.bf16x2 $3, $3, g1;
}
""")


@triton.jit
def decode_e2m1_pairs(packed, codes):
    """bf16 (low, high): the values of the low and the high nibble of each uint8 in ``packed``, times
    ``2 ** (codes - 127)`` (``codes``: uint8 e8m0, the shape of ``packed``)."""
    return tl.inline_asm_elementwise(_DECODE_ASM, "=r,=r,=r,=r,r,r", [packed, codes],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def _decode_kernel(w_ptr, s_ptr, lo_ptr, hi_ptr, n_bytes, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_bytes
    packed = tl.load(w_ptr + offs, mask=mask, other=0)
    codes = tl.load(s_ptr + offs // 16, mask=mask, other=127)
    lo, hi = decode_e2m1_pairs(packed, codes)
    tl.store(lo_ptr + offs, lo, mask=mask)
    tl.store(hi_ptr + offs, hi, mask=mask)


@triton.jit
def _moe_gemm(x_ptr, w_ptr, s_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr, num_entries, N, K,
              w_stride_e, w_stride_n, VARIANT: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """out[entry] = x[entry // 4] @ W[e]^T for the BLOCK_M sorted entries of this row block (one
    expert e) and BLOCK_N columns. VARIANT: 0 dot_scaled, 1 asm, 2 asm_swapped, 3 bf16 weights,
    4 asm2_swapped."""
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
    # The strides as arguments: the launch specializes them as multiples of 16, which lets the packed
    # weight loads be 16-byte copies.
    w_base = w_ptr + expert * w_stride_e + w_rows * w_stride_n
    s_base = s_ptr + expert * N * (K // 32) + w_rows * (K // 32)
    if VARIANT == 2 or VARIANT == 4:
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + x_rows[:, None] * K + ks[None, :], mask=(ks < K)[None, :], other=0.0)
        # Whole runs of HALF bytes from a multiple of HALF: the weight copies can be 16 bytes wide.
        pairs = tl.max_contiguous(tl.multiple_of(k0 // 2 + tl.arange(0, HALF), HALF), HALF)
        pair_ok = pairs < K // 2
        if EVEN_K:  # no mask on the weights: a mask limits the copies to its constancy
            pair_ok = tl.full([HALF], True, tl.int1)
        if VARIANT == 0:
            packed = tl.load(w_base[None, :] + pairs[:, None], mask=pair_ok[:, None], other=0)
            groups = k0 // 32 + tl.arange(0, BLOCK_K // 32)
            codes = tl.load(s_base[:, None] + groups[None, :], mask=(groups < K // 32)[None, :],
                            other=0)
            acc = tl.dot_scaled(a, None, "bf16", packed, codes, "e2m1", acc, fast_math=True)
        elif VARIANT == 3:
            w = tl.load(w_base[None, :] + ks[:, None], mask=(ks < K)[:, None], other=0.0)
            acc = tl.dot(a, w, acc)
        else:
            a_even, a_odd = tl.split(tl.reshape(a, [BLOCK_M, HALF, 2]))
            if VARIANT == 1:
                packed = tl.load(w_base[None, :] + pairs[:, None], mask=pair_ok[:, None], other=0)
                codes = tl.load(s_base[None, :] + (pairs // 16)[:, None], mask=pair_ok[:, None],
                                other=127)
                lo, hi = decode_e2m1_pairs(packed, codes)
                acc = tl.dot(a_even, lo, acc)
                acc = tl.dot(a_odd, hi, acc)
            elif VARIANT == 4:
                packed = tl.load(w_base[:, None] + pairs[None, :], mask=pair_ok[None, :], other=0)
                groups = k0 // 32 + tl.arange(0, BLOCK_K // 32)
                codes = tl.load(s_base[:, None] + groups[None, :], mask=(groups < K // 32)[None, :],
                                other=127)
                factors = e8m0_to_decode_factor(codes)
                factors = tl.reshape(tl.broadcast_to(factors[:, :, None], [BLOCK_N, BLOCK_K // 32, 16]),
                                     [BLOCK_N, HALF])
                lo, hi = e2m1_pairs_to_bf16(packed, factors)
                acc = tl.dot(lo, tl.trans(a_even), acc)
                acc = tl.dot(hi, tl.trans(a_odd), acc)
            else:
                packed = tl.load(w_base[:, None] + pairs[None, :], mask=pair_ok[None, :], other=0)
                codes = tl.load(s_base[:, None] + (pairs // 16)[None, :], mask=pair_ok[None, :],
                                other=127)
                lo, hi = decode_e2m1_pairs(packed, codes)
                acc = tl.dot(lo, tl.trans(a_even), acc)
                acc = tl.dot(hi, tl.trans(a_odd), acc)
    if VARIANT == 4:
        acc = acc * REGISTER_DECODE_RESCALE
    out_rows = entries.to(tl.int64)
    if VARIANT == 2 or VARIANT == 4:
        mask = (cols < N)[:, None] & row_valid[None, :]
        tl.store(out_ptr + out_rows[None, :] * N + cols[:, None], acc.to(tl.bfloat16), mask=mask)
    else:
        mask = row_valid[:, None] & (cols < N)[None, :]
        tl.store(out_ptr + out_rows[:, None] * N + cols[None, :], acc.to(tl.bfloat16), mask=mask)


VARIANTS = {"dot_scaled": 0, "asm": 1, "asm_swapped": 2, "bf16": 3, "asm2_swapped": 4}


def run_gemm(variant, x, w, s, out, sorted_ids, block_expert, num_entries, block_m, tiles):
    grid = (block_expert.shape[0] * triton.cdiv(N, tiles["BLOCK_N"]),)
    _moe_gemm[grid](x, w, s, out, sorted_ids, block_expert, num_entries, N, K, w.stride(0),
                    w.stride(1), VARIANT=VARIANTS[variant], BLOCK_M=block_m,
                    EVEN_K=K % tiles["BLOCK_K"] == 0, **tiles)


def vllm_gemm(x, w, s, ids):
    """A call of vLLM's MXFP4 MoE GEMM on these weights and routing (raises where vLLM or OpenAI's
    Triton kernels are missing)."""
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


def check_decode(w, s) -> dict:
    """The asm decode against dequantize_mxfp4 on one expert's rows (and on scale codes > 128)."""
    rows = w[0, :64].contiguous()
    scales = s[0, :64].clone()
    scales[:, ::7] = 140  # a few blocks with codes above 128: the second multiply's path
    scales[:, 1::7] = 20
    n_bytes = rows.numel()
    lo = torch.empty(n_bytes, dtype=BF16, device="cuda")
    hi = torch.empty_like(lo)
    _decode_kernel[(triton.cdiv(n_bytes, 1024),)](rows, scales, lo, hi, n_bytes, BLOCK=1024)
    ref = dequantize_mxfp4(rows, scales, torch.float32).reshape(-1, 2)
    got = torch.stack([lo.float(), hi.float()], dim=-1)
    bad = (got != ref) & ~(torch.isnan(got) & torch.isnan(ref))
    return {"mismatches": int(bad.sum()), "of": ref.numel()}


def main(out_path: str, quick: bool, variants: list[str]) -> None:
    torch.manual_seed(0)
    w, s = mxfp4_blocks(E, N, K)
    w_bf = torch.stack([dequantize_mxfp4(w[e], s[e], BF16) for e in range(E)])
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "shape": {"E": E, "N": N, "K": K, "top_k": TOP_K},
              "decode_check": check_decode(w, s), "cases": {}}
    print(json.dumps(report["decode_check"]), flush=True)
    tile_grid = [{"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": nw, "num_stages": ns}
                 for bn in (64, 128) for bk in (128, 256) for nw, ns in ((4, 3), (8, 3), (4, 4))]
    if quick:
        tile_grid = tile_grid[:2]
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
            weights = w_bf if variant == "bf16" else w
            timed = []
            for tiles in tile_grid:
                out = torch.zeros(entries, N, device="cuda", dtype=BF16)
                fn = lambda t=tiles, o=out: run_gemm(variant, x, weights, s, o, sorted_ids,  # noqa: E731
                                                     block_expert, entries, block_m, t)
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
            json.dump(report, f, indent=1)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    chosen = next((a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--variants=")),
                  [*VARIANTS, "atom_gate_up", "vllm"])
    main(args[0] if args else "mxfp4-tiled-decode.json", "--quick" in sys.argv, chosen)
