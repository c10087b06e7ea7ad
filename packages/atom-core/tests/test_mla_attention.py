"""MLA layer math: the absorbed decode and the expanded prefill over a paged latent cache give the
standalone (HF-checked) result; heads shard across TP ranks; DeepSeek checkpoints load strictly."""

import math

import pytest
import torch
from test_loader_errors import checkpoint, fresh_model

from atom_core.distributed import SINGLE_RANK, TPGroup, set_tp_group
from atom_core.layers import mla
from atom_core.layers.attention import standalone_batch
from atom_core.loader import CheckpointError

torch.set_default_dtype(torch.float32)

YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32,
            mscale=1.0, mscale_all_dim=0.8, beta_fast=32.0, beta_slow=1.0, partial_rotary_factor=1.0)
HIDDEN, HEADS, NOPE, ROPE, V, Q_LORA, KV_LORA = 64, 4, 16, 8, 12, 24, 32


class RecordingLatentAttention(mla.StandaloneLatentAttention):
    """The standalone (expanded, cache-less) implementation, keeping its inputs and output."""

    def forward(self, positions, q, kv_c, k_pe):
        out = super().forward(positions, q, kv_c, k_pe)
        self.record = (positions, q, kv_c, k_pe, out)
        return out


@pytest.fixture
def recording_factory():
    mla.set_latent_attention_factory(RecordingLatentAttention)
    yield
    mla.set_latent_attention_factory(mla.StandaloneLatentAttention)


def make_layer(q_lora_rank=Q_LORA, seed=0) -> mla.MultiHeadLatentAttention:
    layer = mla.MultiHeadLatentAttention(
        HIDDEN, HEADS, NOPE, ROPE, V, q_lora_rank, KV_LORA, YARN, max_position=256, layer_id=0, prefix="layer"
    )
    generator = torch.Generator().manual_seed(seed)
    for _, param in weights(layer):
        param.data = torch.randn(param.shape, generator=generator) * 0.3
    return layer


def weights(module: torch.nn.Module):
    """The named parameters a checkpoint fills: not the KV-cache scales, which stay absent (-1) as in
    a checkpoint without them (an FP8 cache would apply them; these layers keep no cache)."""
    return [(name, p) for name, p in module.named_parameters() if not name.endswith(("attn.k_scale", "attn.v_scale"))]


def run_standalone(layer, lengths, seed=1):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lengths), HIDDEN, generator=generator)
    positions = torch.cat([torch.arange(n) for n in lengths])
    with torch.no_grad(), standalone_batch(lengths):
        return layer(positions, x)


