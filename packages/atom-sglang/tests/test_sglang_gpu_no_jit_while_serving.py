"""GPU: once SGLang+ATOM has started, serving compiles no ATOM Triton kernel.

On a fresh H200, SGLang+ATOM served at 0.82x (Qwen3-8B) and 0.76x (Qwen3-30B-A3B) of SGLang alone
and at parity on a second start: ATOM's prefill attention, extend attention and fused MoE tiles of
prefill sizes compiled while serving. At 46e41df Qwen3-30B-A3B-FP8's first pass still ran at 0.83x its
timed one. Here tiny bf16 Qwen3 and Qwen3-MoE models and a block-FP8 Qwen3-MoE, with SGLang's decode
CUDA graphs, a fresh Triton cache and 16-token chunked prefill with mixed chunks, serve whole
prefills, chunked-prefill extends with decodes in the same batch, radix-cache hits and decodes; a tiny
DeepSeek-V2 the same on ATOM's latent attention over an FP8 latent pool. Every
process of the engine logs its Triton compiles in the form of vLLM's JIT monitor
(atom_core.testing.jit_monitor); none logged after the engine was ready may be an ATOM kernel, and
the start-up must have logged some (so the check reached SGLang's scheduler process).
"""

import random

import pytest
import torch
from sglang_testing import run_sglang

from atom_core.testing.fp8_checkpoints import write_tiny_fp8_checkpoint
from atom_core.testing.jit_monitor import atom_kernels_compiled
from atom_sglang.served_by import describe_served_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.sglang,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("architecture, form", [("Qwen3ForCausalLM", "bf16"), ("Qwen3MoeForCausalLM", "bf16"),
                                                ("Qwen3MoeForCausalLM", "fp8-block"),
                                                ("DeepseekV2ForCausalLM", "fp8-latent-pool")])
def test_serving_mix_compiles_no_atom_kernel(tiny_model_dir, tmp_path, architecture, form):
    if form == "fp8-block":
        model = write_tiny_fp8_checkpoint(tiny_model_dir, architecture, str(tmp_path / "fp8"), form)
    else:
        model = tiny_model_dir(architecture)
    rng = random.Random(0)
    tokens = lambda n: [rng.randrange(4, 499) for _ in range(n)]  # noqa: E731
    shared = tokens(48)
    phases = [[tokens(n) for n in (1, 5, 23, 70, 130)] + [shared + tokens(22)],
              [shared + tokens(3), shared + tokens(40)]]
    run = {"model": model, "phases": phases, "max_tokens": 16, "engine_kwargs": {
        "device": "cuda", "dtype": "bfloat16", "disable_cuda_graph": False, "mem_fraction_static": 0.2,
        "chunked_prefill_size": 16, "enable_mixed_chunk": True,
        # ATOM's backend by name: where SGLang's default is FlashAttention-3 (Hopper), that stays the
        # default (atom_sglang.patches.FASTER_HOST_DEFAULTS).
        "attention_backend": "atom",
        # MLA: ATOM's latent attention over an FP8 latent pool (atom_sglang.attention.latent).
        "kv_cache_dtype": "fp8_e4m3" if form == "fp8-latent-pool" else "auto",
    }}
    env = {"ATOM_TEST_LOG_TRITON_COMPILES": "1", "TRITON_CACHE_DIR": str(tmp_path / "triton")}
    [[result]] = run_sglang(([run], env), cpu_engine=False)
    assert describe_served_model(result["log"], result)["architecture"] == architecture
    assert result["attention_backend"] == "atom"
    assert all(len(o["tokens"]) == 16 for phase in result["phases"] for o in phase)
    assert all(o["cached_tokens"] >= 48 for o in result["phases"][1])
    assert "Warm-up before serving: prefill and extend attention kernels" in result["startup_log"]
    assert atom_kernels_compiled(result["startup_log"])
    compiled = atom_kernels_compiled(result["serving_log"])
    assert not compiled, f"ATOM kernels compiled while serving: {compiled}"
