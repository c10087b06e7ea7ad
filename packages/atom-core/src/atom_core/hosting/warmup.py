"""Start-up warm-up: which ATOM kernels a host glue runs once before serving, and on what.

Triton compiles a kernel variant the first time it is launched with it (constexprs, dtypes, and
which integer arguments and pointers are 16-divisible). A variant first met while serving stalls the
engine for the length of the compile; on a fresh H200 that cost SGLang+ATOM a fifth of its
throughput. Decode kernels compile when the host captures its decode CUDA graphs; the kernels here
are the ones only prefill batches reach. Each glue calls them from its own start-up hook
(atom_vllm: vLLM's batch-less profile and warm-up passes; atom_sglang: the attention backend's
construction and SGLang's after-loading hook of the model) and logs with :func:`log_warm_up`.
"""

from __future__ import annotations

import torch
from torch import nn

import atom_kernels
from atom_core.layers.gated_delta_core import CachedStateBatch, GatedDeltaCoreSpec, forward_with_state_cache
from atom_core.layers.mla import LatentAttentionSpec, mla_prefill, rope_and_cache
from atom_core.layers.moe import SparseMoeBlock
from atom_core.log import logger
from atom_kernels.cache import FP8_CACHE_DTYPES

WARM_UP_TOKENS = 16


