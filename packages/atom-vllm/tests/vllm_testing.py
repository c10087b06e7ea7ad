"""Helpers of the vLLM test modules: real vLLM runs in fresh processes."""

import contextlib
import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch

from atom_core.testing.reference import hf_greedy  # noqa: F401  (re-exported for the test modules)
from atom_core.testing.tiny_models import VOCAB_SIZE
from atom_vllm.version import vllm_release

RUNNER = os.path.join(os.path.dirname(__file__), "vllm_runner.py")

# vLLM alone on CPU: what 0.28 and later no longer do in fp32 (the suite also runs on 0.32; see
# ci/test.sh; the first release of each change of vLLM's own behaviour below was found with
# ci/vllm-minor.sh).
NO_FP32_MOE_ALONE = "vLLM 0.28+ alone has no fp32 MoE backend on CPU ('No Unquantized MoE backend supports ...')"


def skip_moe_alone_on_new_cpu_vllm(is_moe: bool) -> None:
    if is_moe and not torch.cuda.is_available() and vllm_release() >= (0, 28):
        pytest.skip(NO_FP32_MOE_ALONE)


def tensor_parallel_2(**llm_kwargs) -> dict:
    """run_vllm's keyword arguments for TP=2: two GPUs over NCCL, or two CPU workers over gloo, each
    binding its OpenMP threads to one core (vLLM's automatic binding wants one NUMA node per worker).
    Skips where the machine has neither."""
    env = {}
    if torch.cuda.is_available():
        if torch.cuda.device_count() < 2:
            pytest.skip("TP=2 on CUDA needs two GPUs")
    else:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            pytest.skip("TP=2 on CPU needs two cores, one per worker")
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"{cpus[0]}|{cpus[1]}"
    return {"env": env,
            "llm_kwargs": {"tensor_parallel_size": 2, "distributed_executor_backend": "mp", **llm_kwargs}}


# vLLM's Qwen3.5 and Kimi processors import torchvision, which the vLLM 0.32 CPU environment lacks
# (PyPI has no CPU build of it for torch 2.13).
needs_torchvision = pytest.mark.skipif(importlib.util.find_spec("torchvision") is None,
                                       reason="vLLM's vision-language processors need torchvision")
RESULT_MARKER = "VLLM_RUNNER_RESULT "

# Prompt log-probabilities of vLLM + ATOM against ATOM alone, both in bfloat16 (vLLM runs FP8 and
# MXFP4 checkpoints in bf16 only), where ATOM's kernels ran the whole model: bf16 rounding.
LOGPROB_TOLERANCE = 0.06
# Between two implementations' kernels in bf16 on a quantized checkpoint: a rounding difference
# before an FP8 activation quantization moves that value by a whole FP8 step (6 %), about once in 16
# values, so two correct implementations differ by up to ~0.3 in log-probability on the tiny random
# models, and where such a step lands on a sensitive position more: 0.70 at one of the 22 positions
# of the tiny Qwen3-Next (the others within 0.1) under vLLM 0.32's AMX attention kernel, on a CPU with
# AMX. A misapplied scale is off by whole units at most positions.
OTHER_KERNELS_TOLERANCE = 1.0
# Logged by atom_vllm.platform when the hybrids' full-attention layers stay on vLLM's CPU attention.
CPU_HYBRID_ATTENTION = "vLLM's CPU attention serves the full-attention layers of this hybrid model"


def bf16_logprob_tolerance(result: dict) -> float:
    """The tolerance of a bf16 run's prompt log-probabilities against ATOM alone's:
    :data:`LOGPROB_TOLERANCE`, or :data:`OTHER_KERNELS_TOLERANCE` where vLLM's CPU attention served
    a hybrid model's full-attention layers. Its bf16 sums differ from ATOM's by an ulp (0.016 at the
    first such layer of the tiny Qwen3-Next), and on an FP8 checkpoint the next activation
    quantization turns those ulps into whole FP8 steps: 0.11 in log-probability on the tiny
    Qwen3-Next, 0.33 on Qwen3.5-MoE, on CPUs where vLLM's attention kernels (chosen per instruction
    set) round differently from ATOM's."""
    return OTHER_KERNELS_TOLERANCE if CPU_HYBRID_ATTENTION in result["log"] else LOGPROB_TOLERANCE


class VllmRunFailed(AssertionError):
    """A vLLM run that ended without a result; ``log`` holds all it printed."""

    def __init__(self, message: str, log: str):
        super().__init__(message)
        self.log = log


