"""Time breakdown of ATOM's fused MoE with MXFP4 experts at the gpt-oss-20b shape, few tokens.

Usage: python3 benchmarks/kernels/experiments/mxfp4_decode_breakdown.py OUT.json
(atom_kernels importable; ATOM_TUNED_CONFIG_DIR optional, as for the tuned tables.)
Each time: one call captured in a CUDA graph (after 2 eager calls), replayed REPLAYS times between
two events; the median microseconds per call over REPS repetitions.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import traceback

import torch
import triton

from atom_kernels.moe import fused_moe, launch_moe_gemm, moe_config, moe_shape_key, run_fused_moe
from atom_kernels.moe_align import moe_align_block_size_triton
from atom_kernels.moe_gemv import launch_mxfp4_gemv
from atom_kernels.moe_reduce import sum_expert_rows
from atom_kernels.mxfp4 import dequantize_mxfp4

E, TOP_K, D, INTER = 32, 4, 2880, 2880
ACT, ALPHA, LIMIT = 3, 1.702, 7.0  # clamped_swiglu
TOKENS = (1, 2, 4)
REPLAYS, REPS = 200, 5
BF16 = torch.bfloat16
GEMV_TILES = [{"BLOCK_N": n, "BLOCK_K": k, "num_warps": w}
              for n in (8, 16, 32, 64) for k in (128, 256, 512) for w in (2, 4, 8)
              if n * k <= 128 * 32 * w]


def graph_us(fn) -> float:
    fn()
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPS):
        start.record()
        for _ in range(REPLAYS):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / REPLAYS)
    del graph
    return statistics.median(times)


def measure(label: str, fn, gbytes: float | None = None, quiet: bool = False) -> dict:
    """{"us": median, "GB/s": ...} or {"error": ...}; never raises."""
    try:
        us = graph_us(fn)
        row = {"us": round(us, 3)}
        if gbytes:
            row["GB/s"] = round(gbytes / (us * 1e-6), 1)
        if not quiet:
            print(f"  {label:<34} {us:9.2f} us" + (f"  {row['GB/s']:8.1f} GB/s" if gbytes else ""),
                  flush=True)
        return row
    except Exception as error:  # noqa: BLE001
        msg = f"{type(error).__name__}: {error}".splitlines()[0][:500]
        if not quiet:
            print(f"  {label:<34} ERROR {msg}", flush=True)
        return {"error": msg, "trace": traceback.format_exc()[-2000:]}


def mxfp4_blocks(experts: int, rows: int, cols: int):
    blocks = torch.randint(0, 256, (experts, rows, cols // 2), dtype=torch.uint8, device="cuda")
    center = 127 - round(math.log2(2 * cols**0.5))
    scales = torch.randint(center - 1, center + 2, (experts, rows, cols // 32), dtype=torch.uint8,
                           device="cuda")
    return blocks, scales


def main(out_path: str) -> None:
    torch.manual_seed(0)
    w13, w13_scale = mxfp4_blocks(E, 2 * INTER, D)
    w2, w2_scale = mxfp4_blocks(E, D, INTER)
    w13_bias = (torch.randn(E, 2 * INTER, device="cuda") * 0.1).to(BF16)
    w2_bias = (torch.randn(E, D, device="cuda") * 0.1).to(BF16)
    mx = {"w13_scale": w13_scale, "w2_scale": w2_scale, "weight_format": "mxfp4"}
    biases = {"w13_bias": w13_bias, "w2_bias": w2_bias}
    gemm_opts = {"act": ACT, "interleaved": True, "alpha": ALPHA, "limit": LIMIT}
    # Bytes per expert: packed weights + e8m0 scales (+ bias).
    w13_bytes = 2 * INTER * D // 2 + 2 * INTER * D // 32 + 2 * INTER * 2
    w2_bytes = D * INTER // 2 + D * INTER // 32 + D * 2
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "triton": triton.__version__, "tuned_dir": os.environ.get("ATOM_TUNED_CONFIG_DIR"),
              "shape": {"E": E, "top_k": TOP_K, "D": D, "I": INTER}, "replays": REPLAYS, "reps": REPS,
              "gemv_candidates": len(GEMV_TILES), "tokens": {}}
    try:  # bf16 reference weights, one expert at a time (the decode's temporaries are large)
        w13_bf = torch.stack([dequantize_mxfp4(w13[e], w13_scale[e], BF16) for e in range(E)])
        w2_bf = torch.stack([dequantize_mxfp4(w2[e], w2_scale[e], BF16) for e in range(E)])
    except Exception as error:  # noqa: BLE001
        w13_bf = w2_bf = None
        report["bf16_dequant_error"] = f"{type(error).__name__}: {error}"
    print(f"{report['device']}  tuned_dir={report['tuned_dir']}  gemv candidates={len(GEMV_TILES)}")
    for T in TOKENS:
        r = report["tokens"][str(T)] = {}
        x = torch.randn(T, D, device="cuda", dtype=BF16)
        ids = torch.stack([torch.randperm(E, device="cuda")[:TOP_K] for _ in range(T)]).to(torch.int32)
        weights = torch.randn(T, TOP_K, device="cuda").softmax(-1)
        flat_ids, flat_w = ids.reshape(-1), weights.reshape(-1).contiguous()
        entries = T * TOP_K
        distinct = int(torch.unique(ids).numel())
        g13, g2 = distinct * w13_bytes / 1e9, distinct * w2_bytes / 1e9
        r["bytes"] = {"distinct_experts": distinct, "w13": distinct * w13_bytes,
                      "w2": distinct * w2_bytes, "total": distinct * (w13_bytes + w2_bytes)}
        print(f"tokens={T}: {distinct} distinct experts, {(g13 + g2) * 1e3:.2f} MB of MXFP4 weights")
        triton_moe = fused_moe.impl("triton")
        r["whole_op"] = measure("a) fused_moe triton (tuned)", lambda: triton_moe(
            x, w13, w2, weights, ids, activation="clamped_swiglu", interleaved=True, **biases, **mx),
            g13 + g2)
        try:
            cfg = moe_config(moe_shape_key(E, D, INTER, TOP_K, torch.uint8), T, E, TOP_K, x)
        except Exception as error:  # noqa: BLE001
            cfg = {"error": f"{type(error).__name__}: {error}"}
        r["config"] = cfg
        print(f"  b) config {json.dumps(cfg, sort_keys=True)}")
        hs = torch.randn(entries, INTER, device="cuda", dtype=BF16)
        if "BLOCK_M" in cfg:
            bm = cfg["BLOCK_M"]
            split = cfg["down"].get("SPLIT_K", 1)
            parts = r["parts"] = {}
            parts["align"] = measure(f"c) moe_align BLOCK_M={bm}",
                                     lambda: moe_align_block_size_triton(ids, E, bm))
            try:
                sorted_ids, block_expert = moe_align_block_size_triton(ids, E, bm)
                expert_out = torch.empty(entries * split, D, device="cuda",
                                         dtype=torch.float32 if split > 1 else BF16)
                parts["gate_up"] = measure("c) gate_up launch_moe_gemm", lambda: launch_moe_gemm(
                    x, w13, w13_bias, hs, None, sorted_ids, block_expert, entries, TOP_K, bm,
                    cfg["gate_up"], gated=True, w_scale=w13_scale, mxfp4=True, expert_ids=flat_ids,
                    **gemm_opts), g13)
                parts["down"] = measure("c) down launch_moe_gemm", lambda: launch_moe_gemm(
                    hs, w2, w2_bias, expert_out, flat_w, sorted_ids, block_expert, entries, 1, bm,
                    cfg["down"], w_scale=w2_scale, mxfp4=True), g2)
                parts["sum_rows"] = measure("c) sum_expert_rows", lambda: sum_expert_rows(
                    expert_out, T, TOP_K * split, BF16))
                us = [parts[k].get("us") for k in ("align", "gate_up", "down", "sum_rows")]
                if None not in us:
                    parts["sum_of_parts_us"] = round(sum(us), 3)
                    print(f"  c) sum of parts {sum(us):9.2f} us")
            except Exception as error:  # noqa: BLE001
                parts["error"] = f"{type(error).__name__}: {error}"
                print(f"  c) ERROR {parts['error']}")
        # d) the matrix-vector path: each GEMM's best tiles, then the whole op with them.
        gemv = r["gemv"] = {}
        rows = torch.empty(entries, D, device="cuda", dtype=torch.float32)
        for name, gbytes, call in (
            ("gate_up", g13, lambda t: launch_mxfp4_gemv(
                x, w13, w13_scale, w13_bias, hs, flat_ids, None, TOP_K, t, gated=True, **gemm_opts)),
            ("down", g2, lambda t: launch_mxfp4_gemv(
                hs, w2, w2_scale, w2_bias, rows, flat_ids, flat_w, 1, t)),
        ):
            timed = []
            for t in GEMV_TILES:
                row = measure(f"gemv {name} {t}", lambda t=t: call(t), quiet=True)
                timed.append({**t, **{k: v for k, v in row.items() if k != "trace"}})
            ok = [c for c in timed if "us" in c]
            best = min(ok, key=lambda c: c["us"]) if ok else None
            gemv[name] = {"best": best, "all": timed}
            if best:
                bw = gbytes / (best["us"] * 1e-6)
                print(f"  d) gemv {name:<7} best {best['us']:9.2f} us  {bw:8.1f} GB/s  "
                      f"N={best['BLOCK_N']} K={best['BLOCK_K']} w={best['num_warps']} "
                      f"({len(ok)}/{len(timed)} ok)")
            else:
                print(f"  d) gemv {name} no candidate ran: {timed[0].get('error') if timed else ''}")
        if gemv["gate_up"]["best"] and gemv["down"]["best"]:
            pick = {n: {k: gemv[n]["best"][k] for k in ("BLOCK_N", "BLOCK_K", "num_warps")}
                    for n in ("gate_up", "down")}
            gcfg = {"GEMV": True, **pick}
            gemv["config"] = gcfg
            gemv["whole_op"] = measure("d) run_fused_moe GEMV (best tiles)", lambda: run_fused_moe(
                x, w13, w2, weights, ids, gcfg, **gemm_opts, **biases, **mx), g13 + g2)
            gemv["sum_rows"] = measure("d) sum_expert_rows (gemv rows)",
                                       lambda: sum_expert_rows(rows, T, TOP_K, BF16))
        # e) bf16 weights, the same op.
        if w13_bf is not None:
            bf_bytes = distinct * (2 * INTER * D + D * INTER) * 2 / 1e9
            r["bf16"] = measure("e) fused_moe triton bf16 weights", lambda: triton_moe(
                x, w13_bf, w2_bf, weights, ids, activation="clamped_swiglu", interleaved=True,
                **biases), bf_bytes)
            try:
                r["bf16"]["config"] = moe_config(moe_shape_key(E, D, INTER, TOP_K, BF16), T, E, TOP_K, x)
            except Exception as error:  # noqa: BLE001
                r["bf16"]["config_error"] = str(error)
        with open(out_path, "w") as f:  # after every token count, in case a later one dies
            json.dump(report, f, indent=1)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "breakdown.json")
