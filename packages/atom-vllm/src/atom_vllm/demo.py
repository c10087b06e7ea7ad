"""Quick start: vLLM + ATOM on a tiny Qwen3 built in code (or on ``--model PATH``).

    python -m atom_vllm.demo [--model PATH] [--max-tokens N]

Prints the generated tokens and which ATOM parts served them: platform, model class, attention
impl and kernel backend per op.
"""

from __future__ import annotations

import argparse
import os
import tempfile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="HF model directory (default: a tiny random Qwen3 built now)")
    parser.add_argument("--architecture", default="Qwen3ForCausalLM",
                        help="architecture of the built-in tiny model")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    from vllm import LLM, SamplingParams

    import atom_kernels
    from atom_vllm.served_by import describe_served_model

    model = args.model
    if model is None:
        from atom_core.testing.tiny_models import build_tiny_model

        model = build_tiny_model(args.architecture, tempfile.mkdtemp(prefix="atom-demo-"))
        print(f"Built a tiny random {args.architecture} at {model}")

    llm = LLM(model=model, max_model_len=512, enforce_eager=not torch.cuda.is_available(),
              distributed_executor_backend="uni")
    prompts = ["The quick brown fox", "Paged attention stores keys and values in"]
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=args.max_tokens,
                                                   ignore_eos=True))
    print("\n=== Generated (greedy) ===")
    for prompt, output in zip(prompts, outputs):
        completion = output.outputs[0]
        print(f"{prompt!r} -> {completion.text!r}")
        print(f"    token ids: {list(completion.token_ids)}")

    from vllm.platforms import current_platform

    info = llm.apply_model(describe_served_model)[0]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print("\n=== ATOM parts active ===")
    print(f"platform:        {type(current_platform).__module__}.{type(current_platform).__name__}")
    print(f"model wrapper:   {info['model_class']}")
    print(f"model:           {info['inner_class']}")
    print(f"attention impl:  {', '.join(info['attention_impls'])}")
    print(f"kernel backends ({device}):")
    for op, backend in atom_kernels.backend_report(device).items():
        print(f"    {op:<36} {backend}")


if __name__ == "__main__":
    main()
