"""Multi-head latent attention (MLA, DeepSeek-V2/V3): the model-side layer and the math its backends share.

MLA caches one latent per token instead of per-head K and V: ``kv_c`` [kv_lora_rank] (L) and a
rotary key ``k_pe`` [qk_rope_head_dim] (R) that all heads share. ``kv_b_proj`` (weight
[H * (P + V), L], per head P rows of W_UK then V rows of W_UV) lifts the latent to per-head keys
``k_nope`` [P] and values [V]. The same attention has two forms:

- expanded (prefill, compute-friendly): ``k = [kv_c W_UK^T | k_pe]``, ``v = kv_c W_UV^T`` and
  ordinary attention with q/k head dim P + R (:func:`mla_prefill`);
- absorbed (decode, memory-friendly): ``q_lat = [q_nope W_UK | q_pe]`` attends over the latent
  cache itself (one KV head of dim L + R whose first L channels are the values), then the output is
  lifted by W_UV (:func:`mla_decode`). W_UK and W_UV are views of ``kv_b_proj.weight``, so the
  checkpoint's ``kv_b_proj`` serves both forms with no copy.

:class:`MultiHeadLatentAttention` owns the projections (``q_proj`` or ``q_a_proj`` /
``q_a_layernorm`` / ``q_b_proj``, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``,
``o_proj``) and hands ``(positions, q, kv_c, k_pe)`` -- rope not yet applied -- to a
:class:`LatentAttention` front-end whose implementation the host installs with
:func:`set_latent_attention_factory` (vLLM: ATOM's MLA backend over vLLM's latent paged cache).
Standalone (tests, HF parity) it runs the expanded form over :func:`standalone_batch`'s sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import atom_kernels
from atom_core.distributed import divide, get_tp_group
from atom_core.layers.attention import CheckpointKvScales, standalone_cu_seqlens
from atom_core.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from atom_core.layers.norm import RMSNorm
from atom_core.layers.rotary import RopeSpec, RotaryEmbedding, shared_rotary_embedding
from atom_core.layers.splitting_op import define_splitting_op
from atom_kernels import rope as rope_ops

# DeepSeek's reference code (and HF transformers) builds the q/kv latent norms with RMSNorm's
# default eps, not the config's rms_norm_eps.
LATENT_NORM_EPS = 1e-6


@dataclass(frozen=True)
class LatentAttentionSpec:
    """Everything a backend needs for one MLA layer (head count per TP rank)."""

    num_heads: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    kv_lora_rank: int
    scale: float
    prefix: str
    layer_id: int
    kv_b_proj: ColumnParallelLinear
    rotary_emb: RotaryEmbedding

    @property
    def latent_dim(self) -> int:
        """Width of one cache entry: ``[kv_c | k_pe]``."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def w_uk_w_uv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of kv_b_proj.weight: W_UK [H, P, L] and W_UV [H, V, L]."""
        weight = self.kv_b_proj.weight.view(
            self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank
        )
        return weight[:, : self.qk_nope_head_dim], weight[:, self.qk_nope_head_dim :]


def absorb_q(spec: LatentAttentionSpec, q_nope: torch.Tensor) -> torch.Tensor:
    """q_nope [T, H, P] -> q_nope W_UK [T, H, L] (a [T, H, L] view of an [H, T, L] product)."""
    w_uk, _ = spec.w_uk_w_uv()
    return torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)


def up_project_v(spec: LatentAttentionSpec, latent_out: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Attention output over latents [T, H, L] -> values [T, H * V] (times W_UV^T), into ``out``
    when given."""
    _, w_uv = spec.w_uk_w_uv()
    if out is None:
        out = latent_out.new_empty(latent_out.shape[0], spec.num_heads * spec.v_head_dim)
    heads_first = out.view(-1, spec.num_heads, spec.v_head_dim).transpose(0, 1)
    torch.bmm(latent_out.transpose(0, 1), w_uv.transpose(1, 2), out=heads_first)
    return out


def expand_kv(spec: LatentAttentionSpec, latent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache entries ``[kv_c | k_pe]`` [S, L + R] -> per-head keys [S, H, P + R] and values [S, H, V]."""
    p = spec.qk_nope_head_dim
    kv = spec.kv_b_proj(latent[:, : spec.kv_lora_rank]).view(-1, spec.num_heads, p + spec.v_head_dim)
    return atom_kernels.concat_mla_k(kv[..., :p], latent[:, spec.kv_lora_rank :]), kv[..., p:]


def mla_prefill(
    spec: LatentAttentionSpec,
    q: torch.Tensor,
    latent: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
) -> torch.Tensor:
    """Expanded form. q [T, H, P + R] (rope applied); ``latent`` [S, L + R] holds each sequence's
    whole context (its last ``len_q`` entries are the queries' own tokens); causal, the last query
    aligned with the last key. Returns [T, H * V]."""
    k, v = expand_kv(spec, latent)
    # varlen_attention takes one head size for q, k and v: pad the narrower side with zeros, which
    # changes neither the scores nor the (sliced) output.
    width = max(q.shape[-1], spec.v_head_dim)
    q, k, v = (x if x.shape[-1] == width else F.pad(x, (0, width - x.shape[-1])) for x in (q, k, v))
    out = atom_kernels.varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, spec.scale, True, None, None)
    return out[..., : spec.v_head_dim].reshape(q.shape[0], spec.num_heads * spec.v_head_dim)


