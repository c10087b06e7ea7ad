"""Helpers of the atom-sglang tests: running SGLang in fresh processes, and the HF reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import torch

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
SUPPORT_DIR = os.path.join(TESTS_DIR, "support")
RUNNER = os.path.join(TESTS_DIR, "sglang_runner.py")
RESULT_MARKER = "SGLANG_RUNNER_RESULT "
# Every SGLang engine spawns fresh interpreters that import all of SGLang; with bytecode caching off
# (PYTHONDONTWRITEBYTECODE, no .pyc in the environment) each one compiles it again. The engine
# processes of the tests share one bytecode cache outside the environment instead.
PYCACHE_DIR = os.path.join(tempfile.gettempdir(), "atom-sglang-tests-pycache")


def sglang_env(**overrides: str) -> dict[str, str]:
    """Environment of an SGLang process: CPU engine, the sgl_kernel stand-in first on the path, and
    none of the caller's ATOM/SGLang plugin switches unless given in ``overrides``."""
    dropped = ("ATOM_DISABLE_SGLANG", "SGLANG_PLUGINS", "SGLANG_EXTERNAL_MODEL_PACKAGE",
               "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    path = os.pathsep.join(p for p in (SUPPORT_DIR, env.get("PYTHONPATH")) if p)
    return {**env, "SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": path, "PYTHONPYCACHEPREFIX": PYCACHE_DIR,
            **overrides}


def run_sglang(*jobs: tuple[list[dict], dict[str, str]], timeout: int = 900) -> list[list[dict]]:
    """Run each job ``(runs, env overrides)`` (runs as in sglang_runner.py) in its own fresh process,
    all processes at once (an engine start is mostly waiting). Per job, one result per run, each with
    the log lines its engine produced under ``"log"``."""
    procs = [
        subprocess.Popen([sys.executable, RUNNER, json.dumps({"runs": runs})], env=sglang_env(**env),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for runs, env in jobs
    ]
    outputs = [proc.communicate(timeout=timeout) for proc in procs]
    all_results = []
    for (runs, _), proc, (stdout, stderr) in zip(jobs, procs, outputs):
        results = [json.loads(line[len(RESULT_MARKER):]) for line in stdout.splitlines()
                   if line.startswith(RESULT_MARKER)]
        if proc.returncode != 0 or len(results) != len(runs):
            raise AssertionError(f"SGLang run failed (rc={proc.returncode}):\n{stdout[-4000:]}\n{stderr[-8000:]}")
        for result, log in zip(results, stderr.split(RESULT_MARKER)):
            result["log"] = log
        all_results.append(results)
    return all_results


def hf_greedy(model_dir: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """HF transformers greedy decoding, ``max_tokens`` per prompt, never stopping early (no EOS)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            out = model.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)
            assert out.shape[1] == len(prompt) + max_tokens, "HF generate stopped early"
            outputs.append(out[0, len(prompt):].tolist())
    return outputs
