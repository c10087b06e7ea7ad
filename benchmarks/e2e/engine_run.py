"""One vLLM engine in this process on a dummy-weight model: correctness probe, then throughput.

Run in a fresh process per configuration (vLLM reads plugins and ATOM_* switches once per process):
    python engine_run.py (--config CONFIG.json | --checkpoint DIR) --out RESULT.json [--eager]
        [--correctness N,L] [--throughput N,IN,OUT] [--decode-step B,S] [--kv-cache-dtype auto|fp8|...]
Prompts are random token ids with a fixed seed, so native and ATOM runs see the same inputs; dummy
weights depend only on each parameter's shape (vLLM's dummy loader), so both see the same weights.
``--checkpoint`` loads a checkpoint written on disk instead (random_mxfp4_checkpoint.py: formats whose
weights vLLM's dummy loader leaves uninitialised).
"""

import argparse
import json
import os
import random
import shutil
import tempfile
import time

from atom_vllm.served_by import describe_served_model


def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab - 10) for _ in range(length)] for _ in range(count)]


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


def main() -> None:
    parser = argparse.ArgumentParser()
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="an HF config.json: dummy weights")
    source.add_argument("--checkpoint", help="a checkpoint directory: its weights")
    parser.add_argument("--out", required=True)
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--correctness", default="64,128", help="prompts,new tokens ('' to skip)")
    parser.add_argument("--throughput", default="256,1024,128", help="prompts,in,out ('' to skip)")
    parser.add_argument("--decode-step", default="", help="batch,steps: time of one decode step")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-cache-dtype", default="auto", help="LLM(kv_cache_dtype=...)")
    args = parser.parse_args()

    from vllm import LLM, SamplingParams

    if args.checkpoint:
        model_dir, load_format = args.checkpoint, "auto"
    else:
        model_dir, load_format = tempfile.mkdtemp(prefix="atom-bench-"), "dummy"
        shutil.copy(args.config, os.path.join(model_dir, "config.json"))
    config = json.load(open(os.path.join(model_dir, "config.json")))
    vocab = config["vocab_size"]
    start = time.perf_counter()
    llm = LLM(model=model_dir, load_format=load_format, skip_tokenizer_init=True, dtype="bfloat16",
              max_model_len=args.max_model_len, enforce_eager=args.eager, seed=0,
              gpu_memory_utilization=0.85, kv_cache_dtype=args.kv_cache_dtype)
    result = {"config": os.path.basename(args.config or args.checkpoint), "eager": args.eager,
              "kv_cache_dtype": args.kv_cache_dtype,
              "atom_disabled": os.environ.get("ATOM_DISABLE_VLLM_PLUGIN") == "1",
              "engine_start_s": time.perf_counter() - start,
              "served_by": llm.apply_model(describe_served_model)[0]}

    if args.correctness:
        count, new_tokens = map(int, args.correctness.split(","))
        prompts = random_prompts(count, 64, vocab, seed=1)
        params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True, logprobs=20,
                                detokenize=False)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        result["correctness"] = {
            "tokens": [list(o.outputs[0].token_ids) for o in outputs],
            # First generated position: top-20 logprobs by token id.
            "first_logprobs": [{str(t): lp.logprob for t, lp in o.outputs[0].logprobs[0].items()}
                               for o in outputs],
        }

    if args.throughput:
        count, in_len, out_len = map(int, args.throughput.split(","))
        params = SamplingParams(temperature=0, max_tokens=out_len, ignore_eos=True, detokenize=False)

        def timed_pass(seed: int) -> tuple[float, int]:
            prompts = random_prompts(count, in_len, vocab, seed=seed)
            begin = time.perf_counter()
            outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
            return time.perf_counter() - begin, sum(len(o.outputs[0].token_ids) for o in outputs)

        # A full pass of the same workload first (other prompts: no prefix-cache hits), so that kernels
        # either engine compiles on first sight of a batch shape (vLLM's fused_moe_kernel on a large
        # MoE batch, say) compile outside the timed pass. Its time is kept as first_pass_*.
        first_elapsed, first_generated = timed_pass(seed=3)
        elapsed, generated = timed_pass(seed=2)
        result["throughput"] = {
            "prompts": count, "input_len": in_len, "output_len": out_len, "elapsed_s": elapsed,
            "output_tok_s": generated / elapsed, "total_tok_s": (generated + count * in_len) / elapsed,
            "first_pass_elapsed_s": first_elapsed, "first_pass_output_tok_s": first_generated / first_elapsed,
        }
    if args.decode_step:
        result["decode_step"] = decode_step_time(llm, *map(int, args.decode_step.split(",")), vocab)
    json.dump(result, open(args.out, "w"))
    print("ENGINE_RUN", json.dumps({k: v for k, v in result.items() if k != "correctness"}), flush=True)


if __name__ == "__main__":
    main()