def run_prefill_attention_kernels(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> bool:
    """Run the attention kernels of prefill batches once on the first :data:`WARM_UP_TOKENS` rows of
    a layer's ``query`` [T, H, D], ``key`` and ``value`` [T, KH, D]: varlen attention (one fresh
    prompt over its own K/V), then the paged kernel's non-decode variant over the layer's caches
    [blocks, block_size, KH, D] (chunked prefill and prefix-cache hits: one decode and one extend
    request, every page of which is block 0; only read). Triton specializes on strides and
    alignment, so pass the layer's own tensors, or views laid out as the layer hands them over
    (:func:`fused_qkv`). The results are discarded (written into ``out`` where given). False, and
    nothing run, below 3 tokens: the extend request needs more tokens than there are requests."""
    n = min(query.shape[0], WARM_UP_TOKENS)
    if n < 3:
        return False
    first = None if out is None else out[:n]
    int32 = dict(dtype=torch.int32, device=query.device)
    cu_seqlens = torch.tensor([0, n], **int32)
    atom_kernels.varlen_attention(query[:n], key[:n], value[:n], cu_seqlens, cu_seqlens, scale, True,
                                  sliding_window, sinks, out=first)
    pages = -(-n // key_cache.shape[1])
    atom_kernels.paged_attention(
        query[:n], key_cache, value_cache, torch.tensor([0, 1, n], **int32), torch.tensor([1, n], **int32),
        torch.zeros((2, pages), **int32), scale, sliding_window, sinks, out=first, k_scale=k_scale,
        v_scale=v_scale,
    )
    return True


def fused_qkv(num_heads: int, num_kv_heads: int, head_size: int, dtype: torch.dtype,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Zero q [T, H, D], k and v [T, KH, D] of :data:`WARM_UP_TOKENS` tokens, as views of one
    [T, (H + 2 KH) D] buffer: the layout of a fused QKV projection's output, for a host that warms up
    without a forward pass to take the layer's own tensors from."""
    sizes = [num_heads * head_size, num_kv_heads * head_size, num_kv_heads * head_size]
    qkv = torch.zeros(WARM_UP_TOKENS, sum(sizes), dtype=dtype, device=device)
    q, k, v = qkv.split(sizes, dim=-1)
    return (q.view(-1, num_heads, head_size), k.view(-1, num_kv_heads, head_size),
            v.view(-1, num_kv_heads, head_size))


def run_latent_prefill_kernels(spec: LatentAttentionSpec, positions: torch.Tensor, q: torch.Tensor,
                               kv_c: torch.Tensor, k_pe: torch.Tensor, cache_dtype: torch.dtype,
                               expanded_attention: bool, block_size: int = WARM_UP_TOKENS) -> None:
    """Run an MLA layer's prefill path once on the first :data:`WARM_UP_TOKENS` rows of its
    ``(positions, q, kv_c, k_pe)``: the rope and cache write with the raw ``q_nope`` (a
    specialisation of its own, which an H200 run saw compiling on the first prompt) into a scratch
    cache of ``cache_dtype`` (FP8: scale 1.0) in blocks of the host's ``block_size`` (Triton
    specialises on a block size of 1, SGLang's default page), then, where ATOM's kernels run it
    (``expanded_attention``), the expanded attention over the rounded latents. Pass the layer's own
    tensors or views laid out as the layer hands them over (:func:`latent_inputs`). Results discarded."""
    n = min(q.shape[0], WARM_UP_TOKENS)
    if n < 2:
        return
    nope, width = spec.qk_nope_head_dim, kv_c.shape[-1] + spec.qk_rope_head_dim
    scratch = torch.empty((-(-WARM_UP_TOKENS // block_size), block_size, width), device=q.device,
                          dtype=cache_dtype)
    fp8 = cache_dtype in FP8_CACHE_DTYPES
    kv_scale = torch.ones((), dtype=torch.float32, device=q.device) if fp8 else None
    slots = torch.arange(n, device=q.device)
    q_full = rope_and_cache(spec, positions[:n], q[:n, :, :nope], q[:n, :, nope:], kv_c[:n], k_pe[:n], scratch,
                            slots, kv_scale)
    if not expanded_attention:
        return
    latent = scratch.view(-1, width)[:n]
    latent = latent if kv_scale is None else (latent.float() * kv_scale).to(q.dtype)
    cu_seqlens = torch.tensor([0, n], dtype=torch.int32, device=q.device)
    mla_prefill(spec, q_full, latent, cu_seqlens, cu_seqlens)


def latent_inputs(spec: LatentAttentionSpec, dtype: torch.dtype, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Zero ``(positions, q, kv_c, k_pe)`` of :data:`WARM_UP_TOKENS` tokens laid out as
    :class:`atom_core.layers.mla.MultiHeadLatentAttention` hands them over (``k_pe`` a view of the
    latent projection's output), for a host that warms up without a forward pass."""
    n, rank, rope = WARM_UP_TOKENS, spec.kv_lora_rank, spec.qk_rope_head_dim
    q = torch.zeros(n, spec.num_heads, spec.qk_nope_head_dim + rope, dtype=dtype, device=device)
    kv_a = torch.zeros(n, rank + rope, dtype=dtype, device=device)
    return torch.arange(n, device=device), q, kv_a[:, :rank].contiguous(), kv_a[:, rank:]


def run_gated_delta_prefill_kernels(spec: GatedDeltaCoreSpec, mixed_qkv: torch.Tensor, g: torch.Tensor,
                                    beta: torch.Tensor, conv_cache: torch.Tensor, state_cache: torch.Tensor,
                                    index_dtype: torch.dtype = torch.int32) -> bool:
    """Run a Gated DeltaNet core's prefill kernels (conv, its state write, the chunked delta rule's
    two launches) once on one fresh sequence of the first :data:`WARM_UP_TOKENS` rows of the layer's
    ``mixed_qkv``, ``g`` and ``beta``. The states go to one scratch row laid out as a row of
    ``conv_cache`` / ``state_cache`` (the host's caches: same dtype and strides, so the same
    variants compile; the caches themselves are not written); ``index_dtype``: the dtype of the host's
    sequence offsets and state slots. False, and nothing run, without tokens."""
    n = min(mixed_qkv.shape[0], WARM_UP_TOKENS)
    if n == 0:
        return False
    conv_row, state_row = (torch.empty_strided((1, *cache.shape[1:]), cache.stride(), dtype=cache.dtype,
                                               device=cache.device).zero_() for cache in (conv_cache, state_cache))
    index = dict(dtype=index_dtype, device=mixed_qkv.device)
    batch = CachedStateBatch(
        num_decodes=0, decode_slots=torch.zeros(0, **index), num_prefill_tokens=n,
        prefill_cu_seqlens=torch.tensor([0, n], **index), prefill_slots=torch.zeros(1, **index),
        prefill_has_initial_state=torch.zeros(1, dtype=torch.bool, device=mixed_qkv.device),
    )
    forward_with_state_cache(spec, mixed_qkv[:n], g[:n], beta[:n], conv_row, state_row, batch)
    return True


def warm_up_moe_layers(model: nn.Module, activation_dtype: torch.dtype) -> int:
    """Compile the routing and the fused MoE of every expert layer of ``model`` before serving: the
    router at each of its launch configs (:meth:`TopKRouter.warm_up`), the experts at each tuned tile
    config of their shape (:func:`atom_kernels.warm_up_fused_moe`: prefill sizes pick other tiles than
    decode sizes; nothing to compile off CUDA). ``activation_dtype``: the dtype of the hidden states
    the layers get. The number of expert layers."""
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    with torch.no_grad():
        for block in blocks:
            block.gate.warm_up(activation_dtype)
            block.experts.warm_up(block.gate.top_k, activation_dtype)
    return len(blocks)


def log_warm_up(what: str, seconds: float) -> None:
    logger.info("Warm-up before serving: %s in %.2f s", what, seconds)
