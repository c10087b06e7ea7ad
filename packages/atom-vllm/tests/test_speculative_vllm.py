"""Speculative decoding through real vLLM (CPU): what ATOM serves and what it hands back
(atom_core.hosting.takeover.SERVED_SPECULATION).

vLLM's n-gram proposer needs no draft model: ATOM's model verifies the drafted tokens as a short
extend. A draft model is built of vLLM's own layers: DeepSeek's multi-token-prediction (MTP) layer is
vLLM's MLA layer, which ATOM's MLA backend, chosen for it before this check, failed to construct
(``ATOMMLAImpl.__init__() got an unexpected keyword argument 'num_heads'``), so a server that starts
without ATOM did not start with it.
"""

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from vllm_testing import (
    VllmRunFailed,
    assert_atom_served,
    error_line,
    hf_greedy,
    run_vllm,
    run_with_and_without_atom,
    tokens_of,
)

from atom_vllm.version import vllm_release

pytestmark = pytest.mark.vllm

MAX_TOKENS = 12
# Prompts that repeat themselves, so that the n-gram proposer finds drafts in them.
REPEATING = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7], [20, 21, 22, 23, 24, 20, 21, 22, 23, 24, 20, 21],
             list(range(30, 47))]


@pytest.mark.xfail(vllm_release() == (0, 30), strict=True, raises=VllmRunFailed,
                   reason="vLLM 0.30 alone fails the same way on CPU: its rejection sampler's Triton launcher "
                          "raises 'Cannot inspect kernel parameters' (docs/host-versions.md)")
def test_ngram_speculation_served_by_atom(tiny_model_dir):
    """Drafts are proposed and some accepted; greedy tokens stay HF's (speculation is lossless)."""
    model = tiny_model_dir("Qwen3ForCausalLM")
    speculative = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    result = run_vllm(model, [REPEATING], MAX_TOKENS,
                      llm_kwargs={"speculative_config": speculative, "disable_log_stats": False})
    assert_atom_served(result)
    assert result["counters"]["vllm:spec_decode_num_draft_tokens"] > 0
    assert result["counters"]["vllm:spec_decode_num_accepted_tokens"] > 0
    assert tokens_of(result) == hf_greedy(model, REPEATING, MAX_TOKENS)


def with_mtp_layer(source: str, out_dir: str) -> str:
    """The DeepSeek-V3 checkpoint at ``source`` with one MTP layer appended as the Hub checkpoints
    carry it (``num_nextn_predict_layers: 1``; layer N = ``num_hidden_layers``: a decoder layer, here
    a copy of the last one, with ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head`` and its own
    ``embed_tokens``)."""
    shutil.copytree(source, out_dir, ignore=shutil.ignore_patterns("model.safetensors"))
    with open(os.path.join(out_dir, "config.json")) as f:
        config = json.load(f)
    config["num_nextn_predict_layers"] = 1
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tensors = load_file(os.path.join(source, "model.safetensors"))
    last, mtp = f"model.layers.{config['num_hidden_layers'] - 1}.", f"model.layers.{config['num_hidden_layers']}."
    tensors |= {mtp + name[len(last):]: tensor.clone() for name, tensor in tensors.items() if name.startswith(last)}
    hidden = config["hidden_size"]
    tensors |= {
        mtp + "enorm.weight": torch.ones(hidden), mtp + "hnorm.weight": torch.ones(hidden),
        mtp + "eh_proj.weight": torch.randn(hidden, 2 * hidden, generator=torch.Generator().manual_seed(0)) * 0.1,
        mtp + "shared_head.norm.weight": torch.ones(hidden),
        mtp + "shared_head.head.weight": tensors["lm_head.weight"].clone(),
        mtp + "embed_tokens.weight": tensors["model.embed_tokens.weight"].clone(),
    }
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def test_mtp_speculation_is_handed_back(tiny_model_dir, tmp_path):
    """DeepSeek-V3 with its MTP layer as the draft: ATOM hands the model back, and vLLM with ATOM
    installed does what vLLM alone does (on vLLM 0.26's CPU build both stop: it has no MLA backend
    on CPU; where vLLM serves it, both give the same tokens)."""
    model = with_mtp_layer(tiny_model_dir("DeepseekV3ForCausalLM"), str(tmp_path / "mtp"))
    speculative = {"method": "deepseek_mtp", "num_speculative_tokens": 1}
    with_atom, alone = run_with_and_without_atom(model, [REPEATING], MAX_TOKENS,
                                                 {"speculative_config": speculative})
    def log(result) -> str:
        return result.log if isinstance(result, VllmRunFailed) else result["log"]

    assert ("INFO atom: ATOM hands DeepseekV3ForCausalLM back to vLLM: speculative decoding by 'mtp' is not "
            "supported (ATOM serves vLLM's n-gram proposer only)") in log(with_atom)
    assert type(with_atom) is type(alone)
    if isinstance(alone, VllmRunFailed):
        assert error_line(with_atom) == error_line(alone)
    else:
        assert tokens_of(with_atom) == tokens_of(alone)
