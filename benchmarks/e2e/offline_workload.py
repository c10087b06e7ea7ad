"""The offline workload of engine_run.py (vLLM) and sglang_run.py (SGLang): the same arguments, model
directory, random prompts and timed passes, so that the two engines' results compare key for key.

Each engine script builds its engine, hands :func:`measure_throughput` a ``generate(prompts,
max_tokens) -> generated token count`` of its own, and writes its result with :func:`write_result`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable

# vLLM's LLM.apply_model, which engine_run.py and profile_steps.py call to report the classes that
# served, sends a function to the engine process: vLLM allows that only with pickle serialization on.
# (Set here, not by the caller: a run without it failed after both engines had started, 2026-11-28.)
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

# Prompt length of the correctness probe, and the seeds: one per prompt set, shared by both engines.
CORRECTNESS_PROMPT_LEN = 64
CORRECTNESS_SEED = 1
THROUGHPUT_SEED, FIRST_PASS_SEED = 2, 3
# Timed passes after the first take seeds from here on, apart from the warm passes' (FIRST_PASS_SEED + i).
MORE_TIMED_SEEDS = 1000


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="an HF config.json: dummy weights")
    source.add_argument("--checkpoint", help="a checkpoint directory: its weights")
    parser.add_argument("--out", required=True)
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs (and, in vLLM, no torch.compile)")
    parser.add_argument("--correctness", default="64,128", help="prompts,new tokens ('' to skip)")
    parser.add_argument("--throughput", default="256,1024,128", help="prompts,in,out ('' to skip)")
    parser.add_argument("--warm-passes", type=int, default=1,
                        help="untimed passes before the timed one (more where an engine compiles in the first, "
                             "e.g. vLLM alone with VLLM_DEEP_GEMM_WARMUP=skip)")
    parser.add_argument("--timed-passes", type=int, default=1,
                        help="timed passes, each on new prompts: their median is the result, every one is kept "
                             "(timed_pass_output_tok_s), so an engine whose rate still moves shows it")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-cache-dtype", default="auto", help="the engine's kv_cache_dtype")
    parser.add_argument("--dtype", default="bfloat16",
                        help="the engine's dtype (float32: an agreement check without bf16's rounding)")
    parser.add_argument("--engine-arg", action="append", default=[], type=engine_arg, metavar="KEY=VALUE",
                        help="a further argument of the engine (vLLM's LLM, sglang.Engine), repeatable; the "
                             "value is read as JSON where it parses: additional_config={\"k\":\"v\"}")


def engine_arg(text: str) -> tuple[str, object]:
    key, _, value = text.partition("=")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab - 10) for _ in range(length)] for _ in range(count)]


def correctness_prompts(count: int, vocab: int) -> list[list[int]]:
    return random_prompts(count, CORRECTNESS_PROMPT_LEN, vocab, seed=CORRECTNESS_SEED)


def model_dir(args: argparse.Namespace) -> tuple[str, str, dict]:
    """(model directory, load format, HF config) of ``--checkpoint`` (its weights) or ``--config`` (a
    fresh directory holding only that config.json, for the engine's dummy loader)."""
    if args.checkpoint:
        path, load_format = args.checkpoint, "auto"
    else:
        path, load_format = tempfile.mkdtemp(prefix="atom-bench-"), "dummy"
        shutil.copy(args.config, os.path.join(path, "config.json"))
    with open(os.path.join(path, "config.json")) as f:
        return path, load_format, json.load(f)


def vocab_size(config: dict) -> int:
    """The vocabulary of an HF config, a vision-language model's (in its ``text_config``) included."""
    return config.get("vocab_size") or config["text_config"]["vocab_size"]


def run_header(args: argparse.Namespace, engine: str, atom_disabled: bool, engine_start_s: float,
               served_by: dict) -> dict:
    """The keys every engine run's result starts with."""
    return {"engine": engine, "config": os.path.basename(args.config or args.checkpoint), "eager": args.eager,
            "weights_from": "checkpoint" if getattr(args, "checkpoint", None) else "dummy",
            "dtype": args.dtype, "kv_cache_dtype": args.kv_cache_dtype, "engine_args": dict(args.engine_arg),
            "atom_disabled": atom_disabled, "engine_start_s": engine_start_s, "served_by": served_by}


def measure_throughput(generate: Callable[[list[list[int]], int], int], spec: str, vocab: int,
                       warm_passes: int = 1, timed_passes: int = 1) -> dict:
    """``spec`` = "prompts,in,out": that many random prompts of ``in`` tokens, ``out`` greedy tokens
    each (EOS ignored), timed over ``generate`` calls (the median of ``timed_passes``) after
    ``warm_passes`` untimed ones."""
    count, in_len, out_len = map(int, spec.split(","))
    if warm_passes < 1 or timed_passes < 1:
        raise ValueError(f"warm and timed passes must be at least 1, got {warm_passes} and {timed_passes}")

    def timed_pass(seed: int) -> tuple[float, int]:
        prompts = random_prompts(count, in_len, vocab, seed=seed)
        begin = time.perf_counter()
        generated = generate(prompts, out_len)
        return time.perf_counter() - begin, generated

    # Full passes of the same workload first (other prompts: no prefix-cache hits), so that kernels
    # either engine compiles on first sight of a batch shape (vLLM's fused_moe_kernel on a large
    # MoE batch, say) compile outside the timed pass. The first one's time is kept as first_pass_*,
    # each one's output rate as warm_pass_output_tok_s.
    warm = [timed_pass(seed=FIRST_PASS_SEED + i) for i in range(warm_passes)]
    timed = [timed_pass(seed=THROUGHPUT_SEED if i == 0 else MORE_TIMED_SEEDS + i) for i in range(timed_passes)]
    elapsed, generated = sorted(timed, key=lambda run: run[1] / run[0])[timed_passes // 2]
    return {
        "prompts": count, "input_len": in_len, "output_len": out_len, "elapsed_s": elapsed,
        "output_tok_s": generated / elapsed, "total_tok_s": (generated + count * in_len) / elapsed,
        "first_pass_elapsed_s": warm[0][0], "first_pass_output_tok_s": warm[0][1] / warm[0][0],
        "warm_pass_output_tok_s": [tokens / seconds for seconds, tokens in warm],
        "timed_pass_output_tok_s": [tokens / seconds for seconds, tokens in timed],
    }


def write_result(result: dict, out: str) -> None:
    with open(out, "w") as f:
        json.dump(result, f)
    print("ENGINE_RUN", json.dumps({k: v for k, v in result.items() if k != "correctness"}), flush=True)
