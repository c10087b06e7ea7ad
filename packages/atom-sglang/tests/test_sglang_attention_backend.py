"""The ``atom`` attention backend against SGLang's torch_native backend, layer by layer.

Real SGLang pools (``MHATokenToKVPool``, ``ReqToTokenPool``) and ``RadixAttention`` layers, a
hand-built ForwardBatch; no engine. Three requests go through prefill, an extend over their cached
prefix, a mixed batch and decode steps, with page sizes 1 and 4 (pages scattered through the pool),
full and sliding-window attention and GQA. Both backends get the same inputs and separate pools.
"""

import random
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.sglang

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE = 4, 2, 32
POOL_SLOTS, MAX_CONTEXT = 256, 64


class Harness:
    """Two identical pool pairs, request bookkeeping and ForwardBatch construction."""

    def __init__(self, page_size: int):
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

        self.page_size = page_size
        self.runners = []
        for _ in range(2):
            kv = MHATokenToKVPool(POOL_SLOTS, page_size, torch.float32, NUM_KV_HEADS, HEAD_SIZE, 1, "cpu",
                                  False)
            req = ReqToTokenPool(4, MAX_CONTEXT, "cpu", False)
            self.runners.append(SimpleNamespace(device="cpu", page_size=page_size, token_to_kv_pool=kv,
                                                req_to_token_pool=req, use_mla_backend=False,
                                                server_args=SimpleNamespace(kv_cache_dtype="auto")))
        # Each request owns whole pages, scattered through the pool (page 0 stays unused, as in SGLang).
        pages = list(range(1, POOL_SLOTS // page_size))
        random.Random(page_size).shuffle(pages)
        per_request = MAX_CONTEXT // page_size
        self.pages = {r: pages[(r - 1) * per_request:r * per_request] for r in range(1, 4)}
        self.lens = {r: 0 for r in self.pages}

    def slots(self, request: int, start: int, end: int) -> list[int]:
        return [self.pages[request][t // self.page_size] * self.page_size + t % self.page_size
                for t in range(start, end)]

    def batch(self, new_tokens: dict[int, int]):
        """ForwardBatch for appending ``new_tokens[r]`` tokens to each request r."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        requests = list(new_tokens)
        prefix = [self.lens[r] for r in requests]
        extend = [new_tokens[r] for r in requests]
        out_cache_loc = []
        for r, p, n in zip(requests, prefix, extend):
            out_cache_loc += self.slots(r, p, p + n)
            self.lens[r] = p + n
            for runner in self.runners:
                runner.req_to_token_pool.req_to_token[r, : p + n] = torch.tensor(self.slots(r, 0, p + n))
        seq_lens = [p + n for p, n in zip(prefix, extend)]
        decode = all(n == 1 for n in extend) and all(prefix)
        mode = ForwardMode.DECODE if decode else (ForwardMode.MIXED if any(n == 1 for n in extend)
                                                   else ForwardMode.EXTEND)
        tensor = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
        return SimpleNamespace(
            forward_mode=mode, batch_size=len(requests), req_pool_indices=tensor(requests),
            seq_lens=tensor(seq_lens), seq_lens_cpu=tensor(seq_lens), out_cache_loc=tensor(out_cache_loc),
            extend_seq_lens=None if decode else tensor(extend),
            extend_prefix_lens=None if decode else tensor(prefix),
            extend_prefix_lens_cpu=None if decode else prefix, encoder_lens=None, spec_info=None,
        )


def radix_layer(sliding_window_size: int):
    from sglang.srt.layers.radix_attention import RadixAttention

    return RadixAttention(NUM_HEADS, HEAD_SIZE, HEAD_SIZE**-0.5, NUM_KV_HEADS, 0,
                          sliding_window_size=sliding_window_size)


def run_step(harness, backends, layer, forward_batch, generator):
    tokens = int(forward_batch.out_cache_loc.shape[0])
    q = torch.randn(tokens, NUM_HEADS * HEAD_SIZE, generator=generator)
    k = torch.randn(tokens, NUM_KV_HEADS * HEAD_SIZE, generator=generator)
    v = torch.randn(tokens, NUM_KV_HEADS * HEAD_SIZE, generator=generator)
    outs = []
    for backend in backends:
        backend.init_forward_metadata(forward_batch)
        outs.append(backend.forward(q, k.view(-1, NUM_KV_HEADS, HEAD_SIZE), v.view(-1, NUM_KV_HEADS, HEAD_SIZE),
                                    layer, forward_batch))
    return outs


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("sliding_window_size", [-1, 7])
def test_atom_backend_matches_torch_native(page_size, sliding_window_size):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    from atom_sglang.attention.backend import ATOMAttentionBackend

    harness = Harness(page_size)
    atom = ATOMAttentionBackend(harness.runners[0])
    native = TorchNativeAttnBackend(harness.runners[1])
    layer = radix_layer(sliding_window_size)
    generator = torch.Generator().manual_seed(0)
    steps = [
        ({1: 5, 2: 13, 3: 1}, "fresh prefill"),
        ({1: 9, 2: 3}, "extend over cached prefixes"),
        ({1: 1, 2: 1, 3: 1}, "decode"),
        ({3: 11, 1: 1}, "mixed: extend and a decode token"),
        ({1: 1, 2: 1, 3: 1}, "decode"),
    ]
    for new_tokens, what in steps:
        forward_batch = harness.batch(new_tokens)
        ours, reference = run_step(harness, (atom, native), layer, forward_batch, generator)
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5, msg=what)
    assert atom.forward_metadata.fresh_prefill is False


def test_decode_graph_buffers_match_eager():
    """The CUDA-graph path (static buffers refilled before each replay) computes what eager does."""
    from atom_sglang.attention.backend import ATOMAttentionBackend

    harness = Harness(page_size=4)
    eager = ATOMAttentionBackend(harness.runners[0])
    graphed = ATOMAttentionBackend(harness.runners[1])
    graphed.init_cuda_graph_state(max_bs=4, max_num_tokens=4)
    layer = radix_layer(-1)
    generator = torch.Generator().manual_seed(1)
    # Cached context: the same random K/V in both pools, behind requests of 6, 17 and 2 tokens.
    for buffers in ("k_buffer", "v_buffer"):
        values = torch.randn(getattr(harness.runners[0].token_to_kv_pool, buffers)[0].shape, generator=generator)
        for runner in harness.runners:
            getattr(runner.token_to_kv_pool, buffers)[0].copy_(values)
    harness.batch({1: 6, 2: 17, 3: 2})
    for step in range(3):
        forward_batch = harness.batch({1: 1, 2: 1, 3: 1})
        q = torch.randn(3, NUM_HEADS * HEAD_SIZE, generator=generator)
        k = torch.randn(3, NUM_KV_HEADS, HEAD_SIZE, generator=generator)
        v = torch.randn(3, NUM_KV_HEADS, HEAD_SIZE, generator=generator)
        eager.init_forward_metadata(forward_batch)
        if step == 2:
            forward_batch.seq_lens_cpu = None  # replays may come without host-side lengths
        graphed.init_forward_metadata_out_graph(forward_batch, in_capture=step == 0)
        assert graphed.forward_metadata.block_table.data_ptr() == graphed.graph_buffers.block_table.data_ptr()
        torch.testing.assert_close(graphed.forward_decode(q, k, v, layer, forward_batch),
                                   eager.forward_decode(q, k, v, layer, forward_batch))


def test_unsupported_layers_are_refused():
    from atom_sglang.attention.backend import ATOMAttentionBackend

    harness = Harness(page_size=1)
    backend = ATOMAttentionBackend(harness.runners[0])
    forward_batch = harness.batch({1: 3})
    backend.init_forward_metadata(forward_batch)
    layer = radix_layer(-1)
    layer.logit_cap = 30.0
    q, k = torch.randn(3, NUM_HEADS * HEAD_SIZE), torch.randn(3, NUM_KV_HEADS, HEAD_SIZE)
    with pytest.raises(NotImplementedError, match="logit cap"):
        backend.forward(q, k, k, layer, forward_batch)


@pytest.mark.parametrize("page_size", [1, 4])
def test_start_up_runs_prefill_and_extend_kernels_over_the_pool(page_size, monkeypatch):
    """What the backend runs when SGLang creates it at start-up: per layer geometry, varlen attention
    on q/k/v laid out as a fused QKV projection's output, then the paged kernel's extend variant
    (more tokens than sequences) over the layer's own pool at SGLang's page size, which it only reads."""
    import atom_kernels
    from atom_sglang.attention.backend import ATOMAttentionBackend
    from atom_sglang.attention.window import to_atom_window

    harness = Harness(page_size)
    pool = harness.runners[0].token_to_kv_pool
    pool.k_buffer[0].normal_(), pool.v_buffer[0].normal_()
    before = pool.k_buffer[0].clone(), pool.v_buffer[0].clone()
    calls = []

    def recording(name):
        kernel = getattr(atom_kernels, name)
        return lambda *args, **kwargs: calls.append((name, args, kwargs)) or kernel(*args, **kwargs)

    for name in ("varlen_attention", "paged_attention"):
        monkeypatch.setattr(atom_kernels, name, recording(name))
    layers = torch.nn.ModuleList([radix_layer(-1), radix_layer(-1), radix_layer(7)])
    backend = ATOMAttentionBackend(harness.runners[0])
    assert backend.compile_prefill_kernels(layers, torch.float32) == 2  # the first two layers are alike
    assert [name for name, _, _ in calls] == ["varlen_attention", "paged_attention"] * 2
    for (_, varlen, _), (_, paged, _), window in zip(calls[::2], calls[1::2], (-1, 7)):
        q = varlen[0]
        assert q.shape == (16, NUM_HEADS, HEAD_SIZE) and q.stride(0) == (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_SIZE
        key_cache, value_cache, seq_lens = paged[1], paged[2], paged[4]
        assert key_cache.data_ptr() == pool.k_buffer[0].data_ptr() and key_cache.shape[1] == page_size
        assert value_cache.data_ptr() == pool.v_buffer[0].data_ptr()
        assert paged[0].shape[0] > seq_lens.shape[0]
        assert varlen[7] == paged[7] == to_atom_window(window)
    torch.testing.assert_close((pool.k_buffer[0], pool.v_buffer[0]), before, rtol=0, atol=0)


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float8_e4m3fn])
def test_latent_start_up_runs_the_extend_path_at_the_pools_page_size(page_size, cache_dtype, monkeypatch):
    """MLA (atom_sglang.attention.latent): per MLA geometry, the rope + latent write with the raw
    q_nope into a scratch cache of the pool's dtype and page size (a page of 1 is a Triton
    specialisation of its own: on an H100 a 16-token scratch block left it to the first request),
    then the expanded attention; SGLang's pool is not written."""
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool, ReqToTokenPool

    import atom_kernels
    from atom_core.layers.linear import ColumnParallelLinear
    from atom_core.layers.mla import LatentAttentionSpec
    from atom_core.layers.rotary import RotaryEmbedding
    from atom_sglang.attention.latent import ATOMLatentAttentionBackend
    from atom_sglang.host_hooks import RadixLatentAttentionImpl

    heads, nope, rope, v, rank = 4, 16, 8, 12, 32
    pool = MLATokenToKVPool(POOL_SLOTS, page_size, cache_dtype, rank, rope, 2, "cpu", False)
    runner = SimpleNamespace(device="cpu", page_size=page_size, token_to_kv_pool=pool, dtype=torch.float32,
                             req_to_token_pool=ReqToTokenPool(4, MAX_CONTEXT, "cpu", False), use_mla_backend=True,
                             server_args=SimpleNamespace(kv_cache_dtype="auto"))

    def layer(layer_id: int) -> RadixLatentAttentionImpl:
        kv_b_proj = ColumnParallelLinear(rank, heads * (nope + v))
        rotary = RotaryEmbedding(rope, rope, 64, {"rope_type": "default", "rope_theta": 10000.0})
        return RadixLatentAttentionImpl(LatentAttentionSpec(
            num_heads=heads, qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v, kv_lora_rank=rank,
            scale=0.2, prefix=f"layers.{layer_id}.attn", layer_id=layer_id, kv_b_proj=kv_b_proj, rotary_emb=rotary))

    calls = []
    varlen, rope_cache = atom_kernels.varlen_attention, atom_kernels.fused_qk_rope_concat_and_cache_mla
    monkeypatch.setattr(atom_kernels, "varlen_attention",
                        lambda q, *args, **kw: calls.append(("attention", q.shape[-1])) or varlen(q, *args, **kw))

    def record_rope_cache(q_nope, q_pe, kv_c, k_pe, kv_cache, *args, **kwargs):
        calls.append(("rope_cache", q_nope.shape[-1], kv_cache.shape[1], kv_cache.dtype))
        return rope_cache(q_nope, q_pe, kv_c, k_pe, kv_cache, *args, **kwargs)

    monkeypatch.setattr(atom_kernels, "fused_qk_rope_concat_and_cache_mla", record_rope_cache)
    before = [buffer.clone() for buffer in pool.kv_buffer]
    backend = ATOMLatentAttentionBackend(runner)
    assert backend.compile_prefill_kernels(torch.nn.ModuleList([layer(0), layer(1)]), torch.float32) == 1
    assert calls == [("rope_cache", nope, page_size, cache_dtype), ("attention", nope + rope)]
    assert all(torch.equal(a, b) for a, b in zip(pool.kv_buffer, before, strict=True))
