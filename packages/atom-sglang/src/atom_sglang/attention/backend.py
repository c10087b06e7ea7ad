"""``atom``: an SGLang attention backend that runs atom_kernels over SGLang's KV pool.

SGLang keeps scheduling, the radix cache and the KV pool (``MHATokenToKVPool``, ``[slots, kv_heads,
head_size]`` per layer; of a hybrid linear-attention model, ``HybridLinearKVPool``, which keeps one for
its full-attention layers and maps their layer ids); a request's slots are its row of
``req_to_token``. ATOM's paged kernels see the pool as blocks of ``page_size``, the block table being
every ``page_size``-th slot / ``page_size``.

Per forward the backend builds one :class:`ATOMAttentionMetadata` for all layers; per layer it writes
the new K/V into the pool and runs:

- plain prefill: ``varlen_attention`` over the new K/V;
- extend over a cached prefix (radix-cache hit, chunked prefill, mixed batches) and decode:
  ``paged_attention``, the new tokens being the last of each sequence.

Captured decode batches keep the metadata in static buffers, refilled before capture and each replay
(``init_forward_metadata_out_graph``). The prefill and extend kernels compile when SGLang creates the
backend (:meth:`ATOMAttentionBackend.compile_prefill_kernels`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.radix_attention import AttentionType, RadixAttention
from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, MHATokenToKVPool
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from torch import nn

import atom_kernels
from atom_core.hosting.warmup import fused_qkv, run_prefill_attention_kernels
from atom_core.log import logger
from atom_kernels.cache import FP8_CACHE_DTYPES
from atom_sglang.attention.window import to_atom_window

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner


@dataclass
class ATOMAttentionMetadata:
    query_start_loc: torch.Tensor  # [batch + 1] int32: where each sequence's new tokens start
    seq_lens: torch.Tensor  # [batch] int32: cached + new tokens of each sequence
    block_table: torch.Tensor  # [batch, blocks] int32: KV-pool pages of each sequence
    fresh_prefill: bool  # no sequence has cached tokens: attend over the new K/V directly


class ATOMAttentionBackend(AttentionBackend):
    def __init__(self, model_runner: ModelRunner):
        super().__init__()
        pool = model_runner.token_to_kv_pool
        self.check_pool(pool, model_runner)
        self.device = model_runner.device
        self.page_size = model_runner.page_size
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = pool
        self.fp8_cache = pool.dtype in FP8_CACHE_DTYPES
        self.forward_metadata: ATOMAttentionMetadata | None = None
        self.graph_buffers: ATOMAttentionMetadata | None = None
        logger.info("Use atom attention backend for SGLang (page size %d)", self.page_size)

    @staticmethod
    def check_pool(pool, model_runner: ModelRunner) -> None:
        mha_pool = pool.full_kv_pool if type(pool) is HybridLinearKVPool else pool
        fp8_e5m2 = pool.dtype == torch.float8_e5m2
        if (type(mha_pool) is not MHATokenToKVPool or mha_pool.is_quantized_kv_cache or mha_pool.use_hnd
                or fp8_e5m2):
            raise NotImplementedError(
                f"the atom attention backend needs SGLang's plain MHA KV pool in NHD layout with the "
                f"model's dtype or FP8 e4m3; this model runs with {type(mha_pool).__name__} "
                f"(kv_cache_dtype={model_runner.server_args.kv_cache_dtype}). "
                "Choose another --attention-backend."
            )

    # --- metadata ---------------------------------------------------------------------------------

    def block_table(self, req_pool_indices: torch.Tensor, max_tokens: int) -> torch.Tensor:
        slots = self.req_to_token_pool.req_to_token[req_pool_indices, :max_tokens : self.page_size]
        return (slots // self.page_size).to(torch.int32)

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        mode = forward_batch.forward_mode
        batch = forward_batch.batch_size
        if mode.is_decode_or_idle():
            query_start_loc = torch.arange(batch + 1, dtype=torch.int32, device=self.device)
            fresh_prefill = False
        elif mode in (ForwardMode.EXTEND, ForwardMode.MIXED):
            query_start_loc = torch.zeros(batch + 1, dtype=torch.int32, device=self.device)
            torch.cumsum(forward_batch.extend_seq_lens, 0, out=query_start_loc[1:])
            fresh_prefill = not any(forward_batch.extend_prefix_lens_cpu)
        else:
            raise NotImplementedError(f"the atom attention backend does not run {mode.name} batches")
        max_tokens = int(forward_batch.seq_lens_cpu.max()) if batch else 0
        self.forward_metadata = ATOMAttentionMetadata(
            query_start_loc=query_start_loc,
            seq_lens=forward_batch.seq_lens.to(torch.int32),
            block_table=self.block_table(forward_batch.req_pool_indices, max_tokens),
            fresh_prefill=fresh_prefill,
        )

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        max_context = self.req_to_token_pool.req_to_token.shape[1]
        self.graph_buffers = ATOMAttentionMetadata(
            query_start_loc=torch.arange(max_bs + 1, dtype=torch.int32, device=self.device),
            seq_lens=torch.ones(max_bs, dtype=torch.int32, device=self.device),
            block_table=torch.zeros(
                max_bs, -(-max_context // self.page_size), dtype=torch.int32, device=self.device
            ),
            fresh_prefill=False,
        )

    def init_forward_metadata_out_graph(self, forward_batch: ForwardBatch, in_capture: bool = False) -> None:
        """Capture and replay: refill the static buffers the captured kernels read."""
        if not forward_batch.forward_mode.is_decode_or_idle() or forward_batch.spec_info is not None:
            raise NotImplementedError("the atom attention backend captures plain decode batches only")
        batch = forward_batch.batch_size
        buffers = self.graph_buffers
        buffers.seq_lens[:batch].copy_(forward_batch.seq_lens[:batch])
        # Only the pages the longest sequence uses when SGLang says how long that is: the kernels
        # never read past a sequence's length. (Replays may come without host-side lengths.)
        max_tokens = self.req_to_token_pool.req_to_token.shape[1]
        if forward_batch.seq_lens_cpu is not None:
            max_tokens = int(forward_batch.seq_lens_cpu[:batch].max())
        table = self.block_table(forward_batch.req_pool_indices[:batch], max_tokens)
        buffers.block_table[:batch, : table.shape[1]].copy_(table)
        self.forward_metadata = ATOMAttentionMetadata(
            query_start_loc=buffers.query_start_loc[: batch + 1],
            seq_lens=buffers.seq_lens[:batch],
            block_table=buffers.block_table[:batch],
            fresh_prefill=False,
        )

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    # --- start-up ---------------------------------------------------------------------------------

    def compile_prefill_kernels(self, model: nn.Module, dtype: torch.dtype) -> int:
        """Run the prefill and extend kernels once per attention-layer geometry of ``model``
        (atom_core.hosting.warmup), on q/k/v laid out as a fused QKV projection hands them over in
        ``dtype`` and over the layer's own pool, so that Triton compiles them before the first
        request (SGLang runs no prefill forward at start-up). Only page 0, SGLang's padding page,
        is read. Attention sinks have no variant here: SGLang puts sink models (GPT-OSS) on its
        hybrid pool, which this backend does not take. The number of geometries."""
        geometries = set()
        for layer in model.modules():
            if not isinstance(layer, RadixAttention):
                continue
            geometry = (layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim, layer.sliding_window_size)
            if geometry in geometries:
                continue
            geometries.add(geometry)
            q, k, v = fused_qkv(layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim, dtype, self.device)
            run_prefill_attention_kernels(q, k, v, *self.paged_caches(layer), layer.scaling,
                                          to_atom_window(layer.sliding_window_size), **self.cache_scales(layer))
        return len(geometries)

    # --- attention --------------------------------------------------------------------------------

    def forward_extend(self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch,
                       save_kv_cache: bool = True, sinks: torch.Tensor | None = None, **kwargs):
        return self.attend(q, k, v, layer, forward_batch, save_kv_cache, sinks, kwargs)

    def forward_decode(self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch,
                       save_kv_cache: bool = True, sinks: torch.Tensor | None = None, **kwargs):
        return self.attend(q, k, v, layer, forward_batch, save_kv_cache, sinks, kwargs)

    def attend(self, q, k, v, layer: RadixAttention, forward_batch: ForwardBatch, save_kv_cache: bool,
               sinks: torch.Tensor | None, unsupported: dict) -> torch.Tensor:
        """Paged attention after the cache write; a fresh prefill attends first, over K/V as they
        came: SGLang's write into an FP8 pool divides them by the layer's scales in place."""
        check_layer_supported(layer, unsupported)
        fresh_prefill = self.forward_metadata.fresh_prefill and k is not None
        if save_kv_cache and k is not None and not fresh_prefill:
            self.save_kv(layer, forward_batch, k, v)
        num_heads, num_kv_heads, head_size = layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
        metadata = self.forward_metadata
        window = to_atom_window(layer.sliding_window_size)
        q = q.reshape(-1, num_heads, head_size)
        if fresh_prefill:
            out = atom_kernels.varlen_attention(
                q,
                k.reshape(-1, num_kv_heads, head_size),
                v.reshape(-1, num_kv_heads, head_size),
                metadata.query_start_loc,
                metadata.query_start_loc,
                layer.scaling,
                True,
                window,
                sinks,
            )
            if save_kv_cache:
                self.save_kv(layer, forward_batch, k, v)
        else:
            out = atom_kernels.paged_attention(
                q,
                *self.paged_caches(layer),
                metadata.query_start_loc,
                metadata.seq_lens,
                metadata.block_table,
                layer.scaling,
                window,
                sinks,
                **self.cache_scales(layer),
            )
        return out.reshape(-1, num_heads * head_size)

    def paged_caches(self, layer: RadixAttention) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's K and V pools as [pages, page_size, kv_heads, head_size] caches."""
        shape = (-1, self.page_size, layer.tp_k_head_num, layer.head_dim)
        k_cache, v_cache = self.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        return k_cache.view(shape), v_cache.view(shape)

    def cache_scales(self, layer: RadixAttention) -> dict:
        """The layer's K/V scales for an FP8 pool (none: 1.0, SGLang's default), else nothing."""
        if not self.fp8_cache:
            return {}
        return {"k_scale": layer.k_scale, "v_scale": layer.v_scale}

    def save_kv(self, layer: RadixAttention, forward_batch: ForwardBatch, k: torch.Tensor,
                v: torch.Tensor) -> None:
        self.token_to_kv_pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v, **self.cache_scales(layer))


def check_layer_supported(layer: RadixAttention, unsupported: dict) -> None:
    if (
        unsupported
        or layer.is_cross_attention
        or layer.attn_type != AttentionType.DECODER
        or layer.logit_cap > 0
        or layer.qk_head_dim != layer.v_head_dim
    ):
        raise NotImplementedError(
            f"the atom attention backend runs causal decoder self-attention with equal K/V head "
            f"sizes and no logit cap; layer {layer.layer_id} asks for more "
            f"(extra arguments: {sorted(unsupported)}). Choose another --attention-backend."
        )

