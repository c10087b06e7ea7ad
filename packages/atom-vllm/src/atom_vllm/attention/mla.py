"""ATOM's multi-head latent attention (MLA) for vLLM: layer, backend class, metadata builder, impl.

vLLM's own MLA layer (``MLAAttention``) does the weight absorption itself, from vLLM linear layers,
and calls into vLLM's MLA prefill backends; ATOM keeps that math in atom-core
(:mod:`atom_core.layers.mla`). So ATOM brings its own layer, :class:`ATOMMLAAttention`, an
``AttentionLayerBase`` as vLLM's layers are: it declares the latent cache (``MLAAttentionSpec``:
one KV head of ``kv_lora_rank + qk_rope_head_dim``), registers itself in vLLM's forward context under
the layer's name (vLLM binds ``kv_cache`` to it and builds metadata with this backend's builder), and
runs :class:`ATOMMLAImpl`. No vLLM code is patched; the internals this relies on are listed in
``atom_vllm/patches.md``.

Cache: ``(num_blocks, block_size, kv_lora_rank + qk_rope_head_dim)`` (as :mod:`.cache_layout` views
vLLM's), entries ``[kv_c | rope(k_pe)]``.
vLLM orders each batch [decodes | prefills], a decode being a request of at most the builder's
``reorder_batch_threshold`` new tokens. Per layer and step:

- decodes: q_nope is absorbed through W_UK, one fused op rotates q_pe and k_pe and writes the cache,
  the absorbed attention runs over the latent cache, W_UV lifts the result into vLLM's output buffer.
  Single-token decode batches run this inside full CUDA graphs (``UNIFORM_SINGLE_TOKEN_DECODE``, on
  GPU kernels): it reads only vLLM's persistent metadata tensors and never syncs with the host.
  Where FlashAttention-3 runs it, a decode may also be a short extend (up to ``SHORT_EXTEND_TOKENS``
  new tokens: a prompt's tail after a prefix-cache hit, a small chunk; FA3 aligns the causal mask to
  each sequence's end), as vLLM's FlashAttention-MLA backend does: expanding a whole cached context
  for a few new tokens cost ATOM more host time than vLLM (an H200 serving prefix-cache hits of 1008 of
  1024 tokens on DeepSeek-V2-Lite: 33 against 21 ms scheduled-to-first-token,
  ``benchmarks/results/serving-h200-deepseek-v2-lite.json.gz[b49119a-repeated-prompts]``).
  ATOM's Triton decode takes one token per sequence, so there the threshold stays 1.
- prefills (fresh prompts, chunked-prefill chunks, prefix-cache hits alike): the same fused op with
  the raw q_nope, then each sequence's whole latent context is gathered from the cache (its new
  tokens included) and expanded to per-head K/V for ordinary causal attention.

The two attention cores run :func:`atom_kernels.mla_decode` / ``varlen_attention``, or on Hopper
vLLM's FlashAttention-3 (:mod:`atom_vllm.attention.mla_fa3` says when and why).

With ``--kv-cache-dtype fp8`` the cache (uint8 to vLLM) holds e4m3 entries divided by the layer's
``_k_scale`` (1.0: vLLM's default, or an ``fp8`` checkpoint's ``k_scale`` / ``kv_scale``; a
compressed-tensors ``kv_cache_scheme`` is handed back, atom_core.hosting.takeover); decode reads them
in the kernel, prefill dequantizes the gathered context.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.model_executor.layers.attention.attention import get_attention_context
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.platforms import current_platform
from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImplBase,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
    MultipleOf,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills
from vllm.v1.attention.selector import get_attn_backend
from vllm.v1.kv_cache_interface import MLAAttentionSpec

from atom_core.hosting.takeover import FP8_KV_CACHE_DTYPES
from atom_core.hosting.warmup import run_latent_prefill_kernels
from atom_core.layers.mla import (
    LatentAttentionSpec,
    absorb_q,
    mla_decode,
    mla_prefill,
    rope_and_cache,
    up_project_v,
)
from atom_vllm.attention import ATOMBackendBase, cache_layout, decode_graph_support, mla_fa3
from atom_vllm.attention.mla_fa3 import FA3, DecodeSchedule, mla_kernels, mla_widths, model_mla_widths

# The longest extend that runs the absorbed (decode) form where FA3 serves: vLLM's FlashAttention-MLA
# backend takes the same bound (its reorder_batch_threshold).
SHORT_EXTEND_TOKENS = 512


def _fp8_cache(cache_dtype: str) -> bool:
    return cache_dtype in FP8_KV_CACHE_DTYPES


class ATOMMLABackend(ATOMBackendBase):
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", *FP8_KV_CACHE_DTYPES]

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]  # FlashAttention-3's paged MLA (mla_fa3), as vLLM declares it

    @staticmethod
    def get_impl_cls() -> type[ATOMMLAImpl]:
        return ATOMMLAImpl

    @staticmethod
    def get_builder_cls() -> type[ATOMMLAMetadataBuilder]:
        return ATOMMLAMetadataBuilder

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                           cache_dtype_str: str = "auto") -> tuple[int, ...]:
        """vLLM 0.26 to 0.28 (from 0.29 vLLM sets the shape: :mod:`.cache_layout`)."""
        return (num_blocks, block_size, head_size)

    @classmethod
    def is_mla(cls) -> bool:
        return True


@dataclass
class ATOMMLAMetadata:
    num_actual_tokens: int
    slot_mapping: torch.Tensor
    block_table: torch.Tensor
    max_query_len: int
    max_seq_len: int
    # Decodes: the leading requests, one token each (FA3: up to SHORT_EXTEND_TOKENS each).
    num_decodes: int
    num_decode_tokens: int
    decode_query_start_loc: torch.Tensor
    decode_seq_lens: torch.Tensor
    decode_max_query_len: int
    # Prefills: the remaining requests. Their queries, numbered from the first prefill token, and
    # their whole contexts as (request row of the block table, position) pairs, request by request.
    num_prefills: int
    # FlashAttention-3's split schedule of the decodes (mla_fa3.DecodeSchedule), when FA3 runs them.
    decode_schedule: torch.Tensor | None = None
    decode_num_splits: int = 0
    prefill_query_start_loc: torch.Tensor | None = None
    prefill_context_start_loc: torch.Tensor | None = None
    context_requests: torch.Tensor | None = None
    context_positions: torch.Tensor | None = None
    _context_rows: tuple[torch.Tensor, torch.Tensor] | None = None

    def context_rows(self, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cache block, row in block) of each prefill context entry: worked out by the step's first
        layer, reused by the others (one index op per layer instead of four)."""
        if self._context_rows is None:
            blocks = self.block_table[self.context_requests, self.context_positions // block_size]
            self._context_rows = blocks, self.context_positions % block_size
        return self._context_rows


class ATOMMLAMetadataBuilder(AttentionMetadataBuilder[ATOMMLAMetadata]):
    reorder_batch_threshold: int | None = 1

    @classmethod
    def get_cudagraph_support(cls, vllm_config, kv_cache_spec) -> AttentionCGSupport:
        # FA3's decode is capture-safe with the schedule that build() keeps in a persistent buffer.
        decode_ops = ("fused_qk_rope_concat_and_cache_mla",)
        if mla_kernels(_fp8_cache(vllm_config.cache_config.cache_dtype), model_mla_widths(vllm_config)) != FA3:
            decode_ops += ("mla_decode",)
        return decode_graph_support(decode_ops)

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.decode_schedule = None
        if mla_kernels(_fp8_cache(kv_cache_spec.cache_dtype_str), model_mla_widths(vllm_config)) == FA3:
            self.reorder_batch_threshold = SHORT_EXTEND_TOKENS
            model = vllm_config.model_config
            rope_dim = model.hf_text_config.qk_rope_head_dim
            self.decode_schedule = DecodeSchedule(
                vllm_config, model.get_num_attention_heads(vllm_config.parallel_config), rope_dim,
                kv_cache_spec.head_size - rope_dim, kv_cache_spec.block_size, kv_cache_spec.dtype, device,
            )

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> ATOMMLAMetadata:
        if common_prefix_len > 0:
            raise NotImplementedError("ATOM MLA does not implement cascade attention")
        m = common_attn_metadata
        num_decodes, num_prefills, num_decode_tokens, _ = split_decodes_and_prefills(
            m, decode_threshold=self.reorder_batch_threshold
        )
        decode_max_query_len = 1
        if num_decode_tokens > num_decodes:  # short extends among the decodes (host-side lengths)
            starts = m.query_start_loc_cpu[: num_decodes + 1]
            decode_max_query_len = int((starts[1:] - starts[:-1]).max())
        metadata = ATOMMLAMetadata(
            num_actual_tokens=m.num_actual_tokens,
            slot_mapping=m.slot_mapping,
            block_table=m.block_table_tensor,
            max_query_len=m.max_query_len,
            max_seq_len=m.max_seq_len,
            num_decodes=num_decodes,
            num_decode_tokens=num_decode_tokens,
            decode_query_start_loc=m.query_start_loc[: num_decodes + 1],
            decode_seq_lens=m.seq_lens[:num_decodes],
            decode_max_query_len=decode_max_query_len,
            num_prefills=num_prefills,
        )
        if num_decodes and self.decode_schedule is not None:
            metadata.decode_schedule, metadata.decode_num_splits = self.decode_schedule.build(
                metadata.decode_query_start_loc, metadata.decode_seq_lens, m.max_seq_len, num_decode_tokens,
                decode_max_query_len,
            )
        if num_prefills:
            self._add_prefill_contexts(metadata, m, num_decodes, num_decode_tokens)
        return metadata

    def _add_prefill_contexts(self, metadata: ATOMMLAMetadata, m: CommonAttentionMetadata,
                              num_decodes: int, num_decode_tokens: int) -> None:
        seq_lens_cpu = m.seq_lens_cpu_upper_bound  # exact for prefill rows
        if seq_lens_cpu is None:
            seq_lens_cpu = m.seq_lens.cpu()
        num_context_tokens = int(seq_lens_cpu[num_decodes : m.num_reqs].sum())
        seq_lens = m.seq_lens[num_decodes : m.num_reqs]
        context_start = torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32, device=seq_lens.device)
        context_start[1:] = seq_lens.cumsum(0)
        requests = torch.arange(num_decodes, m.num_reqs, device=seq_lens.device)
        metadata.prefill_query_start_loc = m.query_start_loc[num_decodes : m.num_reqs + 1] - num_decode_tokens
        metadata.prefill_context_start_loc = context_start
        metadata.context_requests = requests.repeat_interleave(seq_lens, output_size=num_context_tokens)
        metadata.context_positions = torch.arange(num_context_tokens, device=seq_lens.device) - (
            context_start[:-1].repeat_interleave(seq_lens, output_size=num_context_tokens)
        )

    def build_for_cudagraph_capture(self, common_attn_metadata: CommonAttentionMetadata) -> ATOMMLAMetadata:
        """Full CUDA graphs cover uniform single-token decode batches only (the decode path)."""
        if common_attn_metadata.max_query_len > 1:
            raise ValueError("ATOM MLA captures CUDA graphs of single-token decode batches only")
        return self.build(0, common_attn_metadata)


