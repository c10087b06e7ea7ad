"""Runs real vLLM (CPU build) on a model in a fresh process and prints one JSON result line.

Separate processes because vLLM reads plugins and ATOM_* switches once per process. Used by the
parity tests: ``python vllm_runner.py '<json spec>'`` where the spec has ``model``, ``phases`` (lists
of prompts, each a list of token ids, ``{"text": ..., "image": <image file>}`` or, for Kimi-K2.5's
``vision_chunk`` modality, ``{"ids": ..., "image": ...}``; each phase is one ``generate`` call, so
later phases can hit the prefix cache filled by earlier ones), ``max_tokens`` and optional
``llm_kwargs``; ``prompt_embeds: true`` sends each prompt as the rows of the checkpoint's embedding
table for its ids, ``prompt_logprobs: true`` returns the log-probability of every prompt token after
the first (a list of booleans: in those phases only; vLLM reads no prefix cache for a request that
asks for them).
"""

import json
import os
import sys

from atom_vllm.served_by import describe_served_model

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

RESULT_MARKER = "VLLM_RUNNER_RESULT "


def token_prompt(prompt: list[int] | dict) -> dict:
    if isinstance(prompt, list):
        return {"prompt_token_ids": prompt}
    from PIL import Image

    image = Image.open(prompt["image"]).convert("RGB")
    if "ids" in prompt:
        chunk = {"type": "image", "image": image}
        return {"prompt_token_ids": prompt["ids"], "multi_modal_data": {"vision_chunk": chunk}}
    return {"prompt": prompt["text"], "multi_modal_data": {"image": image}}


def embedded_prompt(model_dir: str):
    from safetensors import safe_open

    with safe_open(os.path.join(model_dir, "model.safetensors"), "pt") as f:
        table = f.get_tensor("model.embed_tokens.weight")
    return lambda ids: {"prompt_embeds": table[ids]}


def runner_block_size() -> int:
    """16 tokens; 32 from vLLM 0.29, whose CPU attention takes multiples of 32 only."""
    from atom_vllm.version import vllm_release

    return 32 if vllm_release() >= (0, 29) else 16


def main() -> None:
    spec = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams

    kwargs = dict(
        dtype="float32",
        distributed_executor_backend="uni",
        max_model_len=256,
        max_num_seqs=8,
        block_size=runner_block_size(),
        enforce_eager=True,
        seed=0,
    )
    kwargs.update(spec.get("llm_kwargs", {}))
    llm = LLM(model=spec["model"], **kwargs)
    with_logprobs = spec.get("prompt_logprobs", False)
    if isinstance(with_logprobs, bool):
        with_logprobs = [with_logprobs] * len(spec["phases"])
    to_input = embedded_prompt(spec["model"]) if spec.get("prompt_embeds") else token_prompt
    phases = []
    for prompts, logprobs in zip(spec["phases"], with_logprobs, strict=True):
        params = SamplingParams(temperature=0, max_tokens=spec["max_tokens"], ignore_eos=True,
                                prompt_logprobs=0 if logprobs else None)
        outputs = llm.generate([to_input(p) for p in prompts], params, use_tqdm=False)
        phases.append([
            {"tokens": list(o.outputs[0].token_ids), "num_cached_tokens": o.num_cached_tokens or 0,
             **({"prompt_logprobs": [next(iter(lp.values())).logprob for lp in o.prompt_logprobs[1:]]}
                if logprobs else {})}
            for o in outputs
        ])
    scheduler = llm.llm_engine.vllm_config.scheduler_config
    result = {
        "phases": phases,
        "served_by": llm.apply_model(describe_served_model)[0],
        # As the engine ran, after every platform adjustment.
        "scheduler": {"enable_chunked_prefill": scheduler.enable_chunked_prefill,
                      "max_num_batched_tokens": scheduler.max_num_batched_tokens},
    }
    if not kwargs.get("disable_log_stats", True):
        # Counters only (speculative decoding's drafted and accepted tokens, ...).
        result["counters"] = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")
                              and isinstance(m.value, int)}
    print(RESULT_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
