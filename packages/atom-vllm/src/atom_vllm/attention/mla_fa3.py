"""FlashAttention-3 from vLLM's wheel (``vllm.vllm_flash_attn``) as the attention core of ATOM's MLA.

On an H200 ATOM's Triton MLA kernels run level with vLLM's Triton MLA but far behind FlashAttention-3:
decode 1.1-2.2x its time at 16 heads and 1.1-9.7x at DeepSeek-V3's 128 heads (3.1-9.7x from batch 32)
(``benchmarks/mla/results-h200-a76d00e.json``); prefill attention 6x (``benchmarks/results/
profile-h200-deepseek-v2-lite-a76d00e.json``, ``profile-h200-deepseek-v3-7l.json.gz[a76d00e]``).
vLLM ships FA3 compiled for Hopper, so where it runs (sm90, 16-bit cache, DeepSeek's MLA widths:
``FA3_WIDTHS``) ATOM's MLA backend hands it the two attention cores and keeps everything around them:
absorbed q, the fused rope + latent-cache write, the K/V expansion and W_UV. ``ATOM_VLLM_MLA_KERNELS``
= ``atom`` keeps ATOM's own kernels (``atom_kernels.mla_decode`` and ``varlen_attention``)
everywhere; ``fa3`` insists on FA3 (an error where it cannot run). FA3's MLA reads no FP8 cache, so
``--kv-cache-dtype fp8`` stays on ATOM's kernels.
"""

from __future__ import annotations

import functools
import os

import torch

from atom_core.layers.mla import LatentAttentionSpec, expand_kv
from atom_core.log import logger

KERNELS_VARIABLE = "ATOM_VLLM_MLA_KERNELS"
FA3, ATOM = "fa3", "atom"


def _fa3_supports_mla() -> bool:
    from vllm.v1.attention.backends.fa_utils import flash_attn_supports_mla

    return flash_attn_supports_mla()


# The MLA widths (qk_nope, qk_rope, v, kv_lora_rank) FA3 serves here: DeepSeek-V2 / V3's, Kimi's and
# Moonlight's, which test_mla_fa3_gpu.py checks. FA3's MLA decode takes a rope part of at most 64
# channels and a latent of at least 256, and its wheel compiles few (q/k, v) width pairs for the
# prefill; other widths (small test models among them) run ATOM's kernels.
FA3_WIDTHS = (128, 64, 128, 512)


def mla_widths(config) -> tuple[int, int, int, int] | None:
    """(qk_nope, qk_rope, v, kv_lora_rank) of an HF config or a LatentAttentionSpec; None for no
    config (a VllmConfig without a model, as unit tests build one: no width check)."""
    if config is None:
        return None
    return config.qk_nope_head_dim, config.qk_rope_head_dim, config.v_head_dim, config.kv_lora_rank


def model_mla_widths(vllm_config) -> tuple[int, int, int, int] | None:
    model = vllm_config.model_config
    return mla_widths(model.hf_text_config if model is not None else None)


@functools.cache
def mla_kernels(cache_dtype_is_fp8: bool, widths: tuple[int, int, int, int] | None) -> str:
    """``fa3`` or ``atom`` for MLA layers of these :func:`mla_widths` (logged once per answer)."""
    requested = os.environ.get(KERNELS_VARIABLE) or None
    if requested not in (None, FA3, ATOM):
        raise ValueError(f"{KERNELS_VARIABLE}={requested!r}: expected {FA3!r} or {ATOM!r}")
    fa3_runs = (not cache_dtype_is_fp8 and widths in (None, FA3_WIDTHS) and torch.cuda.is_available()
                and _fa3_supports_mla())
    if requested == FA3 and not fa3_runs:
        raise ValueError(
            f"{KERNELS_VARIABLE}=fa3, but vLLM's FlashAttention-3 MLA does not run here (it needs an sm90 "
            f"GPU, a 16-bit KV cache and MLA widths {FA3_WIDTHS}; these are {widths})"
        )
    chosen = requested or (FA3 if fa3_runs else ATOM)
    where = "FlashAttention-3 from vLLM" if chosen == FA3 else "ATOM's kernels"
    logger.info("MLA attention (prefill and decode) runs %s (%s=%s to change)", where, KERNELS_VARIABLE,
                ATOM if chosen == FA3 else FA3)
    return chosen


