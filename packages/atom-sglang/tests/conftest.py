import os
import sys

from sglang_testing import SUPPORT_DIR

from atom_core.models import SUPPORTED_ARCHITECTURES
from atom_core.testing.fixtures import tiny_model_dir  # noqa: F401  (shared fixture)
from atom_core.testing.tiny_models import TINY_CONFIGS

# Tests that import SGLang in this process (no engine) need its CPU mode and the sgl_kernel stand-in.
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
sys.path.insert(0, SUPPORT_DIR)

# Three-way parity (SGLang+ATOM, SGLang alone, HF): Qwen3, Qwen3-MoE and the first further family
# atom-core implements, in this order.
FURTHER_FAMILIES = ["LlamaForCausalLM", "MixtralForCausalLM", "Glm4MoeForCausalLM"]
# SGLang+ATOM against HF only, for what the glue does differently: Mixtral's sliding window through
# ATOM's backend, DeepSeek-V3's MLA over SGLang's latent pool. Not here, to keep engine starts few:
# GLM4-MoE (the same glue as Qwen3-MoE); and not runnable: GPT-OSS (SGLang 0.5.17 accepts it only on
# attention backends that need a GPU or AMX), DeepSeek-V2 (HF's reference fails on group-limited
# routing in transformers 5.12).
ATOM_ONLY_FAMILIES = ["MixtralForCausalLM", "DeepseekV3ForCausalLM"]

# Features of atom-core's tiny checkpoints that SGLang 0.5.17's own models ignore, turned off so that
# the SGLang-alone baseline can match HF: Qwen3-MoE's ``mlp_only_layers`` (SGLang builds every layer
# sparse and leaves the experts of the dense layer uninitialised) and Llama's ``mlp_bias`` (SGLang's
# MLP has no bias). ATOM honours both; atom-core's HF parity test covers them.
TINY_OVERRIDES = {"Qwen3MoeForCausalLM": {"mlp_only_layers": []}, "LlamaForCausalLM": {"mlp_bias": False}}


def implemented(architectures: list[str]) -> list[str]:
    return [a for a in architectures if a in SUPPORTED_ARCHITECTURES and a in TINY_CONFIGS]


def parity_architectures() -> list[str]:
    return ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM", *implemented(FURTHER_FAMILIES)[:1]]


def atom_only_architectures() -> list[str]:
    return [a for a in implemented(ATOM_ONLY_FAMILIES) if a not in parity_architectures()]