class ATOMMLAImpl(AttentionImplBase[ATOMMLAMetadata]):
    """One layer's MLA step: cache write and attention, decode absorbed, prefill expanded. ``kernels``
    (:func:`mla_fa3.mla_kernels`): the attention cores run FA3 or ATOM's Triton kernels."""

    def __init__(self, spec: LatentAttentionSpec, kernels: str, fp8_cache: bool = False):
        self.spec = spec
        self.num_heads = spec.num_heads
        self.head_size = spec.latent_dim
        self.scale = spec.scale
        self.fa3 = kernels == FA3
        self.fp8_cache = fp8_cache
        # The prefill path's Triton kernels compile during vLLM's warm-up (compile_prefill_kernels).
        self.prefill_kernels_compiled = False
        self.fp8_cache_dtype = current_platform.fp8_dtype()

    def forward(self, positions: torch.Tensor, q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor,
                kv_cache: torch.Tensor, metadata: ATOMMLAMetadata | None, output: torch.Tensor,
                kv_scale: torch.Tensor | None = None) -> torch.Tensor:
        """``kv_scale``: given for an FP8 cache (its uint8 storage is read as the platform's e4m3)."""
        if metadata is None:
            # Profiling and dummy runs have no batch. Zeros keep data-parallel ranks that run dummy
            # batches for their peers in step (vLLM's MLA does the same).
            capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
            if not self.prefill_kernels_compiled and not capturing:
                self.compile_prefill_kernels(positions, q, kv_c, k_pe)
            return output.zero_()
        if kv_scale is not None:
            kv_cache = kv_cache.view(self.fp8_cache_dtype)
        s, m = self.spec, metadata
        n, nope = m.num_actual_tokens, s.qk_nope_head_dim
        d = m.num_decode_tokens
        slots = m.slot_mapping
        if m.num_decodes:
            q_latent = rope_and_cache(
                s, positions[:d], absorb_q(s, q[:d, :, :nope]), q[:d, :, nope:], kv_c[:d], k_pe[:d],
                kv_cache, slots[:d], kv_scale,
            )
            if self.fa3:
                latent_out = mla_fa3.decode(
                    s, q_latent, kv_cache, m.decode_query_start_loc, m.decode_seq_lens,
                    m.block_table[: m.num_decodes], m.max_seq_len, m.decode_schedule, m.decode_num_splits,
                    m.decode_max_query_len,
                )
                up_project_v(s, latent_out, output[:d])
            else:
                mla_decode(
                    s, q_latent, kv_cache, m.decode_query_start_loc, m.decode_seq_lens,
                    m.block_table[: m.num_decodes], m.max_seq_len, out=output[:d], kv_scale=kv_scale,
                )
        if m.num_prefills:
            q_full = rope_and_cache(
                s, positions[d:n], q[d:n, :, :nope], q[d:n, :, nope:], kv_c[d:n], k_pe[d:n], kv_cache,
                slots[d:n], kv_scale,
            )
            latent = kv_cache[m.context_rows(kv_cache.shape[1])]
            if kv_scale is not None:
                latent = (latent.float() * kv_scale).to(q.dtype)
            if self.fa3:
                mla_fa3.prefill(s, q_full, latent, m.prefill_query_start_loc, m.prefill_context_start_loc,
                                m.max_query_len, m.max_seq_len, output[d:n])
            else:
                output[d:n] = mla_prefill(s, q_full, latent, m.prefill_query_start_loc,
                                          m.prefill_context_start_loc)
        return output

    def compile_prefill_kernels(self, positions: torch.Tensor, q: torch.Tensor, kv_c: torch.Tensor,
                                k_pe: torch.Tensor) -> None:
        """Run the prefill path's Triton kernels once on this layer's shapes during vLLM's batch-less
        warm-up passes, so that Triton compiles them at start-up rather than on the first prompt (the
        decode path compiles when vLLM captures its decode CUDA graphs; FA3 ships compiled)."""
        self.prefill_kernels_compiled = True
        run_latent_prefill_kernels(self.spec, positions, q, kv_c, k_pe,
                                   self.fp8_cache_dtype if self.fp8_cache else q.dtype, expanded_attention=not self.fa3)


