"""Per-kernel GPU time of one prefill step and one decode step, in one vLLM engine (this process).

    VLLM_ENABLE_V1_MULTIPROCESSING=0 python profile_steps.py (--config CONFIG.json | --checkpoint DIR) \
        --out PROFILE.json [--kv-cache-dtype fp8]

Run once with ATOM_DISABLE_VLLM_PLUGIN=1 (native) and once without (ATOM), on the same GPU.
The engine core runs in this process, so torch.profiler sees every kernel, CUDA-graph replays
included. Three windows, stepped through ``LLMEngine.step``:

- prefill: PREFILL_PROMPTS x 1024-token prompts, one output token (whole prefill steps);
- decode: once DECODE_BATCH 1024-token prompts are prefilled, DECODE_STEPS pure decode steps;
- workload (optional): N x 1024 in / 128 out, every step.

Writes per window kernel time by name and by op class (kernel_summary.py), GPU-busy against wall
time and the number of engine steps.
"""

import argparse
import faulthandler
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_summary import kernel_times, summarise  # noqa: E402
from offline_workload import engine_arg, random_prompts  # noqa: E402

from atom_vllm.served_by import describe_served_model  # noqa: E402


def host_ops(prof, steps: int) -> list:
    """The 40 host-side ops with the most time of their own (the profiler's self CPU time, ms per step,
    with call counts): where a host-bound step spends its time. The profiler slows the host, so compare
    the two engines' lists with each other, not with the unprofiled wall time."""
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:40]
    return [[e.key[:120], e.count // max(steps, 1), e.self_cpu_time_total / 1e3 / max(steps, 1)] for e in ops]


def profiled(fn, host: bool = False):
    import torch

    activities = [torch.profiler.ProfilerActivity.CUDA] + [torch.profiler.ProfilerActivity.CPU] * host
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as prof:
        begin = time.perf_counter()
        steps = fn()
        torch.cuda.synchronize()
        wall = time.perf_counter() - begin
    result = summarise(*kernel_times(prof), wall, steps)
    if host:
        result["host_ops_self_ms_per_step"] = host_ops(prof, steps)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="an HF config.json: dummy weights")
    source.add_argument("--checkpoint", help="a checkpoint directory (as engine_run.py's)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--prefill-prompts", type=int, default=16)
    parser.add_argument("--decode-batch", type=int, default=256)
    parser.add_argument("--decode-steps", type=int, default=16)
    parser.add_argument("--workload-prompts", type=int, default=0, help="0 skips the workload window")
    parser.add_argument("--kv-cache-dtype", default="auto", help="LLM(kv_cache_dtype=...)")
    parser.add_argument("--host-ops", action="store_true",
                        help="a second prefill window with the host's ops profiled too (slower host)")
    parser.add_argument("--engine-arg", action="append", default=[], type=engine_arg, metavar="KEY=VALUE",
                        help="a further LLM argument (repeatable), as engine_run.py's")
    parser.add_argument("--stack-dump-after", type=float, default=0,
                        help="seconds: then every thread's Python stack goes to stderr, repeatedly (a stall)")
    args = parser.parse_args()
    if args.stack_dump_after:
        faulthandler.dump_traceback_later(args.stack_dump_after, repeat=True)
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        raise SystemExit("set VLLM_ENABLE_V1_MULTIPROCESSING=0: the profiler must see the engine core")

    from vllm import LLM, SamplingParams

    if args.checkpoint:
        model_dir, load_format = args.checkpoint, "auto"
    else:
        model_dir, load_format = tempfile.mkdtemp(prefix="atom-prof-"), "dummy"
        shutil.copy(args.config, os.path.join(model_dir, "config.json"))
    vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
    llm = LLM(model=model_dir, load_format=load_format, skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=2048, seed=0, gpu_memory_utilization=0.85, kv_cache_dtype=args.kv_cache_dtype,
              **dict(args.engine_arg))
    engine = llm.llm_engine
    result = {"config": os.path.basename(args.config or args.checkpoint), "kv_cache_dtype": args.kv_cache_dtype,
              "served_by": llm.apply_model(describe_served_model)[0],
              "atom_disabled": os.environ.get("ATOM_DISABLE_VLLM_PLUGIN") == "1"}

    def submit(prompts, max_tokens, tag):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        for i, p in enumerate(prompts):
            engine.add_request(f"{tag}-{i}", {"prompt_token_ids": p}, params)

    step_ms: list[float] = []

    def drain():
        step_ms.clear()
        while engine.has_unfinished_requests():
            begin = time.perf_counter()
            engine.step()
            step_ms.append(1e3 * (time.perf_counter() - begin))
        return len(step_ms)

    # Warm-up: every path (prefill, mixed, decode) once, outside the profiles.
    submit(random_prompts(32, 1024, vocab, seed=10), 8, "warm")
    drain()
    # And the prefill window's own step once: a library GEMM's first call at a new row count (cuBLASLt's
    # heuristics, DeepGEMM's compile where its warm-up skipped the count) is no part of a step's time.
    submit(random_prompts(args.prefill_prompts, 1024, vocab, seed=9), 1, "warm-prefill")
    drain()

    submit(random_prompts(args.prefill_prompts, 1024, vocab, seed=11), 1, "prefill")
    result["prefill"] = profiled(drain)
    result["prefill"]["window"] = f"{args.prefill_prompts} prompt(s) x 1024 tokens, 1 output token"
    if args.host_ops:
        submit(random_prompts(args.prefill_prompts, 1024, vocab, seed=14), 1, "prefill-host")
        result["prefill_host"] = profiled(drain, host=True)

    submit(random_prompts(args.decode_batch, 1024, vocab, seed=12), args.decode_steps + 64, "decode")
    started: set[str] = set()
    while len(started) < args.decode_batch:  # prefill (and mixed) steps, not profiled
        for out in engine.step():
            if out.outputs and out.outputs[0].token_ids:
                started.add(out.request_id)

    def decode_steps():
        for _ in range(args.decode_steps):
            engine.step()
        return args.decode_steps

    result["decode"] = profiled(decode_steps)
    result["decode"]["window"] = f"batch {args.decode_batch}, context ~1030-1090 tokens, pure decode steps"
    drain()

    if args.workload_prompts:
        submit(random_prompts(args.workload_prompts, 1024, vocab, seed=13), 128, "workload")
        result["workload"] = profiled(drain)
        result["workload"]["window"] = f"{args.workload_prompts} prompts x 1024 in / 128 out (all steps)"
        # A stall (a kernel compiled mid-run, a host-side sync) shows as a step far above its neighbours.
        result["workload"]["slowest_steps_ms"] = sorted(((ms, i) for i, ms in enumerate(step_ms)), reverse=True)[:8]

    json.dump(result, open(args.out, "w"), indent=1)
    for window in ("prefill", "prefill_host", "decode", "workload"):
        if window in result:
            r = result[window]
            print(window, f"steps={r['steps']} wall/step={r['wall_ms_per_step']:.2f} ms "
                  f"gpu/step={r['gpu_busy_ms_per_step']:.2f} ms gpu ops/step={r['gpu_ops_per_step']:.0f}",
                  {k: round(v, 3) for k, v in r["classes_ms_per_step"].items()}, flush=True)
            if "slowest_steps_ms" in r:
                print("  slowest steps (ms, index):", [(round(ms, 1), i) for ms, i in r["slowest_steps_ms"]])
            for name, calls, ms in r.get("host_ops_self_ms_per_step", [])[:15]:
                print(f"  host {ms:8.2f} ms {calls:6d} calls  {name}")


if __name__ == "__main__":
    main()
