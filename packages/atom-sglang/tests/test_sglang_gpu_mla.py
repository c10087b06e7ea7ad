"""GPU: ATOM's MLA model on SGLang's MLA attention backends, which take the rope part in two forms.

SGLang's DeepSeek hands FlashAttention-3 (SGLang's default on Hopper) and the other backends of its
``FORWARD_ABSORB_CORE_ATTENTION_BACKENDS`` the latent and the rope part apart (``q_rope`` /
``k_rope``: their MLA cache write needs ``k_rope``), the others (triton) concatenated. On the first
H200 start of SGLang + ATOM with DeepSeek-V2-Lite, ATOM passed the concatenated form to FA3 and the
engine died while capturing its decode CUDA graphs. Here a tiny bf16 DeepSeek-V2 at the real latent
widths (FA3's MLA mode takes a 512-wide latent and 64 rope dims) serves whole prefills, 16-token
chunked-prefill extends mixed with decodes, radix-cache hits and decodes on fa3 and on triton. A
wrong form gives garbage or a crash; both forms attend over the same cached latents, so the greedy
tokens agree up to bf16 rounding: the first token of all prompts but at most one.
"""

import random

import pytest
import torch
from sglang_testing import run_sglang

from atom_sglang.served_by import describe_served_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.sglang,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MLA_WIDTHS = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "head_dim": 64}


def test_mla_on_fa3_and_triton(tiny_model_dir):
    rng = random.Random(0)
    tokens = lambda n: [rng.randrange(4, 499) for _ in range(n)]  # noqa: E731
    shared = tokens(48)
    phases = [[tokens(n) for n in (1, 5, 23, 70)] + [shared + tokens(22)],
              [shared + tokens(3), shared + tokens(40)]]
    model = tiny_model_dir("DeepseekV2ForCausalLM", **MLA_WIDTHS)

    def run(backend: str) -> dict:
        return {"model": model, "phases": phases, "max_tokens": 8, "engine_kwargs": {
            "device": "cuda", "dtype": "bfloat16", "disable_cuda_graph": False, "mem_fraction_static": 0.2,
            "chunked_prefill_size": 16, "enable_mixed_chunk": True, "attention_backend": backend,
        }}

    [[fa3, triton]] = run_sglang(([run("fa3"), run("triton")], {}), cpu_engine=False)
    outputs = {}
    for result, backend in ((fa3, "fa3"), (triton, "triton")):
        assert describe_served_model(result["log"], result)["atom_model"].startswith("atom_core.models.")
        assert result["attention_backend"] == backend
        assert all(o["cached_tokens"] >= 48 for o in result["phases"][1])
        outputs[backend] = [o["tokens"] for phase in result["phases"] for o in phase]
        assert all(len(t) == 8 for t in outputs[backend])
    differing = sum(a[0] != b[0] for a, b in zip(outputs["fa3"], outputs["triton"], strict=True))
    assert differing <= 1, outputs
