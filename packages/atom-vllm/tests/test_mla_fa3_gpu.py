"""On Hopper, vLLM's FlashAttention-3 as ATOM's MLA attention core (atom_vllm.attention.mla_fa3)
computes what ATOM's own kernels compute: the expanded prefill (fresh prompts and prompts over a
cached context) and the absorbed decode over a paged latent cache, also for short extends (several
new tokens a sequence), which the backend runs as decodes. Skipped without such a GPU."""

import pytest
import torch
from vllm.config import VllmConfig

import atom_kernels
from atom_core.layers.linear import ColumnParallelLinear
from atom_core.layers.mla import LatentAttentionSpec, absorb_q, mla_prefill, up_project_v
from atom_vllm.attention import mla_fa3

NOPE, ROPE, V, RANK, BLOCK = 128, 64, 128, 512, 16

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and mla_fa3._fa3_supports_mla()), reason="needs vLLM's FA3 MLA (sm90)"
)


def make_spec(heads: int) -> LatentAttentionSpec:
    kv_b_proj = ColumnParallelLinear(RANK, heads * (NOPE + V)).to("cuda", torch.bfloat16)
    kv_b_proj.weight.data.normal_(std=RANK**-0.5)
    return LatentAttentionSpec(
        num_heads=heads, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=V, kv_lora_rank=RANK,
        scale=(NOPE + ROPE) ** -0.5, prefix="layer", layer_id=0, kv_b_proj=kv_b_proj, rotary_emb=None,
    )


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.mark.parametrize("heads", [16, 128])
def test_prefill_matches_atom_kernels(heads):
    spec = make_spec(heads)
    # A fresh 37-token prompt, then 300 new tokens over 211 cached ones.
    query_lens, context_lens = [37, 300], [37, 511]
    cu_q = torch.tensor([0, 37, 337], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 37, 548], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(query_lens), heads, NOPE + ROPE, device="cuda", dtype=torch.bfloat16)
    latent = torch.randn(sum(context_lens), RANK + ROPE, device="cuda", dtype=torch.bfloat16)
    want = mla_prefill(spec, q, latent, cu_q, cu_k)
    got = torch.full_like(want, float("nan"))
    mla_fa3.prefill(spec, q, latent, cu_q, cu_k, max(query_lens), max(context_lens), got)
    assert relative_error(got, want) < 1e-2


@pytest.mark.parametrize("heads", [16, 128])
def test_decode_matches_atom_kernels(heads):
    spec = make_spec(heads)
    seq_lens = torch.tensor([1, 17, 300, 2049], dtype=torch.int32, device="cuda")
    blocks_per_seq = -(-int(seq_lens.max()) // BLOCK)
    num_blocks = len(seq_lens) * blocks_per_seq
    block_table = torch.randperm(num_blocks, device="cuda").view(len(seq_lens), -1).to(torch.int32)
    cache = torch.randn(num_blocks, BLOCK, RANK + ROPE, device="cuda", dtype=torch.bfloat16)
    q_latent = torch.randn(len(seq_lens), heads, RANK + ROPE, device="cuda", dtype=torch.bfloat16)
    query_start_loc = torch.arange(len(seq_lens) + 1, dtype=torch.int32, device="cuda")
    max_seq_len = int(seq_lens.max())
    want = atom_kernels.mla_decode(q_latent, cache, query_start_loc, seq_lens, block_table, spec.scale, RANK,
                                   max_seq_len=max_seq_len)
    got = mla_fa3.decode(spec, q_latent, cache, query_start_loc, seq_lens, block_table, max_seq_len, None, 0)
    assert got.shape == want.shape
    assert relative_error(got, want) < 1e-2


@pytest.mark.parametrize("scheduled", [False, True], ids=["fa3-schedule", "decode-schedule"])
@pytest.mark.parametrize("heads", [16, 128])
def test_short_extends_in_the_absorbed_form_match_the_expanded_form(heads, scheduled):
    # A decode, a prompt's 16-token tail after a 1008-token prefix-cache hit, a 300-token extend over
    # 211 cached tokens: absorbed over the paged cache against expanded over the gathered contexts.
    spec = make_spec(heads)
    query_lens, seq_lens = [1, 16, 300], [40, 1024, 511]
    blocks_per_seq = -(-max(seq_lens) // BLOCK)
    block_table = torch.randperm(len(seq_lens) * blocks_per_seq, device="cuda").view(len(seq_lens), -1)
    block_table = block_table.to(torch.int32)
    cache = torch.randn(block_table.numel(), BLOCK, RANK + ROPE, device="cuda", dtype=torch.bfloat16)
    positions = [torch.arange(n, device="cuda") for n in seq_lens]
    latent = torch.cat([cache[block_table[i, p // BLOCK], p % BLOCK] for i, p in enumerate(positions)])
    cu_q = torch.tensor([0, 1, 17, 317], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 40, 1064, 1575], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(query_lens), heads, NOPE + ROPE, device="cuda", dtype=torch.bfloat16)
    want = mla_prefill(spec, q, latent, cu_q, cu_k)

    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32, device="cuda")
    schedule, splits = None, 0
    if scheduled:  # as the metadata builder computes it
        schedule, splits = mla_fa3.DecodeSchedule(VllmConfig(), heads, ROPE, RANK, BLOCK, torch.bfloat16,
                                                  torch.device("cuda")).build(
            cu_q, seq_lens_t, max(seq_lens), sum(query_lens), max(query_lens))
    q_latent = torch.cat([absorb_q(spec, q[..., :NOPE]), q[..., NOPE:]], dim=-1)
    latent_out = mla_fa3.decode(spec, q_latent, cache, cu_q, seq_lens_t, block_table, max(seq_lens), schedule,
                                splits, max(query_lens))
    assert relative_error(up_project_v(spec, latent_out), want) < 1e-2


def test_other_mla_widths_run_atoms_kernels(monkeypatch):
    """FA3's MLA decode takes a rope part of at most 64 channels and a latent of at least 256; a
    model of other widths (the tiny test models': nope 16, rope 8, v 20, latent 40) runs ATOM's
    kernels, where FA3 stopped with "q_v is only supported for hdim_v >= 256" (on an H100)."""
    monkeypatch.delenv(mla_fa3.KERNELS_VARIABLE, raising=False)
    mla_fa3.mla_kernels.cache_clear()
    assert mla_fa3.mla_kernels(False, (NOPE, ROPE, V, RANK)) == mla_fa3.FA3
    assert mla_fa3.mla_kernels(False, (16, 8, 20, 40)) == mla_fa3.ATOM
    monkeypatch.setenv(mla_fa3.KERNELS_VARIABLE, mla_fa3.FA3)
    mla_fa3.mla_kernels.cache_clear()
    with pytest.raises(ValueError, match=r"MLA widths \(128, 64, 128, 512\); these are \(16, 8, 20, 40\)"):
        mla_fa3.mla_kernels(False, (16, 8, 20, 40))
    mla_fa3.mla_kernels.cache_clear()
