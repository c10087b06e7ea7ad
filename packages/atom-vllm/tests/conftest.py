import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from atom_core.testing.tiny_models import build_tiny_model

RUNNER = os.path.join(os.path.dirname(__file__), "vllm_runner.py")
RESULT_MARKER = "VLLM_RUNNER_RESULT "


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """tiny_model_dir(architecture, **overrides) -> path of a freshly built tiny checkpoint."""
    built: dict = {}

    def make(architecture: str, **overrides) -> str:
        key = (architecture, tuple(sorted(overrides.items())))
        if key not in built:
            out = tmp_path_factory.mktemp(architecture)
            built[key] = build_tiny_model(architecture, str(out), **overrides)
        return built[key]

    return make


def run_vllm(model: str, phases: list[list[list[int]]], max_tokens: int, env: dict | None = None,
             llm_kwargs: dict | None = None, timeout: int = 600) -> dict:
    """Run real vLLM in a fresh process; returns the runner's result dict (see vllm_runner.py)."""
    spec = {"model": model, "phases": phases, "max_tokens": max_tokens, "llm_kwargs": llm_kwargs or {}}
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, RUNNER, json.dumps(spec)], env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            result = json.loads(line[len(RESULT_MARKER):])
            result["log"] = proc.stdout + proc.stderr
            return result
    raise AssertionError(f"vLLM run failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")


def hf_greedy(model_dir: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """HF transformers greedy decoding, ``max_tokens`` per prompt, never stopping early (no EOS)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
            assert out.shape[1] == len(prompt) + max_tokens, "HF generate stopped early"
            outputs.append(out[0, len(prompt):].tolist())
    return outputs
