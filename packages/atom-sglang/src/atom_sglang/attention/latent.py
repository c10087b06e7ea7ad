"""``atom`` for MLA models: ATOM's latent attention over SGLang's MLA KV pool.

SGLang's ``MLATokenToKVPool`` keeps one latent ``[kv_c | rope(k_pe)]`` per token slot (``[slots, 1,
kv_lora_rank + rope_dim]``, FP8 e4m3 under ``--kv-cache-dtype fp8_e4m3``, written without a scale).
ATOM's MLA layers (atom_sglang.host_hooks.RadixLatentAttentionImpl) hand this backend the layer's
raw ``(positions, q, kv_c, k_pe)``; it runs what ATOM's vLLM MLA backend runs on its Triton kernels:

- decode: q_nope absorbed through W_UK, one fused op rotates q_pe and k_pe and writes the pool, the
  absorbed attention reads the pool (an FP8 one inside the kernel), W_UV lifts the result;
- extend (fresh prompts, chunked prefill, radix-cache hits, mixed batches): the same fused op with the
  raw q_nope, then each sequence's whole latent context is gathered from the pool and expanded to
  per-head K/V for causal attention.

Why it exists: SGLang's FlashAttention-3 MLA path converts a layer's whole FP8 pool to bf16 on every
call (``get_key_buffer(...).to(q.dtype)``), which took both engines to a quarter of their bf16-cache
speed on an H100; on this backend ATOM made 3.91x SGLang alone's throughput there (DeepSeek-V2-Lite,
benchmarks/results/offline-sglang-h100.json.gz[2026-12-06-9834b90-mla-kv-fp8]).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
from torch import nn

from atom_core.hosting.warmup import latent_inputs, run_latent_prefill_kernels
from atom_core.layers.mla import LatentAttentionSpec, absorb_q, mla_decode, mla_prefill, rope_and_cache
from atom_kernels.cache import FP8_CACHE_DTYPES
from atom_sglang.attention.backend import ATOMAttentionBackend

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner


@dataclass
class LatentContext:
    """Extend batches: each sequence's whole context (cached and new tokens) as pool slots."""

    start_loc: torch.Tensor  # [batch + 1] int32: where each sequence's context starts in ``slots``
    slots: torch.Tensor  # [context tokens] int64


class ATOMLatentAttentionBackend(ATOMAttentionBackend):
    def __init__(self, model_runner: ModelRunner):
        super().__init__(model_runner)
        # SGLang writes its FP8 latent pool unscaled; ATOM's kernels read it at scale 1.0.
        self.kv_scale = torch.ones((), dtype=torch.float32, device=self.device) if self.fp8_cache else None
        self.context: LatentContext | None = None

    @staticmethod
    def check_pool(pool, model_runner: ModelRunner) -> None:
        if type(pool) is not MLATokenToKVPool or pool.use_dsa or (
                pool.dtype != model_runner.dtype and pool.dtype not in FP8_CACHE_DTYPES):
            raise NotImplementedError(
                f"the atom attention backend runs MLA over SGLang's plain latent pool of the model's dtype "
                f"or FP8 e4m3; this model runs with {type(pool).__name__} of {pool.dtype} "
                f"(kv_cache_dtype={model_runner.server_args.kv_cache_dtype}). Choose another --attention-backend."
            )

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        super().init_forward_metadata(forward_batch)
        self.context = None
        if forward_batch.forward_mode.is_decode_or_idle() or not forward_batch.batch_size:
            return
        seq_lens = forward_batch.seq_lens
        total = int(forward_batch.seq_lens_cpu.sum())
        start_loc = torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32, device=self.device)
        torch.cumsum(seq_lens, 0, out=start_loc[1:])
        rows = forward_batch.req_pool_indices.repeat_interleave(seq_lens, output_size=total)
        positions = torch.arange(total, device=self.device) - start_loc[:-1].repeat_interleave(
            seq_lens, output_size=total)
        self.context = LatentContext(start_loc, self.req_to_token_pool.req_to_token[rows, positions].long())

    def compile_prefill_kernels(self, model: nn.Module, dtype: torch.dtype) -> int:
        """The extend path's kernels, once per MLA geometry of ``model`` (see the base class)."""
        from atom_sglang.host_hooks import RadixLatentAttentionImpl

        geometries = {}
        for impl in model.modules():
            if isinstance(impl, RadixLatentAttentionImpl):
                s = impl.spec
                geometries.setdefault((s.num_heads, s.qk_nope_head_dim, s.qk_rope_head_dim, s.v_head_dim,
                                       s.kv_lora_rank), s)
        for spec in geometries.values():
            run_latent_prefill_kernels(spec, *latent_inputs(spec, dtype, self.device), self.token_to_kv_pool.dtype,
                                       expanded_attention=True, block_size=self.page_size)
        return len(geometries)

    def latent_pool(self, layer: RadixAttention) -> torch.Tensor:
        """The layer's pool as a paged latent cache [pages, page_size, kv_lora_rank + rope_dim]."""
        pool = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        return pool.view(-1, self.page_size, pool.shape[-1])

    def forward_extend(self, *args, **kwargs):
        raise NotImplementedError("ATOM's MLA layers call attend_latent; no SGLang model runs on this backend")

    forward_decode = forward_extend

    def attend_latent(self, spec: LatentAttentionSpec, layer: RadixAttention, forward_batch: ForwardBatch,
                      positions: torch.Tensor, q: torch.Tensor, kv_c: torch.Tensor,
                      k_pe: torch.Tensor) -> torch.Tensor:
        """One MLA layer: q [T, H, P + R], kv_c [T, L], k_pe [T, R], rope not applied -> [T, H * V]."""
        s, m, nope = spec, self.forward_metadata, spec.qk_nope_head_dim
        cache, slots = self.latent_pool(layer), forward_batch.out_cache_loc
        if forward_batch.forward_mode.is_decode_or_idle():
            q_latent = rope_and_cache(s, positions, absorb_q(s, q[..., :nope]), q[..., nope:], kv_c, k_pe, cache,
                                      slots, self.kv_scale)
            return mla_decode(s, q_latent, cache, m.query_start_loc, m.seq_lens, m.block_table,
                              kv_scale=self.kv_scale)
        q_full = rope_and_cache(s, positions, q[..., :nope], q[..., nope:], kv_c, k_pe, cache, slots, self.kv_scale)
        latent = cache.view(-1, cache.shape[-1])[self.context.slots]
        if self.kv_scale is not None:
            latent = (latent.float() * self.kv_scale).to(q.dtype)
        return mla_prefill(s, q_full, latent, m.query_start_loc, self.context.start_loc)
