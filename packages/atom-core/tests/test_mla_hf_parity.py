"""DeepSeek MLA models: ATOM logits equal HF transformers' (fp32) across the config variants that
change the code path. The tiny configs themselves (DeepseekV2: no q LoRA, softmax group-limited
routing; DeepseekV3: q LoRA, sigmoid noaux_tc routing over 4 groups; both YaRN with mscale) run in
test_hf_parity; these flip one feature each."""

import pytest
import torch
from test_hf_parity import assert_logits_close, assert_logits_match_hf, atom_batch_logits, atom_model, hf_logits

VARIANTS = [
    ("DeepseekV2ForCausalLM", {"q_lora_rank": 24}),
    ("DeepseekV2ForCausalLM", {"topk_method": "greedy"}),
    ("DeepseekV3ForCausalLM", {"q_lora_rank": None}),
    ("DeepseekV3ForCausalLM", {"rope_interleave": False}),
    # Kimi-K2 / Moonlight route over a single group.
    ("DeepseekV3ForCausalLM", {"n_group": 1, "topk_group": 1}),
    # Moonlight-16B-A3B's combination: no q LoRA, one group, two shared experts, plain rope.
    ("DeepseekV3ForCausalLM", {"q_lora_rank": None, "n_group": 1, "topk_group": 1, "n_shared_experts": 2,
                               "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}}),
]


@pytest.mark.parametrize(
    "architecture, overrides", VARIANTS,
    ids=["v2-q-lora", "v2-greedy", "v3-no-q-lora", "v3-neox-rope", "v3-one-group", "moonlight"],
)
def test_mla_logits_match_hf(tiny_model_dir, architecture, overrides):
    assert_logits_match_hf(tiny_model_dir(architecture, **overrides))


def test_v3_config_under_v2_name_matches_hf_v3(tiny_model_dir, tmp_path):
    """A DeepSeek-V3 checkpoint (``topk_method: noaux_tc``, as Kimi-K2's configs set it) whose config
    names ``DeepseekV2ForCausalLM``, the class vLLM builds Kimi-K2.5's language model with: ATOM's
    V2 class then routes and ropes as V3 (logits equal HF's V3 on the same weights) and loads the
    router's ``e_score_correction_bias``."""
    import json
    import shutil

    source = tiny_model_dir("DeepseekV3ForCausalLM")
    renamed = tmp_path / "v3-as-v2"
    shutil.copytree(source, renamed)
    config = json.loads((renamed / "config.json").read_text())
    config.update(architectures=["DeepseekV2ForCausalLM"], topk_method="noaux_tc", scoring_func="sigmoid")
    (renamed / "config.json").write_text(json.dumps(config))
    sequences, logits = atom_batch_logits(atom_model(str(renamed)), [7, 1, 23, 12], seed=1)
    assert_logits_close(logits, torch.cat(hf_logits(source, sequences)))
