"""ATOM's multi-head (GQA) attention backend for vLLM: backend class, metadata builder, impl.

vLLM keeps KV-cache allocation and scheduling; ATOM reads the cache as K and V
``[num_blocks, block_size, num_kv_heads, head_size]`` (:mod:`.cache_layout`: how, per vLLM release),
turns vLLM's CommonAttentionMetadata into a decode / extend / prefill split, writes K/V into the cache
and runs attention through atom_kernels:

- decode: one new token per request, paged attention over the cache;
- extend: several new tokens over cached context (chunked prefill, prefix-cache hits), paged;
- prefill: whole prompts with no cached context, varlen attention over the fresh K/V.

With ``--kv-cache-dtype fp8`` the cache (allocated by vLLM as uint8) is read as e4m3 and holds K / V
divided by the layer's ``_k_scale`` / ``_v_scale`` (vLLM's: 1.0 unless the checkpoint or
``--calculate-kv-scales`` sets them); prefill attends over the fresh, unquantized K/V. On Hopper the
platform gives FP8 caches to vLLM's FlashAttention-3 instead (atom_vllm.platform.host_serves_fp8_cache).

vLLM reorders each batch so requests run [decodes | extends | prefills] (reorder_batch_threshold 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from vllm.platforms import current_platform
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
    MultipleOf,
)

import atom_kernels
from atom_core.hosting.takeover import FP8_KV_CACHE_DTYPES
from atom_core.hosting.warmup import run_prefill_attention_kernels
from atom_vllm.attention import ATOMBackendBase, cache_layout, decode_graph_support


class ATOMAttentionBackend(ATOMBackendBase):
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", *FP8_KV_CACHE_DTYPES]

    @staticmethod
    def get_impl_cls() -> type[ATOMAttentionImpl]:
        return ATOMAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[ATOMAttentionMetadataBuilder]:
        return ATOMAttentionMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        """vLLM 0.26 to 0.28 (from 0.29 vLLM sets the shape: :mod:`.cache_layout`)."""
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple | None:
        return cache_layout.supported_mha_layouts()

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [32, 64, 80, 96, 112, 128, 160, 192, 256]

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @staticmethod
    def use_cascade_attention(*args, **kwargs) -> bool:
        # ATOM has no cascade kernel: shared prefixes go through the regular paged path.
        return False


@dataclass
class ATOMAttentionMetadata:
    num_reqs: int
    num_actual_tokens: int
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    max_query_len: int
    max_seq_len: int
    num_decodes: int
    num_decode_tokens: int
    num_extends: int
    num_extend_tokens: int
    # query_start_loc of the extends alone, rebased to their first token (one subtraction per step
    # rather than per layer); None without extends.
    extend_query_start_loc: torch.Tensor | None
    num_prefills: int
    num_prefill_tokens: int
    # The same for the prefills: their cu_seqlens.
    prefill_query_start_loc: torch.Tensor | None


def split_batch(query_start_loc_cpu: torch.Tensor, seq_lens_cpu: torch.Tensor) -> tuple[int, int, int]:
    """(num_decodes, num_extends, num_prefills) of a batch ordered [decodes | extends | prefills].

    Decodes are the leading requests with one new token (a one-token prompt included: its K/V is in
    the cache before attention runs, so the paged path serves it, and a captured decode graph sees
    the same split). Of the rest, the trailing run without cached context (seq_len == query_len)
    are prefills, everything before is extend. A request the reorder placed elsewhere is still
    served correctly as extend: the paged path covers any query.
    """
    query_lens = (query_start_loc_cpu[1:] - query_start_loc_cpu[:-1]).tolist()
    seq_lens = seq_lens_cpu.tolist()
    num_reqs = len(query_lens)
    num_decodes = 0
    while num_decodes < num_reqs and query_lens[num_decodes] == 1:
        num_decodes += 1
    first_prefill = num_reqs
    while first_prefill > num_decodes and seq_lens[first_prefill - 1] == query_lens[first_prefill - 1]:
        first_prefill -= 1
    return num_decodes, first_prefill - num_decodes, num_reqs - first_prefill


class ATOMAttentionMetadataBuilder(AttentionMetadataBuilder[ATOMAttentionMetadata]):
    reorder_batch_threshold: int | None = 1

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec) -> AttentionCGSupport:
        return decode_graph_support(("paged_attention", "reshape_and_cache"))

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> ATOMAttentionMetadata:
        if common_prefix_len > 0:
            raise NotImplementedError("ATOM attention does not implement cascade attention")
        m = common_attn_metadata
        qsl_cpu = m.query_start_loc_cpu
        seq_lens_cpu = m.seq_lens_cpu_upper_bound
        if seq_lens_cpu is None:
            seq_lens_cpu = m.seq_lens.cpu()
        num_decodes, num_extends, num_prefills = split_batch(qsl_cpu, seq_lens_cpu[: m.num_reqs])
        decode_tokens = int(qsl_cpu[num_decodes])
        extend_tokens = int(qsl_cpu[num_decodes + num_extends]) - decode_tokens
        extend_qsl = None
        if num_extends:
            extend_qsl = m.query_start_loc[num_decodes : num_decodes + num_extends + 1]
            if decode_tokens:
                extend_qsl = extend_qsl - decode_tokens
        paged_reqs, paged_tokens = num_decodes + num_extends, decode_tokens + extend_tokens
        prefill_qsl = None
        if num_prefills:
            prefill_qsl = m.query_start_loc[paged_reqs : m.num_reqs + 1]
            if paged_tokens:
                prefill_qsl = prefill_qsl - paged_tokens
        return ATOMAttentionMetadata(
            num_reqs=m.num_reqs,
            num_actual_tokens=m.num_actual_tokens,
            slot_mapping=m.slot_mapping,
            block_table=m.block_table_tensor,
            query_start_loc=m.query_start_loc,
            seq_lens=m.seq_lens,
            max_query_len=m.max_query_len,
            max_seq_len=m.max_seq_len,
            num_decodes=num_decodes,
            num_decode_tokens=decode_tokens,
            num_extends=num_extends,
            num_extend_tokens=extend_tokens,
            extend_query_start_loc=extend_qsl,
            num_prefills=num_prefills,
            num_prefill_tokens=int(qsl_cpu[m.num_reqs]) - paged_tokens,
            prefill_query_start_loc=prefill_qsl,
        )


class ATOMAttentionImpl(AttentionImpl[ATOMAttentionMetadata]):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes, sliding_window: int | None, kv_cache_dtype: str,
                 logits_soft_cap: float | None = None, attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: str | None = None, sinks: torch.Tensor | None = None):
        if alibi_slopes is not None or logits_soft_cap:
            raise NotImplementedError("ATOM attention does not support ALiBi or logit soft-capping")
        if attn_type != AttentionType.DECODER:
            raise NotImplementedError(f"ATOM attention serves decoder attention only, not {attn_type}")
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.sinks = sinks
        self.prefill_kernels_compiled = False
        # The e4m3 type vLLM's uint8 FP8 cache holds on this platform (fnuz on MI300); None: no FP8.
        self.fp8_cache_dtype = current_platform.fp8_dtype() if kv_cache_dtype in FP8_KV_CACHE_DTYPES else None

    def cache_views(self, layer, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """(key_cache, value_cache, scales): an FP8 cache viewed as e4m3, with the layer's scales."""
        if self.fp8_cache_dtype is None:
            return *cache_layout.key_value_views(kv_cache), {}
        key_cache, value_cache = cache_layout.key_value_views(kv_cache.view(self.fp8_cache_dtype))
        return key_cache, value_cache, {"k_scale": layer._k_scale, "v_scale": layer._v_scale}

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: ATOMAttentionMetadata | None,
                output: torch.Tensor, output_scale=None, output_block_scale=None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("ATOM attention does not fuse output quantization")
        if attn_metadata is None:  # vLLM's profiling / warm-up runs: no batch, no cache yet
            capturing = query.is_cuda and torch.cuda.is_current_stream_capturing()
            if not self.prefill_kernels_compiled and not capturing:
                self.compile_prefill_kernels(layer, query, key, value, output)
            return output
        m = attn_metadata
        key_cache, value_cache, scales = self.cache_views(layer, kv_cache)
        n = m.num_actual_tokens
        if self.kv_sharing_target_layer_name is None:
            atom_kernels.reshape_and_cache(key[:n], value[:n], key_cache, value_cache, m.slot_mapping[:n],
                                           **scales)

        # Decodes, then extends, read the (just written) cache. Separate launches, so that decode rows
        # get the decode tiles and split-K rather than a share of the extend kernel's query tiles.
        # The extend launch reads metadata slices at any offset; the kernel does not specialize its
        # metadata pointers on alignment, so these slices compile nothing new mid-serving.
        if m.num_decodes:
            d = m.num_decode_tokens
            atom_kernels.paged_attention(
                query[:d], key_cache, value_cache, m.query_start_loc[: m.num_decodes + 1],
                m.seq_lens[: m.num_decodes], m.block_table[: m.num_decodes], self.scale,
                self.sliding_window, self.sinks, out=output[:d], **scales,
            )
        paged_reqs = m.num_decodes + m.num_extends
        paged_tokens = m.num_decode_tokens + m.num_extend_tokens
        if m.num_extends:
            first, start = m.num_decodes, m.num_decode_tokens
            atom_kernels.paged_attention(
                query[start:paged_tokens], key_cache, value_cache,
                m.extend_query_start_loc, m.seq_lens[first:paged_reqs],
                m.block_table[first:paged_reqs], self.scale, self.sliding_window, self.sinks,
                out=output[start:paged_tokens], **scales,
            )
        if m.num_prefills:
            end = paged_tokens + m.num_prefill_tokens
            cu_seqlens = m.prefill_query_start_loc
            atom_kernels.varlen_attention(
                query[paged_tokens:end], key[paged_tokens:end], value[paged_tokens:end],
                cu_seqlens, cu_seqlens, self.scale, True, self.sliding_window, self.sinks,
                out=output[paged_tokens:end],
            )
        return output

    def compile_prefill_kernels(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                output: torch.Tensor) -> None:
        """Run the prefill and extend attention kernels once on this layer's real q/k/v/output
        tensors (atom_core.hosting.warmup), so that they compile during vLLM's start-up warm-up
        rather than on the first long prompt. Decode kernels compile when vLLM captures its decode
        CUDA graphs. The extend kernel reads a one-block scratch cache in vLLM's layout, its block
        size a multiple of 16 as vLLM's are here (get_supported_kernel_block_sizes)."""
        self.prefill_kernels_compiled = True
        scratch = cache_layout.one_block_mha_cache(self.num_kv_heads, self.head_size, 16,
                                                   torch.uint8 if self.fp8_cache_dtype else key.dtype, query.device)
        key_cache, value_cache, scales = self.cache_views(layer, scratch)
        run_prefill_attention_kernels(query, key, value, key_cache, value_cache, self.scale,
                                      self.sliding_window, self.sinks, out=output, **scales)
