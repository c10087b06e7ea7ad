"""Qwen3.5's language models (dense and MoE): ATOM's models (atom_core.models.qwen3_5) built
directly, against HF transformers' ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM`` on tiny random
checkpoints (fp32): text positions, M-RoPE positions as a host computes them for image tokens, and
TP=2. Served through vLLM inside vLLM's vision-language models: atom-vllm's test_qwen3_5_vllm.
"""

import pytest
import torch

pytest.importorskip("transformers.models.qwen3_5", reason="this transformers has no Qwen3.5")

from safetensors import safe_open  # noqa: E402
from test_hf_parity import assert_logits_close, atom_batch_logits, atom_model, hf_logits  # noqa: E402
from test_tensor_parallel import assert_tp_matches_single_rank, run_tp  # noqa: E402

from atom_core.layers.attention import standalone_batch  # noqa: E402
from atom_core.testing.hf_classes import hf_reference_model  # noqa: E402
from atom_core.testing.tiny_vision_language import LANGUAGE_MODEL_OF  # noqa: E402


@pytest.fixture(scope="module", params=sorted(LANGUAGE_MODEL_OF))
def model_dir(request, tiny_model_dir) -> str:
    return tiny_model_dir(request.param, random_norms=True)


def test_checkpoint_has_hub_layout(model_dir):
    """The unfused Gated DeltaNet projections ATOM fuses at load, as the hub ships them."""
    with safe_open(f"{model_dir}/model.safetensors", "pt") as f:
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    linear = "model.layers.0.linear_attn"
    assert shapes[f"{linear}.in_proj_qkv.weight"] == (2 * 2 * 16 + 4 * 24, 80)
    assert shapes[f"{linear}.in_proj_z.weight"] == (4 * 24, 80)
    assert shapes[f"{linear}.in_proj_b.weight"] == shapes[f"{linear}.in_proj_a.weight"] == (4, 80)
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (2 * 4 * 32, 80)
    assert ("model.layers.0.mlp.gate_proj.weight" in shapes
            or shapes["model.layers.0.mlp.experts.5.gate_proj.weight"] == (48, 80))


def test_logits_match_hf(model_dir):
    """Four sequences of 1 to 130 tokens, batched, vs HF one at a time."""
    sequences, logits = atom_batch_logits(atom_model(model_dir), [70, 1, 130, 23], seed=1)
    assert_logits_close(logits, torch.cat(hf_logits(model_dir, sequences)))


def image_like_positions(length: int, image_start: int, grid: tuple[int, int]) -> torch.Tensor:
    """M-RoPE positions [3, length] of a prompt with an image of ``grid`` (rows, columns) tokens
    from ``image_start``, as Qwen-VL processors lay them out: text tokens count up on all three
    axes; the image's tokens share one time position and walk its rows and columns; text after it
    resumes past the largest position."""
    rows, cols = grid
    text = torch.arange(image_start).expand(3, -1)
    image = torch.stack([torch.zeros(rows * cols, dtype=torch.long),
                         torch.arange(rows).repeat_interleave(cols),
                         torch.arange(cols).repeat(rows)]) + image_start
    after = length - image_start - rows * cols
    rest = torch.arange(after).expand(3, -1) + image.max() + 1
    return torch.cat([text, image, rest], dim=1)


def test_mrope_positions_match_hf(model_dir):
    """An image's tokens, whose three position axes differ: ATOM's rope gathers each frequency's
    axis (interleaved sections) as HF does. Run as a batch of two: one with an image, one of text
    only (its three axes equal, so as 1-D positions)."""
    generator = torch.Generator().manual_seed(2)
    lengths = [40, 9]
    ids = [torch.randint(4, 499, (n,), generator=generator) for n in lengths]
    positions = [image_like_positions(40, 5, (4, 6)), torch.arange(9).expand(3, -1)]
    model = atom_model(model_dir)
    with torch.no_grad(), standalone_batch(lengths):
        logits = model.compute_logits(model(torch.cat(ids), torch.cat(positions, dim=1)))
    hf = hf_reference_model(model_dir)
    with torch.no_grad():
        expected = torch.cat([hf(seq[None], position_ids=pos[:, None]).logits[0]
                              for seq, pos in zip(ids, positions)])
    assert_logits_close(logits, expected)
    # The positions matter: rope at text positions gives other logits for the image prompt.
    with torch.no_grad():
        text_only = hf(ids[0][None]).logits[0]
    assert (text_only - expected[:40]).abs().max() > 1e-2


def test_tp2_matches_single_rank(model_dir, tmp_path):
    """Two gloo ranks, each with half of every q, k, v, z, b and a section, two of the four
    attention heads, and half of each expert's (and the shared expert's) channels."""
    ranks = run_tp(2, [model_dir], tmp_path, atom_model)
    assert_tp_matches_single_rank(2, ranks, model_dir, atom_model)


def test_contiguous_mrope_sections_match_hf_qwen2_vl():
    """The other M-RoPE layout (``mrope_interleaved`` false: Qwen2-VL's contiguous runs of time,
    height and width frequencies) against HF's Qwen2-VL rotary embedding, full rotary over 32
    channels."""
    from transformers import Qwen2VLTextConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding, apply_rotary_pos_emb

    from atom_core.layers.rotary import RopeSpec, RotaryEmbedding

    heads, head_dim, tokens, sections = 2, 32, 11, [6, 5, 5]
    generator = torch.Generator().manual_seed(3)
    positions = torch.randint(0, 60, (3, tokens), generator=generator)
    q = torch.randn(tokens, heads * head_dim, generator=generator)
    k = torch.randn(tokens, heads * head_dim, generator=generator)
    rope = RotaryEmbedding(head_dim, head_dim, 64, RopeSpec(mrope_section=tuple(sections)))
    q_atom, k_atom = rope(positions, q, k)

    config = Qwen2VLTextConfig(hidden_size=heads * head_dim, num_attention_heads=heads, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections})
    cos, sin = Qwen2VLRotaryEmbedding(config)(q, positions[:, None])
    as_hf = lambda x: x.view(1, tokens, heads, head_dim).transpose(1, 2)  # noqa: E731
    q_hf, k_hf = apply_rotary_pos_emb(as_hf(q), as_hf(k), cos, sin)
    assert torch.allclose(q_atom, q_hf.transpose(1, 2).reshape(tokens, -1), atol=1e-5)
    assert torch.allclose(k_atom, k_hf.transpose(1, 2).reshape(tokens, -1), atol=1e-5)
