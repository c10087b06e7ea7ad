"""DeepSeek MLA models: ATOM logits equal HF transformers' (fp32) across the config variants that
change the code path. The tiny configs themselves (DeepseekV2: no q LoRA, softmax group-limited
routing; DeepseekV3: q LoRA, sigmoid noaux_tc routing over 4 groups; both YaRN with mscale) run in
test_hf_parity; these flip one feature each."""

import pytest
from test_hf_parity import assert_logits_match_hf

VARIANTS = [
    ("DeepseekV2ForCausalLM", {"q_lora_rank": 24}),
    ("DeepseekV2ForCausalLM", {"topk_method": "greedy"}),
    ("DeepseekV3ForCausalLM", {"q_lora_rank": None}),
    ("DeepseekV3ForCausalLM", {"rope_interleave": False}),
    # Kimi-K2 / Moonlight route over a single group.
    ("DeepseekV3ForCausalLM", {"n_group": 1, "topk_group": 1}),
]


@pytest.mark.parametrize(
    "architecture, overrides", VARIANTS,
    ids=["v2-q-lora", "v2-greedy", "v3-no-q-lora", "v3-neox-rope", "v3-one-group"],
)
def test_mla_logits_match_hf(tiny_model_dir, architecture, overrides):
    assert_logits_match_hf(tiny_model_dir(architecture, **overrides))
