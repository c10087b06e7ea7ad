"""``python -m sglang.launch_server`` on 127.0.0.1 with ATOM active and no ATOM-specific flag:
``/generate`` and ``/v1/completions`` answer, with ATOM's model and attention serving."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from sglang_testing import free_port, sglang_env

from atom_core.testing.reference import hf_greedy

pytestmark = pytest.mark.sglang

PROMPT_IDS = [17, 120, 33, 250, 9, 77, 301, 5, 42]
MAX_TOKENS = 32


def post(url: str, payload: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(payload).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    model = tiny_model_dir("Qwen3ForCausalLM")
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    command = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1",
               "--port", str(port), "--device", "cpu", "--dtype", "float32", "--mem-fraction-static", "0.2",
               "--max-total-tokens", "4096", "--disable-cuda-graph", "--random-seed", "0"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, env=sglang_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, f"server exited (rc={proc.returncode}):\n{log_path.read_text()[-6000:]}"
            assert time.monotonic() < deadline, f"server not ready:\n{log_path.read_text()[-6000:]}"
            try:
                with urllib.request.urlopen(base + "/health_generate", timeout=30) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(2)
        yield base, model, log_path
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_generate_matches_hf(server):
    base, model, log_path = server
    out = post(base + "/generate", {"input_ids": PROMPT_IDS, "sampling_params": {
        "temperature": 0, "max_new_tokens": MAX_TOKENS, "ignore_eos": True}})
    assert out["output_ids"] == hf_greedy(model, [PROMPT_IDS], MAX_TOKENS)[0]
    log = log_path.read_text()
    assert "INFO atom: Use ATOM model atom_core.models.qwen3.Qwen3ForCausalLM for Qwen3ForCausalLM" in log
    assert "INFO atom: Use atom attention backend for SGLang" in log


def test_openai_completions(server):
    base, model, _ = server
    params = {"temperature": 0, "max_tokens": 16, "ignore_eos": True}
    out = post(base + "/v1/completions", {"model": model, "prompt": "The quick brown fox", **params})
    assert out["object"] == "text_completion"
    assert out["usage"]["completion_tokens"] == 16
    text = out["choices"][0]["text"]
    assert text
    native = post(base + "/generate", {"text": "The quick brown fox", "sampling_params": {
        "temperature": 0, "max_new_tokens": 16, "ignore_eos": True}})
    assert native["text"] == text