def test_absorbed_decode_and_chunked_prefill_over_the_paged_cache_match_standalone(recording_factory):
    """Replays vLLM's flow with the functions ATOM's MLA backends use: sequences are prefilled in a
    first chunk, then either decode one token (absorbed) or extend with a second chunk (expanded over
    the context gathered from the cache)."""
    layer = make_layer()
    lengths, first_chunk = [9, 20, 6, 1 + 17], [8, 13, 6, 1]  # seq 0 decodes its 9th token
    run_standalone(layer, lengths)
    positions, q, kv_c, k_pe, expected = layer.attn.impl.record
    spec = layer.attn.spec
    starts = [0, *torch.tensor(lengths).cumsum(0).tolist()]

    block_size, blocks_per_seq = 4, 5
    block_table = torch.randperm(len(lengths) * blocks_per_seq + 3)[: len(lengths) * blocks_per_seq]
    block_table = block_table.view(len(lengths), blocks_per_seq).int()
    kv_cache = torch.full((block_table.max() + 1, block_size, spec.latent_dim), float("nan"))

    def tokens(seq, lo, hi):
        return torch.arange(starts[seq] + lo, starts[seq] + hi)

    def slots(seq, lo, hi):
        pos = torch.arange(lo, hi)
        return block_table[seq, pos // block_size].long() * block_size + pos % block_size

    def prefill(seqs, query_ranges):
        """Expanded attention of the given query ranges over each sequence's cached context."""
        idx = torch.cat([tokens(s, lo, hi) for s, (lo, hi) in zip(seqs, query_ranges)])
        slot_mapping = torch.cat([slots(s, lo, hi) for s, (lo, hi) in zip(seqs, query_ranges)])
        q_full = mla.rope_and_cache(spec, positions[idx], q[idx, :, :NOPE], q[idx, :, NOPE:], kv_c[idx],
                                    k_pe[idx], kv_cache, slot_mapping)
        cached = torch.cat([slots(s, 0, hi) for s, (_, hi) in zip(seqs, query_ranges)])
        latent = kv_cache.view(-1, spec.latent_dim)[cached]
        cu_q = torch.tensor([0, *torch.tensor([hi - lo for lo, hi in query_ranges]).cumsum(0).tolist()]).int()
        cu_k = torch.tensor([0, *torch.tensor([hi for _, hi in query_ranges]).cumsum(0).tolist()]).int()
        return idx, mla.mla_prefill(spec, q_full, latent, cu_q, cu_k)

    # Step 1: every sequence's first chunk (sequence 3's is a single token with no context).
    idx, out = prefill(range(4), [(0, c) for c in first_chunk])
    torch.testing.assert_close(out, expected[idx], rtol=1e-5, atol=1e-5)

    # Step 2a: sequence 0 decodes: absorbed query over the latent cache.
    idx = tokens(0, 8, 9)
    q_latent = mla.rope_and_cache(spec, positions[idx], mla.absorb_q(spec, q[idx, :, :NOPE]), q[idx, :, NOPE:],
                                  kv_c[idx], k_pe[idx], kv_cache, slots(0, 8, 9))
    assert q_latent.shape == (1, HEADS, KV_LORA + ROPE)
    out = mla.mla_decode(spec, q_latent, kv_cache, torch.tensor([0, 1]).int(), torch.tensor([9]).int(),
                         block_table[:1])
    torch.testing.assert_close(out, expected[idx], rtol=1e-5, atol=1e-5)

    # Step 2b: sequences 1 and 3 extend over their cached first chunks (a chunked prefill).
    idx, out = prefill([1, 3], [(13, 20), (1, 18)])
    torch.testing.assert_close(out, expected[idx], rtol=1e-5, atol=1e-5)


def test_heads_shard_across_tensor_parallel_ranks(recording_factory):
    """Two TP ranks each hold half the heads; the sum of their (un-reduced) row-parallel outputs is
    the single-rank output."""
    lengths = [5, 11]
    full = run_standalone(make_layer(), lengths)
    reference = make_layer()
    partials = []
    for rank in range(2):
        set_tp_group(TPGroup(rank, 2, lambda x: x, lambda x, dim: x))
        try:
            shard = mla.MultiHeadLatentAttention(
                HIDDEN, HEADS, NOPE, ROPE, V, Q_LORA, KV_LORA, YARN, 256, 0, f"layer{rank}"
            )
        finally:
            set_tp_group(SINGLE_RANK)
        for (name, param), (_, ref) in zip(weights(shard), weights(reference)):
            param.data = torch.empty(param.shape)
            param.weight_loader(param, ref.data, None)
        assert shard.attn.spec.num_heads == HEADS // 2
        partials.append(run_standalone(shard, lengths))
    torch.testing.assert_close(partials[0] + partials[1], full, rtol=1e-5, atol=1e-5)


def test_softmax_scale_carries_deepseek_yarn_mscale():
    default = {"rope_type": "default", "rope_theta": 10000.0}
    assert mla.mla_softmax_scale(192, default) == 192**-0.5
    mscale = 0.1 * 0.8 * math.log(4.0) + 1.0
    assert mla.mla_softmax_scale(24, YARN) == pytest.approx(24**-0.5 * mscale**2, rel=1e-12)


@pytest.mark.parametrize("architecture, missing", [
    ("DeepseekV2ForCausalLM", "model.layers.1.self_attn.kv_b_proj.weight"),
    ("DeepseekV2ForCausalLM", "model.layers.0.self_attn.q_proj.weight"),
    ("DeepseekV3ForCausalLM", "model.layers.2.self_attn.q_a_layernorm.weight"),
    ("DeepseekV3ForCausalLM", "model.layers.1.mlp.gate.e_score_correction_bias"),
    ("DeepseekV3ForCausalLM", "model.layers.2.mlp.experts.7.down_proj.weight"),
    ("DeepseekV3ForCausalLM", "model.layers.1.mlp.shared_experts.up_proj.weight"),
])
def test_missing_deepseek_tensor_is_named(tiny_model_dir, architecture, missing):
    model_dir = tiny_model_dir(architecture)
    weights = checkpoint(model_dir)
    del weights[missing]
    with pytest.raises(CheckpointError, match=f"missing tensor '{missing}'"):
        fresh_model(model_dir).load_weights(weights.items())


def test_q_proj_is_rejected_when_the_config_has_q_lora(tiny_model_dir):
    model_dir = tiny_model_dir("DeepseekV3ForCausalLM")
    weights = checkpoint(model_dir)
    weights["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(HEADS * 24, 80)
    with pytest.raises(CheckpointError, match="'model.layers.0.self_attn.q_proj.weight'"):
        fresh_model(model_dir).load_weights(weights.items())


def test_multi_token_prediction_layers_are_skipped(tiny_model_dir):
    """DeepSeek-V3 hub checkpoints carry num_nextn_predict_layers MTP layers after the last layer."""
    model_dir = tiny_model_dir("DeepseekV3ForCausalLM", num_nextn_predict_layers=1)
    checkpoint_weights = checkpoint(model_dir)
    checkpoint_weights["model.layers.3.eh_proj.weight"] = torch.zeros(80, 160)
    model = fresh_model(model_dir)
    for _, param in weights(model):
        param.data.fill_(float("nan"))
    loaded = model.load_weights(checkpoint_weights.items())
    assert loaded == {name for name, _ in model.named_parameters()}
    assert not any(torch.isnan(p).any() for p in model.parameters())


def test_piecewise_compile_splits_at_every_latent_attention(tiny_model_dir, tmp_path, monkeypatch, caplog):
    """Under ATOM's torch.compile the latent attention is an opaque split point
    (atom::unified_latent_attention), as the MHA attention is; compiled logits equal eager ones."""
    from test_compile import build, logits

    from atom_core.config import CompilationLevel
    from atom_core.log import logger

    monkeypatch.setenv("ATOM_CACHE_DIR", str(tmp_path))
    model_dir = tiny_model_dir("DeepseekV3ForCausalLM")
    eager = build(model_dir, CompilationLevel.NO_COMPILATION)
    compiled = build(model_dir, CompilationLevel.PIECEWISE)
    logger.propagate = True
    try:
        with caplog.at_level("INFO", logger="atom"):
            for seed, lengths in enumerate([[7, 1, 23, 12], [5, 9]]):
                expected, got = logits(eager, lengths, seed), logits(compiled, lengths, seed)
                rel = ((got - expected).norm() / expected.norm()).item()
                assert rel <= 1e-5, f"lengths {lengths}: relative error {rel:.2e}"
    finally:
        logger.propagate = False
    num_layers = len(compiled.model.layers)
    assert f"{num_layers} attention split points, {num_layers + 1} compiled pieces" in caplog.text