def _flash_attn_varlen_func():
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func


def prefill(spec: LatentAttentionSpec, q: torch.Tensor, latent: torch.Tensor, cu_seqlens_q: torch.Tensor,
            cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, out: torch.Tensor) -> None:
    """The expanded form (see :func:`atom_core.layers.mla.mla_prefill`) into ``out`` [T, H * V]: FA3
    takes q/k of width P + R and v of width V as they are, so nothing is padded."""
    k, v = expand_kv(spec, latent)
    _flash_attn_varlen_func()(
        q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k, softmax_scale=spec.scale, causal=True, fa_version=3,
        out=out.view(q.shape[0], spec.num_heads, spec.v_head_dim),
    )


def decode(spec: LatentAttentionSpec, q_latent: torch.Tensor, kv_cache: torch.Tensor, query_start_loc: torch.Tensor,
           seq_lens: torch.Tensor, block_table: torch.Tensor, max_seq_len: int,
           schedule: torch.Tensor | None, num_splits: int, max_query_len: int = 1) -> torch.Tensor:
    """The absorbed form over the paged latent cache, as FA3's MLA mode takes it: the rope channels
    as q/k, the latent ones as q_v/v. A sequence's queries are its last ``query_start_loc`` tokens
    (causal; several for a short extend, ``max_query_len`` the longest). Returns [T, H, kv_lora_rank]."""
    rank = spec.kv_lora_rank
    return _flash_attn_varlen_func()(
        q=q_latent[..., rank:], k=kv_cache[..., rank:].unsqueeze(-2), v=kv_cache[..., :rank].unsqueeze(-2),
        q_v=q_latent[..., :rank], cu_seqlens_q=query_start_loc, max_seqlen_q=max_query_len, seqused_k=seq_lens,
        max_seqlen_k=max_seq_len, block_table=block_table, softmax_scale=spec.scale, causal=True, fa_version=3,
        scheduler_metadata=schedule, num_splits=num_splits,
    )


class DecodeSchedule:
    """FA3's split schedule for a decode batch, computed when vLLM builds the step's metadata (outside
    any CUDA graph). Under full CUDA graphs it lives in one persistent buffer with a fixed split cap,
    as vLLM's FlashAttention-MLA backend keeps it, so that replays read the current step's schedule."""

    def __init__(self, vllm_config, num_heads: int, rope_dim: int, kv_lora_rank: int, block_size: int,
                 dtype: torch.dtype, device: torch.device):
        compilation = vllm_config.compilation_config
        self.num_heads, self.rope_dim, self.kv_lora_rank = num_heads, rope_dim, kv_lora_rank
        self.block_size, self.dtype = block_size, dtype
        self.graph_size = compilation.max_cudagraph_capture_size or 0
        self.buffer = None
        self.graph_splits = 0
        if compilation.cudagraph_mode.has_full_cudagraphs():
            batches = max(vllm_config.scheduler_config.max_num_seqs, self.graph_size)
            self.buffer = torch.zeros(1 + 4 * ((batches + 3) // 4 * 4), dtype=torch.int32, device=device)
            self.graph_splits = vllm_config.attention_config.flash_attn_max_num_splits_for_cuda_graph

    def build(self, query_start_loc: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int,
              num_tokens: int, max_query_len: int = 1) -> tuple[torch.Tensor, int]:
        """(schedule, num_splits) for FA3, for decodes of at most ``max_query_len`` tokens each."""
        from vllm.vllm_flash_attn import get_scheduler_metadata

        splits = self.graph_splits if self.buffer is not None and num_tokens <= self.graph_size else 0
        schedule = get_scheduler_metadata(
            batch_size=seq_lens.shape[0], max_seqlen_q=max_query_len, max_seqlen_k=max_seq_len,
            num_heads_q=self.num_heads, num_heads_kv=1, headdim=self.rope_dim, cache_seqlens=seq_lens,
            qkv_dtype=self.dtype,
            headdim_v=self.kv_lora_rank, page_size=self.block_size, cu_seqlens_q=query_start_loc, causal=True,
            num_splits=splits,
        )
        if self.buffer is None:
            return schedule, splits
        n = schedule.shape[0]
        self.buffer[:n] = schedule
        self.buffer[n:] = 0
        return self.buffer[:n], splits
