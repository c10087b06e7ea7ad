"""Reference greedy decoding to compare engines against: HF transformers, and ATOM's own model
run standalone (no host engine)."""

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


def atom_logits(model_dir: str, dtype: torch.dtype = torch.float32):
    """ATOM's model alone (torch kernels, no host engine) in ``dtype``: a function from one
    sequence's token ids to its logits [len, vocab]. The reference for checkpoints HF transformers
    cannot run the way ATOM does (FP8 experts)."""
    from transformers import AutoConfig

    from atom_core import Config
    from atom_core.hosting.build import build_atom_model
    from atom_core.layers.attention import standalone_batch
    from atom_core.loader import iter_safetensors

    hf_config = AutoConfig.from_pretrained(model_dir)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        config = Config(model=model_dir, hf_config=hf_config, torch_dtype=dtype)
        model = build_atom_model(config, hf_config.architectures[0], "a reference run")
    finally:
        torch.set_default_dtype(default_dtype)
    model.load_weights(iter_safetensors(model_dir))

    def logits(tokens: list[int]) -> torch.Tensor:
        with torch.no_grad(), standalone_batch([len(tokens)]):
            return model.compute_logits(model(torch.tensor(tokens), torch.arange(len(tokens)))).float()

    return logits


def atom_greedy(model_dir: str, prompts: list[list[int]], max_tokens: int,
                dtype: torch.dtype = torch.float32) -> list[list[int]]:
    """Greedy decoding with :func:`atom_logits`, re-running each whole sequence per token."""
    logits = atom_logits(model_dir, dtype)
    outputs = []
    for prompt in prompts:
        tokens = list(prompt)
        for _ in range(max_tokens):
            tokens.append(int(logits(tokens)[-1].argmax()))
        outputs.append(tokens[len(prompt):])
    return outputs


def prompt_logprobs(logits: torch.Tensor, prompt: list[int]) -> list[float]:
    """The log-probability of each prompt token after the first, from the prompt's logits."""
    logprobs = logits.float().log_softmax(-1)
    return logprobs[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0].tolist()
