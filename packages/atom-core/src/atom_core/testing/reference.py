"""HF transformers as the reference implementation: greedy tokens to compare engines against."""

from __future__ import annotations

import torch


def hf_greedy(model_dir: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """HF transformers greedy decoding, ``max_tokens`` per prompt, never stopping early (no EOS)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
            if out.shape[1] != len(prompt) + max_tokens:
                raise AssertionError("HF generate stopped early")
            outputs.append(out[0, len(prompt):].tolist())
    return outputs
