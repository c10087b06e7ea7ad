"""Qwen3-Next: ATOM's model (atom_core.models.qwen3_next) built directly, against HF transformers'
on a tiny random checkpoint (fp32). Served through vLLM: atom-vllm's test_qwen3_next_vllm.

HF runs its torch fallbacks of the conv and the chunked gated delta rule (without the optional
``causal_conv1d`` and ``flash-linear-attention`` packages), ATOM the torch references of
atom_kernels' ops; the batch has sequences shorter and longer than the kernels' 64-token chunk.
"""

import pytest
import torch

pytest.importorskip("transformers.models.qwen3_next", reason="this transformers has no Qwen3-Next")

from safetensors import safe_open  # noqa: E402
from test_hf_parity import assert_logits_close, atom_batch_logits, hf_logits  # noqa: E402
from test_tensor_parallel import assert_tp_matches_single_rank, run_tp  # noqa: E402
from transformers import AutoConfig  # noqa: E402

from atom_core import Config  # noqa: E402
from atom_core.hosting.hf_config import complete_hf_config  # noqa: E402
from atom_core.loader import iter_safetensors  # noqa: E402
from atom_core.models.qwen3_next import Qwen3NextForCausalLM  # noqa: E402

ARCHITECTURE = "Qwen3NextForCausalLM"


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> str:
    return tiny_model_dir(ARCHITECTURE, random_norms=True)


def atom_qwen3_next(model_dir: str) -> Qwen3NextForCausalLM:
    hf_config = complete_hf_config(AutoConfig.from_pretrained(model_dir),
                                   Qwen3NextForCausalLM.hf_defaults)
    model = Qwen3NextForCausalLM(Config(model=model_dir, hf_config=hf_config,
                                        torch_dtype=torch.float32))
    model.load_weights(iter_safetensors(model_dir))
    return model.eval()


def test_checkpoint_has_hub_layout(model_dir):
    """HF's save_pretrained writes the hub's names: per-expert tensors, the grouped q/k/v/z and b/a
    projections, the depthwise conv weight of q|k|v channels."""
    with safe_open(f"{model_dir}/model.safetensors", "pt") as f:
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    linear, full = "model.layers.0.linear_attn", "model.layers.1.self_attn"
    conv_channels = 2 * 2 * 16 + 4 * 24
    assert shapes[f"{linear}.in_proj_qkvz.weight"] == (conv_channels + 4 * 24, 80)
    assert shapes[f"{linear}.in_proj_ba.weight"] == (2 * 4, 80)
    assert shapes[f"{linear}.conv1d.weight"] == (conv_channels, 1, 4)
    assert shapes[f"{linear}.A_log"] == shapes[f"{linear}.dt_bias"] == (4,)
    assert shapes[f"{linear}.norm.weight"] == (24,)
    assert shapes[f"{full}.q_proj.weight"] == (2 * 4 * 32, 80)  # query and gate per head
    assert shapes["model.layers.0.mlp.experts.5.gate_proj.weight"] == (48, 80)
    assert shapes["model.layers.0.mlp.shared_expert.up_proj.weight"] == (40, 80)
    assert shapes["model.layers.0.mlp.shared_expert_gate.weight"] == (1, 80)
    assert "model.layers.2.mlp.gate_proj.weight" in shapes  # the dense layer


def test_logits_match_hf(model_dir):
    """Four sequences of 1 to 130 tokens, batched, vs HF one at a time."""
    sequences, logits = atom_batch_logits(atom_qwen3_next(model_dir), [70, 1, 130, 23], seed=1)
    assert_logits_close(logits, torch.cat(hf_logits(model_dir, sequences)))


def test_tp2_matches_single_rank(model_dir, tmp_path):
    """Two gloo ranks, each with one of the two key-head groups (q/k/v/z rows, conv channels per
    section, A_log and dt_bias by value head) and two of the four attention heads."""
    ranks = run_tp(2, [model_dir], tmp_path, atom_qwen3_next)
    assert_tp_matches_single_rank(2, ranks, model_dir, atom_qwen3_next)
