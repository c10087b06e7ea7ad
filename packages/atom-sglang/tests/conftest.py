import pytest

from atom_core.models import SUPPORTED_ARCHITECTURES
from atom_core.testing.tiny_models import TINY_CONFIGS, build_tiny_model

# Qwen3 (dense), Qwen3-MoE, and the first further family atom-core implements, in this order.
FURTHER_FAMILIES = ["LlamaForCausalLM", "MixtralForCausalLM", "Glm4MoeForCausalLM", "GptOssForCausalLM",
                    "DeepseekV3ForCausalLM"]
# Features of atom-core's tiny checkpoints that SGLang 0.5.17's own models ignore, turned off so that
# the SGLang-alone baseline can match HF: Qwen3-MoE's ``mlp_only_layers`` (SGLang builds every layer
# sparse and leaves the experts of the dense layer uninitialised) and Llama's ``mlp_bias`` (SGLang's
# MLP has no bias). ATOM honours both; atom-core's HF parity test covers them.
TINY_OVERRIDES = {"Qwen3MoeForCausalLM": {"mlp_only_layers": []}, "LlamaForCausalLM": {"mlp_bias": False}}


def parity_architectures() -> list[str]:
    further = [a for a in FURTHER_FAMILIES if a in SUPPORTED_ARCHITECTURES and a in TINY_CONFIGS]
    return ["Qwen3ForCausalLM", "Qwen3MoeForCausalLM", *further[:1]]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    """Architecture -> directory of a tiny random checkpoint, for every parity architecture."""
    return {arch: build_tiny_model(arch, str(tmp_path_factory.mktemp(arch)), **TINY_OVERRIDES.get(arch, {}))
            for arch in parity_architectures()}
