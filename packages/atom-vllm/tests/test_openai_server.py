"""vLLM's OpenAI-compatible server with ATOM active answers completions and chat completions."""

import pytest
import requests
from vllm_testing import openai_server

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    with openai_server(tiny_model_dir("Qwen3ForCausalLM"), tmp_path_factory.mktemp("server")) as running:
        yield running


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