def run_vllm(model: str, phases: list[list[list[int]]], max_tokens: int, env: dict | None = None,
             llm_kwargs: dict | None = None, timeout: int = 600, **options) -> dict:
    """Run real vLLM in a fresh process; returns the runner's result dict (see vllm_runner.py, also
    for ``options``)."""
    spec = {"model": model, "phases": phases, "max_tokens": max_tokens, "llm_kwargs": llm_kwargs or {},
            **options}
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, RUNNER, json.dumps(spec)], env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_MARKER):
            result = json.loads(line[len(RESULT_MARKER):])
            result["log"] = proc.stdout + proc.stderr
            return result
    raise VllmRunFailed(f"vLLM run failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}",
                        proc.stdout + proc.stderr)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def openai_server(model: str, log_dir: Path, *args: str) -> Iterator[tuple[str, Path]]:
    """vLLM's OpenAI-compatible server on 127.0.0.1 serving ``model`` as "tiny" (fp32, eager,
    max_model_len 256, then ``args``); yields (base URL, log path) once /health answers.

    On the CPU build `vllm serve` looks up the wrong distribution name, so the server module is
    started directly; the GPU `vllm` wheel's `vllm serve` runs the same code."""
    port = free_port()
    log_path = log_dir / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
             "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
             "--max-model-len", "256", "--enforce-eager", "--served-model-name", "tiny", *args],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while time.time() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"server exited:\n{log_path.read_text()[-6000:]}")
            try:
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(1)
        else:
            raise AssertionError(f"server did not become healthy:\n{log_path.read_text()[-6000:]}")
        yield base, log_path
    finally:
        proc.terminate()
        proc.wait(timeout=60)


# vLLM alone: the plugin switched off, as if ATOM were not installed.
ALONE = {"ATOM_DISABLE_VLLM_PLUGIN": "1"}


def prompts(*lengths: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, VOCAB_SIZE) for _ in range(n)] for n in lengths]


def tokens_of(result: dict) -> list[list[int]]:
    return [o["tokens"] for phase in result["phases"] for o in phase]


def run_with_and_without_atom(model: str, phases, max_tokens: int, llm_kwargs: dict,
                              **options) -> tuple[dict | VllmRunFailed, dict | VllmRunFailed]:
    """vLLM with ATOM and vLLM alone on the same cell, side by side; each a result, or the failure
    it stopped with."""
    def run(env):
        try:
            return run_vllm(model, phases, max_tokens, env=env, llm_kwargs=llm_kwargs, **options)
        except VllmRunFailed as failed:
            return failed

    with ThreadPoolExecutor(2) as pool:
        with_atom, alone = pool.map(run, [{}, ALONE])
    return with_atom, alone


def error_line(failed: VllmRunFailed) -> str:
    """The exception line a failed engine start ended with (vLLM's own error, not ATOM's)."""
    lines = [line for line in failed.log.splitlines() if "Error: " in line]
    return lines[-1].split("]: ")[-1].strip() if lines else failed.log[-300:]


def worst_prompt_logprob_diff(outputs: list[dict], prompts: list[list[int]], logits_of) -> float:
    """The largest difference between the engine's prompt log-probabilities and those of the
    reference ``logits_of(prompt)``, over all prompts."""
    from atom_core.testing.reference import prompt_logprobs

    return max(abs(a - b) for output, prompt in zip(outputs, prompts, strict=True)
               for a, b in zip(output["prompt_logprobs"], prompt_logprobs(logits_of(prompt), prompt)))


def assert_first_tokens_near_greedy(outputs: list[dict], prompts: list[list[int]], logits_of,
                                    tolerance: float) -> None:
    """Each engine's first generated token is the reference's greedy pick, or one whose
    log-probability under ``logits_of(prompt)`` lies within ``tolerance`` of it (a near tie that the
    two sides' rounding may break either way)."""
    for output, prompt in zip(outputs, prompts, strict=True):
        logprobs = logits_of(prompt)[-1].float().log_softmax(-1)
        token = output["tokens"][0]
        assert logprobs[token] > logprobs.max() - tolerance, (
            f"first token {token} is {float(logprobs.max() - logprobs[token]):.3f} below the greedy pick")


def assert_atom_served(result: dict) -> None:
    assert result["served_by"]["inner_class"].startswith("atom_core.models.")
    assert "ATOM hands" not in result["log"]
