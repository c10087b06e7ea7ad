"""GPU benchmark: the norm / activation that quantises its own output to fp8 against the two launches
it replaces (the op, then ``per_group_quant_fp8`` or ``per_token_quant_fp8``).

    python benchmarks/kernels/bench_fp8_fusion.py --out fp8-fusion.json [--rows 1,16,...] [--rep 100]

At Qwen3-8B's widths unless --hidden / --intermediate say otherwise (hidden 4096, intermediate 12288,
TP 1), for decode-sized (1 to 256) and prefill-sized (4096 to 16384) row counts, and for both
activation quantisations ATOM fuses (per 128-channel group: block FP8; per token: per-channel FP8),
one row per pair:

- ``rms_norm``: ``rms_norm_quant_fp8`` vs ``rms_norm`` + quant (a layer's first input norm);
- ``fused_add_rms_norm``: ``fused_add_rms_norm_quant_fp8`` vs ``fused_add_rms_norm`` + quant (every
  other norm before QKV or gate/up);
- ``silu_and_mul``: ``silu_and_mul_quant_fp8`` vs ``silu_and_mul`` + quant (before down_proj).

Times (microseconds) are ``bench_kernels.time_kernel``'s medians, replayed from a CUDA graph (the
headline ``*_us``) and eager (``*_eager_us``, launch overhead included). ``speedup`` = unfused / fused
(> 1: the fusion pays). ``same_codes``: the fused fp8 codes and scales equal the unfused ones bit for
bit (same arithmetic); ``differences`` counts those that do not. Prints a table and writes --out
(JSON). Without a CUDA GPU it says so and exits 0, writing nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
from bench_kernels import rand, time_kernel

HIDDEN, INTERMEDIATE, EPS = 4096, 12288, 1e-6  # Qwen3-8B's config.json (benchmarks/models/qwen3-8b.json)
DECODE_ROWS = (1, 16, 64, 128, 256)
PREFILL_ROWS = (4096, 8192, 16384)
QUANTS = {"group128": 128, "token": None}


def unfused_quant(ak, y: torch.Tensor, group: int | None):
    return ak.per_token_quant_fp8(y) if group is None else ak.per_group_quant_fp8(y, group)


def pairs(ak, rand, rows: int, group: int | None, hidden: int, intermediate: int):
    """(op, width, fused, unfused) for one row count and quantisation; each returns (q, scale, ...)."""
    x, residual, weight = rand(rows, hidden), rand(rows, hidden), rand(hidden)
    gate_up = rand(rows, 2 * intermediate)
    yield ("rms_norm", hidden,
           lambda: ak.rms_norm_quant_fp8(x, weight, EPS, group),
           lambda: unfused_quant(ak, ak.rms_norm(x, weight, EPS), group))
    yield ("fused_add_rms_norm", hidden,
           lambda: ak.fused_add_rms_norm_quant_fp8(x, residual, weight, EPS, group),
           lambda: unfused_quant(ak, ak.fused_add_rms_norm(x, residual, weight, EPS)[0], group))
    yield ("silu_and_mul", intermediate,
           lambda: ak.silu_and_mul_quant_fp8(gate_up, group),
           lambda: unfused_quant(ak, ak.silu_and_mul(gate_up), group))


def code_differences(fused, unfused) -> dict:
    """How many fp8 codes and scales of the fused op differ from the unfused ones', and the largest
    difference of two differing codes' fp8 values (before scaling)."""
    (q, scale), (want_q, want_scale) = fused[:2], unfused[:2]
    codes = q.view(torch.uint8) != want_q.view(torch.uint8)
    return {"codes": int(codes.sum()), "scales": int((scale != want_scale).sum()),
            "max_value_diff": float((q.float() - want_q.float()).abs().max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("fp8-fusion.json"))
    parser.add_argument("--rows", default=",".join(map(str, DECODE_ROWS + PREFILL_ROWS)),
                        help="comma-separated row (token) counts")
    # Narrower norms pack several rows a program (masked at decode sizes): Qwen3-30B-A3B 2048 / 768.
    parser.add_argument("--hidden", type=int, default=HIDDEN)
    parser.add_argument("--intermediate", type=int, default=INTERMEDIATE)
    parser.add_argument("--rep", type=int, default=100, help="milliseconds of timed repetitions per kernel")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_fp8_fusion: skipped, no CUDA GPU")
        return
    import atom_kernels as ak

    torch.manual_seed(0)
    report = {
        "device": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__},
        "model": {"hidden_size": args.hidden, "intermediate_size": args.intermediate},
        "backends": ak.backend_report("cuda"),
        "results": [],
    }
    print(f"{report['device']}; {report['versions']}")
    print(f"{'op':20} {'quant':9} {'rows':>6} {'width':>6} {'fused us':>9} {'unfused us':>11} "
          f"{'speedup':>8} {'eager':>6} same codes   (graph-replay times; eager = speedup of eager times)")
    for rows in map(int, args.rows.split(",")):
        for quant, group in QUANTS.items():
            for op, width, fused, unfused in pairs(ak, rand, rows, group, args.hidden, args.intermediate):
                fused_times, unfused_times = time_kernel(fused, args.rep), time_kernel(unfused, args.rep)
                row = {
                    "op": op, "quant": quant, "rows": rows, "width": width,
                    "case": "decode" if rows <= max(DECODE_ROWS) else "prefill",
                    "fused_us": fused_times["graph_us"], "unfused_us": unfused_times["graph_us"],
                    "fused_eager_us": fused_times["eager_us"],
                    "unfused_eager_us": unfused_times["eager_us"],
                    "differences": code_differences(fused(), unfused()),
                }
                row["same_codes"] = not (row["differences"]["codes"] or row["differences"]["scales"])
                row["speedup"] = row["unfused_us"] / row["fused_us"]
                row["speedup_eager"] = row["unfused_eager_us"] / row["fused_eager_us"]
                report["results"].append(row)
                print(f"{op:20} {quant:9} {rows:6} {width:6} {row['fused_us']:9.1f} "
                      f"{row['unfused_us']:11.1f} {row['speedup']:8.2f} {row['speedup_eager']:6.2f} "
                      f"{row['same_codes']}", flush=True)
                torch.cuda.empty_cache()
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
