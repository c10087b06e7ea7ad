"""Tune ATOM's Triton tile configs on this GPU and write the tables that ``atom_kernels.tuned`` reads.

    python benchmarks/kernels/tune_kernels.py --out-dir DIR [--ops moe,attention] [--jobs 16]

* fused MoE (Qwen3-30B-A3B and DeepSeek-V2-Lite shapes): per token count, every row-block size
  BLOCK_M and, for each of the two GEMMs (gate_up with the activation, down), every tile candidate;
  the BLOCK_M whose two best GEMMs sum lowest wins.
* attention (Qwen3-8B and Qwen3-30B-A3B heads): prefill (varlen, 16 x 1024 tokens) and extend
  (paged: 4 chunked-prefill extends of 512 new tokens over 2048 cached), every
  candidate of HEADS, BLOCK_M, BLOCK_N, warps, stages. Only the prefill picks go into the table;
  the extend picks are reported (see atom_kernels/tuned/README.md for why).

Every timing is a CUDA-graph replay (median of a few). Candidates compile first, in ``--jobs``
processes, into the shared Triton cache. Then the whole ops run with the new tables, next to the
built-in defaults and vLLM's kernel (fused_experts, FlashAttention 3), and their outputs are compared.
Writes DIR/fused_moe.json and DIR/attention.json (merged with the entries of other GPUs already
there) and DIR/tune-report.json. Point ``ATOM_TUNED_CONFIG_DIR`` at DIR to use the tables at once;
copy them into packages/atom-kernels/src/atom_kernels/tuned/ to ship them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

import torch

BF16 = torch.bfloat16
SMEM_BYTES = 220 * 1024

MOE_MODELS = {  # experts, top_k, hidden, intermediate (as in bench_kernels.MODELS)
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "deepseek-v2-lite": (64, 6, 2048, 1408),
}
MOE_TOKENS = [1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
ATTENTION_MODELS = {
    "qwen3-8b": (32, 8, 128),
    "qwen3-30b-a3b": (32, 4, 128),
}  # heads, kv, dim
PREFILL = [1024] * 16
# ATOM's vLLM backend gives a step's decodes a launch of their own (decode tiles), so extend is
# tuned on the extend launch alone.
EXTEND = (4, 512, 2048)  # extends, new tokens per extend, context


# --- candidates -----------------------------------------------------------------------------------


def moe_block_ms(num_tokens: int, experts: int, top_k: int) -> list[int]:
    rows_per_expert = num_tokens * top_k / experts
    return [m for m in (16, 32, 64, 128) if m == 16 or m <= 2 * rows_per_expert]


def moe_tiles(block_m: int, gated: bool) -> list[dict]:
    tiles = []
    for n, k, warps, stages in itertools.product(
        (64, 128, 256), (64, 128, 256), (4, 8), (2, 3, 4)
    ):
        operands = 2 if gated else 1
        if stages * (block_m * k + operands * k * n) * 2 > SMEM_BYTES:
            continue
        if (
            block_m * n * operands > 4096 * warps
        ):  # fp32 accumulators past ~128 registers a thread
            continue
        tiles.append(
            {
                "BLOCK_N": n,
                "BLOCK_K": k,
                "GROUP_M": 1 if block_m <= 32 else 8,
                "num_warps": warps,
                "num_stages": stages,
            }
        )
    return tiles


def attention_candidates(group: int) -> list[dict]:
    out = []
    for heads, m, n, warps, stages in itertools.product(
        sorted({1, min(group, 16)}), (64, 128), (64, 128), (4, 8), (2, 3, 4)
    ):
        if stages * (m * 128 + 2 * n * 128) * 2 > SMEM_BYTES:
            continue
        out.append(
            {
                "HEADS": heads,
                "BLOCK_M": m,
                "BLOCK_N": n,
                "num_warps": warps,
                "num_stages": stages,
            }
        )
    return out


# --- inputs ---------------------------------------------------------------------------------------


def rand(*shape, scale=1.0, dtype=BF16):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


class MoeShape:
    def __init__(self, model: str, num_tokens: int):
        self.experts, self.top_k, self.hidden, self.inter = MOE_MODELS[model]
        self.num_tokens = num_tokens
        e, d, i = self.experts, self.hidden, self.inter
        self.w13, self.w2 = (
            rand(e, 2 * i, d, scale=d**-0.5),
            rand(e, d, i, scale=i**-0.5),
        )
        self.x = rand(num_tokens, d)
        logits = torch.randn(num_tokens, e, device="cuda")
        self.weights, self.ids = torch.topk(logits.softmax(-1), self.top_k)
        self.ids = self.ids.to(torch.int32)
        self.weights_flat = self.weights.reshape(-1).contiguous()
        entries = num_tokens * self.top_k
        self.hidden_states = torch.empty(entries, i, device="cuda", dtype=BF16)
        self.out = torch.empty(entries, d, device="cuda", dtype=BF16)
        self.aligned: dict[int, tuple] = {}

    def gemm(self, block_m: int, gated: bool, tiles: dict):
        from atom_kernels import moe, moe_align

        if block_m not in self.aligned:
            self.aligned[block_m] = moe_align.moe_align_block_size_triton(
                self.ids, self.experts, block_m
            )
        sorted_ids, block_expert = self.aligned[block_m]
        entries = self.num_tokens * self.top_k
        if gated:
            args = (self.x, self.w13, None, self.hidden_states, None)
            return lambda: moe.launch_moe_gemm(
                *args,
                sorted_ids,
                block_expert,
                entries,
                self.top_k,
                block_m,
                tiles,
                gated=True,
            )
        args = (self.hidden_states, self.w2, None, self.out, self.weights_flat)
        return lambda: moe.launch_moe_gemm(
            *args, sorted_ids, block_expert, entries, 1, block_m, tiles
        )


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


# --- timing ---------------------------------------------------------------------------------------


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
        if "OutOfResources" not in type(
            error
        ).__name__ and "out of resource" not in str(error):
            print(f"    candidate failed: {type(error).__name__}: {str(error)[:120]}")
        return None


# --- precompile in parallel -----------------------------------------------------------------------


def compile_jobs(ops: list[str]) -> list[tuple]:
    jobs = []
    if "moe" in ops:
        for model in MOE_MODELS:
            for block_m in (16, 32, 64, 128):
                for gated in (True, False):
                    jobs += [
                        ("moe", model, block_m, gated, t)
                        for t in moe_tiles(block_m, gated)
                    ]
    if "attention" in ops:
        for model, (h, kv, _) in ATTENTION_MODELS.items():
            for kind in ("prefill", "extend"):
                jobs += [
                    ("attention", model, kind, c) for c in attention_candidates(h // kv)
                ]
    return jobs


_worker_inputs: dict = {}


def compile_one(job: tuple) -> None:
    """Run one candidate once at a small size (sizes are not specialized) to fill the cache."""
    try:
        if job[0] == "moe":
            _, model, block_m, gated, tiles = job
            if model not in _worker_inputs:
                _worker_inputs[model] = MoeShape(model, 4)
            _worker_inputs[model].gemm(block_m, gated, tiles)()
        else:
            _, model, kind, config = job
            key = (model, kind)
            if key not in _worker_inputs:
                _worker_inputs[key] = AttentionShape(model, kind)
            _worker_inputs[key].ours(config)()
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001  (the candidate is skipped again when it is timed)
        print(f"    compile failed: {job[:3]}: {type(error).__name__}", flush=True)


def precompile(ops: list[str], jobs: int) -> None:
    todo = compile_jobs(ops)
    began = time.time()
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        pool.map(compile_one, todo, chunksize=4)
    print(
        f"compiled {len(todo)} candidates in {time.time() - began:.0f} s with {jobs} processes"
    )


# --- tuning ---------------------------------------------------------------------------------------


def tune_moe(report: dict) -> dict:
    from atom_kernels.moe import moe_shape_key

    table = {}
    for model, (experts, top_k, hidden, inter) in MOE_MODELS.items():
        key = moe_shape_key(experts, hidden, inter, top_k, BF16)
        table[key] = {}
        for num_tokens in MOE_TOKENS:
            shape = MoeShape(model, num_tokens)
            best = None
            for block_m in moe_block_ms(num_tokens, experts, top_k):
                picks = {}
                for name, gated in (("gate_up", True), ("down", False)):
                    timed = [
                        (us, t)
                        for t in moe_tiles(block_m, gated)
                        if (us := try_us(shape.gemm(block_m, gated, t))) is not None
                    ]
                    picks[name] = min(timed, key=lambda p: p[0])
                total = picks["gate_up"][0] + picks["down"][0]
                if best is None or total < best[0]:
                    best = (total, block_m, picks)
            total, block_m, picks = best
            table[key][str(num_tokens)] = {
                "BLOCK_M": block_m,
                "gate_up": picks["gate_up"][1],
                "down": picks["down"][1],
            }
            print(
                f"moe {model} tokens={num_tokens}: BLOCK_M={block_m} gemms {total:.1f} us"
            )
            report["moe_gemms"].append(
                {
                    "model": model,
                    "tokens": num_tokens,
                    "gemms_us": total,
                    **table[key][str(num_tokens)],
                }
            )
            del shape
    return table


def tune_attention(report: dict) -> dict:
    from atom_kernels.attention import attention_shape_key

    table = {}
    for model, (heads, kv, dim) in ATTENTION_MODELS.items():
        for kind in ("prefill", "extend"):
            shape = AttentionShape(model, kind)
            timed = [
                (us, c)
                for c in attention_candidates(heads // kv)
                if (us := try_us(shape.ours(c))) is not None
            ]
            us, config = min(timed, key=lambda p: p[0])
            print(f"attention {model} {kind}: {config} {us:.1f} us")
            if kind == "extend":
                # Reported, not written: tiles picked on long extends alone slow down launches that
                # hold short queries (atom_kernels/tuned/README.md), so extend keeps the built-in ones.
                report.setdefault("extend_picks", []).append({"model": model, "us": us, **config})
                continue
            table[attention_shape_key(False, dim, 0, heads // kv, BF16)] = {"0": config}
    return table


def comparison_row(times: dict, theirs_us: float, theirs: str, max_rel_diff: float, **shape) -> dict:
    """One report row: built-in and tuned tiles against the reference kernel ``theirs``."""
    return {
        **shape,
        "default_us": times["default"],
        "tuned_us": times["tuned"],
        f"{theirs}_us": theirs_us,
        "ratio_default": times["default"] / theirs_us,
        "ratio_tuned": times["tuned"] / theirs_us,
        f"max_rel_diff_vs_{theirs}": max_rel_diff,
    }


def print_row(label: str, row: dict, theirs: str) -> None:
    print(
        f"{label}: default {row['default_us']:8.1f} tuned {row['tuned_us']:8.1f} {theirs} "
        f"{row[theirs + '_us']:8.1f} us  ratio {row['ratio_default']:.2f} -> {row['ratio_tuned']:.2f}"
        f"  diff {row['max_rel_diff_vs_' + theirs]:.1e}"
    )


def compare_ops(report: dict, ops: list[str]) -> None:
    """The whole ops with the built-in defaults, with the new tables, and vLLM's kernel."""
    import atom_kernels as ak
    from atom_kernels import tuned

    packaged = tuned.PACKAGED_DIR

    def both(fn) -> dict:
        """Times and outputs of ``fn`` with no tables (the built-in defaults), then with DIR's."""
        times = {}
        for label in ("default", "tuned"):
            tuned.PACKAGED_DIR = packaged if label == "tuned" else Path("/nonexistent")
            os.environ["ATOM_TUNED_CONFIG_DIR"] = (
                report["out_dir"] if label == "tuned" else ""
            )
            tuned.clear_cache()
            times[label] = graph_us(fn)
            times[f"{label}_out"] = fn().clone()
        return times

    def rel(a, b) -> float:
        return (
            (a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6)
        ).item()

    if "moe" in ops:
        from vllm.model_executor.layers.fused_moe import fused_experts

        for model in MOE_MODELS:
            for num_tokens in MOE_TOKENS:
                s = MoeShape(model, num_tokens)
                args = (s.x, s.w13, s.w2, s.weights, s.ids)
                times = both(lambda a=args: ak.fused_moe(*a))
                theirs = graph_us(lambda a=args: fused_experts(*a))
                ref = fused_experts(*args)
                row = comparison_row(times, theirs, "vllm", rel(times["tuned_out"], ref),
                                     model=model, tokens=num_tokens)
                report["fused_moe"].append(row)
                print_row(f"fused_moe {model} {num_tokens:6d}", row, "vllm")
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


def write_table(path: Path, device: str, entries: dict) -> None:
    table = json.loads(path.read_text()) if path.exists() else {}
    table.setdefault(device, {}).update(entries)
    path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--ops", default="moe,attention")
    parser.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("tune_kernels needs a CUDA GPU")
    ops = args.ops.split(",")
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
    if "moe" in ops:
        write_table(args.out_dir / "fused_moe.json", device, tune_moe(report))
    if "attention" in ops:
        write_table(args.out_dir / "attention.json", device, tune_attention(report))
    report["tuning_s"] = time.time() - began
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        compare_ops(report, ops)
    report["total_s"] = time.time() - began
    (args.out_dir / "tune-report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"done in {report['total_s']:.0f} s")


if __name__ == "__main__":
    main()