class ATOMMLAAttention(nn.Module, AttentionLayerBase):
    """vLLM's side of one ATOM MLA layer (see the module docstring); the model calls it as the
    :class:`atom_core.layers.mla.LatentAttention` implementation."""

    writes_into_out = True  # see atom_core.layers.attention.AttentionFactory

    def __init__(self, spec: LatentAttentionSpec):
        super().__init__()
        vllm_config = get_current_vllm_config()
        self.spec = spec
        self.layer_name = spec.prefix
        self.kv_cache_dtype = vllm_config.cache_config.cache_dtype
        # Through vLLM's selector, so that ATOMPlatform decides (and logs) as for any MLA layer.
        self.attn_backend = get_attn_backend(
            spec.latent_dim, torch.get_default_dtype(), self.kv_cache_dtype, use_mla=True,
            num_heads=spec.num_heads,
        )
        if self.attn_backend is not ATOMMLABackend:
            raise NotImplementedError(
                f"ATOM's MLA models run on ATOM's MLA backend only, but vLLM chose "
                f"{self.attn_backend.get_name()} (ATOM_DISABLE_VLLM_PLUGIN_ATTENTION is set, or the "
                f"layer needs a feature ATOM's MLA lacks, e.g. kv_cache_dtype={self.kv_cache_dtype!r}). "
                "Set ATOM_DISABLE_VLLM_PLUGIN=1 to serve the model with vLLM's own implementation."
            )
        fp8_cache = _fp8_cache(self.kv_cache_dtype)
        self.impl = ATOMMLAImpl(spec, mla_kernels(fp8_cache, mla_widths(spec)), fp8_cache)
        # vLLM's default scale of an FP8 cache, under the name its attention layers give it.
        self.register_buffer("_k_scale", torch.ones((), dtype=torch.float32), persistent=False)
        self.model_dtype = vllm_config.model_config.dtype
        self.kv_cache = torch.tensor([])
        forward_context = vllm_config.compilation_config.static_forward_context
        if self.layer_name in forward_context:
            raise ValueError(f"Duplicate layer name: {self.layer_name}")
        forward_context[self.layer_name] = self

    def get_attn_backend(self) -> type[AttentionBackend]:
        return self.attn_backend

    def load_kv_cache_scales(self, k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> None:
        """A checkpoint's KV-cache scales (atom_core.layers.attention), applied as vLLM's KV-cache
        method applies them to its own MLA layers: an FP8 latent cache divides by ``k_scale`` (also
        what a legacy single ``kv_scale`` loads into), rounded to the model dtype as vLLM's scale
        parameters are and doubled on FNUZ platforms; ``v_scale`` has no latent-cache use. A 16-bit
        cache ignores them."""
        if k_scale is None or not _fp8_cache(self.kv_cache_dtype):
            return
        scale = k_scale.to(self.model_dtype).float().reshape(())
        self._k_scale.copy_(scale * 2 if current_platform.is_fp8_fnuz() else scale)

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> MLAAttentionSpec:
        return MLAAttentionSpec(
            block_size=vllm_config.cache_config.block_size,
            num_kv_heads=1,
            head_size=self.spec.latent_dim,
            dtype=kv_cache_dtype_str_to_dtype(self.kv_cache_dtype, vllm_config.model_config),
            cache_dtype_str=self.kv_cache_dtype,
        )

    def forward(self, positions: torch.Tensor, q: torch.Tensor, kv_c: torch.Tensor,
                k_pe: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        metadata, _, kv_cache, _ = get_attention_context(self.layer_name)
        if out is None:
            out = q.new_empty(q.shape[0], self.spec.num_heads * self.spec.v_head_dim)
        kv_scale = self._k_scale if _fp8_cache(self.kv_cache_dtype) else None
        return self.impl.forward(positions, q, kv_c, k_pe, cache_layout.latent_view(kv_cache), metadata, out,
                                 kv_scale)
