"""One vLLM engine in this process on a dummy-weight model: correctness probe, then throughput.

Run in a fresh process per configuration (vLLM reads plugins and ATOM_* switches once per process):
    python engine_run.py (--config CONFIG.json | --checkpoint DIR) --out RESULT.json [--eager]
        [--correctness N,L] [--throughput N,IN,OUT] [--decode-step B,S] [--prefix-hits N,IN,OUT]
        [--kv-cache-dtype auto|fp8|...] [--dtype float32]
Prompts are random token ids with a fixed seed, so native and ATOM runs see the same inputs (the
workload, its arguments and the result's keys are offline_workload.py's, shared with sglang_run.py); dummy
weights depend only on each parameter's shape (vLLM's dummy loader), so both see the same weights.
``--checkpoint`` loads a checkpoint written on disk instead (random_mxfp4_checkpoint.py: formats whose
weights vLLM's dummy loader leaves uninitialised; random_checkpoint.py: bf16 MoE models, whose routing
dummy weights collapse onto a few experts). The directory needs no tokenizer (``skip_tokenizer_init``).
"""

import argparse
import os
import time

from offline_workload import (
    add_workload_arguments,
    correctness_prompts,
    measure_throughput,
    model_dir,
    random_prompts,
    run_header,
    vocab_size,
    write_result,
)

from atom_vllm.served_by import describe_served_model


def decode_step_time(llm, batch: int, steps: int, vocab: int) -> dict:
    """Milliseconds per decode step at ``batch`` sequences of ~64-token context: the time of
    generating 1 + ``steps`` tokens minus the time of generating 1 (the prefill), over ``steps``.
    Each timing uses fresh prompts, so no prefix-cache hit shortens a prefill."""
    from vllm import SamplingParams

    def timed(max_tokens: int, seed: int) -> float:
        prompts = [{"prompt_token_ids": p} for p in random_prompts(batch, 64, vocab, seed)]
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        begin = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - begin

    timed(1 + steps, seed=20)  # warm-up
    prefill = min(timed(1, seed=21 + i) for i in range(3))
    full = min(timed(1 + steps, seed=31 + i) for i in range(3))
    return {"batch": batch, "steps": steps, "prefill_s": prefill, "with_decode_s": full,
            "ms_per_decode_step": 1e3 * (full - prefill) / steps}


def prefix_hit_check(llm, count: int, length: int, new_tokens: int, vocab: int) -> dict:
    """Greedy tokens of the same prompts twice: fresh, then served from the prefix cache but for their
    last block (vLLM recomputes at least one token), so the second pass runs the short-extend path
    (ATOM's MLA on FA3: the absorbed form) where the first ran a whole prefill."""
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": p} for p in random_prompts(count, length, vocab, seed=40)]
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True, detokenize=False)
    passes = [llm.generate(prompts, params, use_tqdm=False) for _ in range(2)]
    fresh, cached = ([list(o.outputs[0].token_ids) for o in outputs] for outputs in passes)
    return {"prompts": count, "prompt_len": length, "new_tokens": new_tokens, "fresh": fresh, "cached": cached,
            "identical": sum(a == b for a, b in zip(fresh, cached)),
            "mean_cached_prompt_tokens": [sum(o.num_cached_tokens or 0 for o in outputs) / count
                                          for outputs in passes]}


def main() -> None:
    parser = argparse.ArgumentParser()
    add_workload_arguments(parser)
    parser.add_argument("--decode-step", default="", help="batch,steps: time of one decode step")
    parser.add_argument("--prefix-hits", default="", help="prompts,in,out: prefix_hit_check ('' to skip)")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    path, load_format, config = model_dir(args)
    vocab = vocab_size(config)
    start = time.perf_counter()
    llm = LLM(model=path, load_format=load_format, skip_tokenizer_init=True, dtype=args.dtype,
              max_model_len=args.max_model_len, enforce_eager=args.eager, seed=0,
              gpu_memory_utilization=0.85, kv_cache_dtype=args.kv_cache_dtype, **dict(args.engine_arg))
    result = run_header(args, "vllm", os.environ.get("ATOM_DISABLE_VLLM_PLUGIN") == "1",
                        time.perf_counter() - start, llm.apply_model(describe_served_model)[0])

    if args.correctness:
        count, new_tokens = map(int, args.correctness.split(","))
        params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True, logprobs=20,
                                detokenize=False)
        outputs = llm.generate([{"prompt_token_ids": p} for p in correctness_prompts(count, vocab)], params,
                               use_tqdm=False)
        result["correctness"] = {
            "tokens": [list(o.outputs[0].token_ids) for o in outputs],
            # First generated position: top-20 logprobs by token id.
            "first_logprobs": [{str(t): lp.logprob for t, lp in o.outputs[0].logprobs[0].items()}
                               for o in outputs],
        }

    if args.throughput:
        def generate(prompts: list[list[int]], max_tokens: int) -> int:
            params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
            outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            return sum(len(o.outputs[0].token_ids) for o in outputs)

        result["throughput"] = measure_throughput(generate, args.throughput, vocab, args.warm_passes, args.timed_passes)
    if args.decode_step:
        result["decode_step"] = decode_step_time(llm, *map(int, args.decode_step.split(",")), vocab)
    if args.prefix_hits:
        result["prefix_hits"] = prefix_hit_check(llm, *map(int, args.prefix_hits.split(",")), vocab)
    write_result(result, args.out)


if __name__ == "__main__":
    main()