def mla_decode(
    spec: LatentAttentionSpec,
    q_latent: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_seq_len: int | None = None,
    out: torch.Tensor | None = None,
    kv_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Absorbed form over the paged latent cache. q_latent [T, H, L + R] = [q_nope W_UK | rope(q_pe)]
    (queries are the last tokens of their sequences). Returns [T, H * V], written into ``out`` when
    given. ``kv_scale``: an FP8 cache's scale."""
    latent_out = atom_kernels.mla_decode(
        q_latent, kv_cache, query_start_loc, seq_lens, block_table, spec.scale, spec.kv_lora_rank,
        max_seq_len=max_seq_len, kv_scale=kv_scale,
    )
    return up_project_v(spec, latent_out, out)


def rope_and_cache(
    spec: LatentAttentionSpec,
    positions: torch.Tensor,
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate q_pe and k_pe, write ``[kv_c | rope(k_pe)]`` to the cache (an FP8 one: divided by
    ``kv_scale``); returns ``[q_nope | rope(q_pe)]``."""
    rotary = spec.rotary_emb
    return atom_kernels.fused_qk_rope_concat_and_cache_mla(
        q_nope, q_pe, kv_c, k_pe, kv_cache, slot_mapping, positions, rotary.cos_sin_cache, rotary.is_neox,
        kv_scale=kv_scale,
    )


LatentAttentionFactory = Callable[[LatentAttentionSpec], nn.Module]


class StandaloneLatentAttention(nn.Module):
    """Cache-less expanded MLA over the batch set by :func:`standalone_batch`."""

    def __init__(self, spec: LatentAttentionSpec):
        super().__init__()
        self.spec = spec

    def forward(self, positions: torch.Tensor, q: torch.Tensor, kv_c: torch.Tensor,
                k_pe: torch.Tensor) -> torch.Tensor:
        s = self.spec
        p = s.qk_nope_head_dim
        q_pe, k_pe = s.rotary_emb(positions, q[..., p:], k_pe)
        cu = standalone_cu_seqlens(q.device)
        return mla_prefill(s, torch.cat([q[..., :p], q_pe], dim=-1), torch.cat([kv_c, k_pe], dim=-1), cu, cu)


_factory: LatentAttentionFactory = StandaloneLatentAttention


def set_latent_attention_factory(factory: LatentAttentionFactory) -> None:
    global _factory
    _factory = factory


def get_latent_attention_factory() -> LatentAttentionFactory:
    return _factory


_layers_by_name: dict[str, LatentAttention] = {}


def unified_latent_attention(positions: torch.Tensor, q: torch.Tensor, kv_c: torch.Tensor,
                             k_pe: torch.Tensor, output: torch.Tensor, layer_name: str) -> None:
    impl = _layers_by_name[layer_name].impl
    if getattr(impl, "writes_into_out", False):  # as for atom_core.layers.attention.AttentionFactory
        impl(positions, q, kv_c, k_pe, out=output)
    else:
        output.copy_(impl(positions, q, kv_c, k_pe))


define_splitting_op(unified_latent_attention)


class LatentAttention(CheckpointKvScales):
    """Front-end: ``(positions, q [T, H, P + R], kv_c [T, L], k_pe [T, R]) -> [T, H * V]``, rope not
    yet applied to q's last R channels nor to k_pe. A checkpoint's KV-cache scales reach the host's
    impl as for MHA (atom_core.layers.attention); an FP8 latent cache applies ``k_scale``, as vLLM's
    MLA does."""

    def __init__(self, spec: LatentAttentionSpec):
        super().__init__()
        self.spec = spec
        self.impl = _factory(spec)
        # The latest model built in this process owns the name (tests build several models).
        _layers_by_name[spec.prefix] = self

    def forward(self, positions: torch.Tensor, q: torch.Tensor, kv_c: torch.Tensor,
                k_pe: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling():
            return self.impl(positions, q, kv_c, k_pe)
        output = q.new_empty(q.shape[0], self.spec.num_heads * self.spec.v_head_dim)
        torch.ops.atom.unified_latent_attention(positions, q, kv_c, k_pe, output, self.spec.prefix)
        return output


def mla_softmax_scale(qk_head_dim: int, rope: RopeSpec | Mapping[str, Any]) -> float:
    """``qk_head_dim ** -0.5``, times DeepSeek's YaRN ``mscale(factor, mscale_all_dim) ** 2``."""
    rope = RopeSpec.of(rope)
    scale = qk_head_dim**-0.5
    if rope.rope_type != "default" and rope.mscale_all_dim:
        scale *= rope_ops.yarn_get_mscale(rope.factor, rope.mscale_all_dim) ** 2
    return scale


@dataclass(frozen=True)
class MultiHeadLatentAttentionSpec:
    """The MLA of every layer of one model: :class:`MultiHeadLatentAttention`'s arguments but the
    layer's id and name."""

    hidden_size: int
    num_heads: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None
    kv_lora_rank: int
    rope: RopeSpec
    max_position: int
    rope_is_neox: bool = False
    bias: bool = False


class MultiHeadLatentAttention(nn.Module):
    """DeepSeek MLA block: projections -> :class:`LatentAttention` -> o_proj.

    ``q_lora_rank`` None projects q directly (``q_proj``, DeepSeek-V2-Lite, Moonlight); otherwise
    through a low-rank ``q_a_proj`` / ``q_a_layernorm`` / ``q_b_proj``. ``rope_is_neox`` False
    rotates interleaved channel pairs, DeepSeek's layout. Heads split across TP ranks; the latent
    projection ``kv_a_proj_with_mqa`` is replicated.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None,
        kv_lora_rank: int,
        rope: RopeSpec | Mapping[str, Any],
        max_position: int,
        layer_id: int,
        prefix: str,
        rope_is_neox: bool = False,
        bias: bool = False,
    ):
        super().__init__()
        self.num_heads = divide(num_heads, get_tp_group().world_size)
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.kv_lora_rank = kv_lora_rank
        self.q_proj = self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        if q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(
                hidden_size, num_heads * self.qk_head_dim, prefix=f"{prefix}.q_proj"
            )
        else:
            self.q_a_proj = ReplicatedLinear(hidden_size, q_lora_rank, bias, prefix=f"{prefix}.q_a_proj")
            self.q_a_layernorm = RMSNorm(q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(
                q_lora_rank, num_heads * self.qk_head_dim, prefix=f"{prefix}.q_b_proj"
            )
        self.kv_a_proj_with_mqa = ReplicatedLinear(
            hidden_size, kv_lora_rank + qk_rope_head_dim, bias, prefix=f"{prefix}.kv_a_proj_with_mqa"
        )
        self.kv_a_layernorm = RMSNorm(kv_lora_rank, LATENT_NORM_EPS)
        # Read as W_UK / W_UV views (LatentAttentionSpec.w_uk_w_uv): an FP8 checkpoint's is
        # dequantized once at load.
        self.kv_b_proj = ColumnParallelLinear(
            kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), prefix=f"{prefix}.kv_b_proj",
            dequantize=True,
        )
        self.o_proj = RowParallelLinear(num_heads * v_head_dim, hidden_size, bias, prefix=f"{prefix}.o_proj")
        self.rotary_emb = shared_rotary_embedding(
            qk_rope_head_dim, qk_rope_head_dim, max_position, rope, is_neox=rope_is_neox
        )
        self.attn = LatentAttention(
            LatentAttentionSpec(
                num_heads=self.num_heads,
                qk_nope_head_dim=qk_nope_head_dim,
                qk_rope_head_dim=qk_rope_head_dim,
                v_head_dim=v_head_dim,
                kv_lora_rank=kv_lora_rank,
                scale=mla_softmax_scale(self.qk_head_dim, rope),
                prefix=f"{prefix}.attn",
                layer_id=layer_id,
                kv_b_proj=self.kv_b_proj,
                rotary_emb=self.rotary_emb,
            )
        )

    @classmethod
    def from_spec(cls, spec: MultiHeadLatentAttentionSpec, layer_id: int,
                  prefix: str) -> MultiHeadLatentAttention:
        return cls(
            spec.hidden_size, spec.num_heads, spec.qk_nope_head_dim, spec.qk_rope_head_dim,
            spec.v_head_dim, spec.q_lora_rank, spec.kv_lora_rank, spec.rope, spec.max_position,
            layer_id, prefix, rope_is_neox=spec.rope_is_neox, bias=spec.bias,
        )

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.q_proj is not None:
            q = self.q_proj(hidden_states)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        kv_a = self.kv_a_proj_with_mqa(hidden_states)
        kv_c = self.kv_a_layernorm(kv_a[:, : self.kv_lora_rank])
        out = self.attn(positions, q.view(-1, self.num_heads, self.qk_head_dim), kv_c, kv_a[:, self.kv_lora_rank :])
        return self.o_proj(out)
