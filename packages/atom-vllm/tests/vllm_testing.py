"""Helpers of the vLLM test modules: real vLLM runs in fresh processes."""

import json
import os
import subprocess
import sys

from atom_core.testing.reference import hf_greedy  # noqa: F401  (re-exported for the test modules)

RUNNER = os.path.join(os.path.dirname(__file__), "vllm_runner.py")
RESULT_MARKER = "VLLM_RUNNER_RESULT "


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
