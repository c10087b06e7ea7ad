"""A bounded soak of vLLM's OpenAI server with ATOM serving: 64 concurrent clients mixing valid
completions with malformed ones. The server stays healthy, refuses what vLLM refuses, answers the
token id past the vocabulary, and every valid request's greedy tokens equal those of the same request
sent alone.

Tiny Qwen3 with YaRN (max_position_embeddings 64, factor 4; vLLM allows 256 positions), so a valid
prompt may run past max_position_embeddings.
"""

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from vllm_testing import openai_server

from atom_core.testing.tiny_models import VOCAB_SIZE

pytestmark = pytest.mark.vllm

CLIENTS = 64
REQUESTS_PER_CLIENT = 3
MAX_TOKENS = 8


def valid_prompts() -> list[list[int]]:
    rng = random.Random(0)
    lengths = [1, 5, 23, 64, 65, 150, 200, 9]
    return [[rng.randrange(4, VOCAB_SIZE) for _ in range(n)] for n in lengths]


# Malformed prompts: (name, prompt, whether vLLM answers it).
MALFORMED = [
    ("token id past the vocabulary", [7, VOCAB_SIZE, 9], True),
    ("longer than max_model_len", [5] * 300, False),
    ("negative token id", [5, -1, 6], False),
    ("empty prompt", [], False),
]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    model = tiny_model_dir("Qwen3ForCausalLM", max_position_embeddings=64, rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0})
    with openai_server(model, tmp_path_factory.mktemp("soak"), "--max-num-seqs", "32") as running:
        yield running


def complete(base: str, prompt: list[int]) -> requests.Response:
    return requests.post(f"{base}/v1/completions", json={
        "model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True,
    }, timeout=300)


def tokens(response: requests.Response) -> list[int]:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"]


def test_soak(server):
    base, log_path = server
    prompts = valid_prompts()
    alone = [tokens(complete(base, p)) for p in prompts]

    rng = random.Random(1)
    jobs = [(rng.randrange(len(prompts) + len(MALFORMED))) for _ in range(CLIENTS * REQUESTS_PER_CLIENT)]

    def send(job: int):
        if job < len(prompts):
            return job, complete(base, prompts[job])
        return job, complete(base, MALFORMED[job - len(prompts)][1])

    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(send, jobs))

    seen_malformed = set()
    for job, response in results:
        if job < len(prompts):
            assert tokens(response) == alone[job], f"prompt {job} differs under load"
            continue
        name, _, answered = MALFORMED[job - len(prompts)]
        seen_malformed.add(name)
        if answered:
            assert len(tokens(response)) == MAX_TOKENS, name
        else:
            assert response.status_code == 400, f"{name}: {response.status_code} {response.text}"
    assert seen_malformed == {name for name, _, _ in MALFORMED}
    assert requests.get(f"{base}/health", timeout=10).status_code == 200
    assert [tokens(complete(base, p)) for p in prompts] == alone
    log = log_path.read_text()
    assert "INFO atom: Use ATOM model atom_core.models.qwen3.Qwen3ForCausalLM" in log
    assert "EngineDeadError" not in log and "Traceback" not in log
