"""vLLM's OpenAI-compatible server with ATOM active answers completions and chat completions.

On the CPU build `vllm serve` looks up the wrong distribution name, so the server module is started
directly; the GPU `vllm` wheel's `vllm serve` runs the same code.
"""

import os
import socket
import subprocess
import sys
import time

import pytest
import requests

pytestmark = pytest.mark.vllm


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    model = tiny_model_dir("Qwen3ForCausalLM")
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
             "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
             "--max-model-len", "256", "--enforce-eager", "--served-model-name", "tiny"],
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


def test_completions(server):
    base, log_path = server
    response = requests.post(f"{base}/v1/completions", json={
        "model": "tiny", "prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0,
        "ignore_eos": True,
    }, timeout=120)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"]["completion_tokens"] == 12
    assert body["choices"][0]["text"]
    log = log_path.read_text()
    assert "INFO atom: Use ATOM model atom_core.models.qwen3.Qwen3ForCausalLM" in log
    assert "INFO atom: Use atom attention backend" in log


def test_chat_completions(server):
    base, _ = server
    response = requests.post(f"{base}/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "Tell me about paged attention"}],
        "max_tokens": 9, "temperature": 0, "ignore_eos": True,
    }, timeout=120)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"]["completion_tokens"] == 9
    assert body["choices"][0]["message"]["role"] == "assistant"
