"""Plug SGLang's TP group and attention layers into atom-core (see atom_core.distributed,
atom_core.layers.attention and atom_core.layers.mla; Gated DeltaNet cores: atom_sglang.attention.gated_delta).

ATOM's attention front-ends call ``impl(q, k, v)`` (MHA/GQA) and ``impl(positions, q, kv_c, k_pe)``
(MLA); SGLang's ``RadixAttention`` also needs the ``ForwardBatch``. The model wrapper binds the batch
of the running forward in a context variable (:func:`bind_forward_batch`) and the impls read it
there, so atom-core's model code stays free of SGLang types.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING

import torch
from torch import nn

from atom_core.distributed import TPGroup, set_tp_group
from atom_core.layers.attention import AttentionSpec, set_attention_factory
from atom_core.layers.gated_delta_core import set_gated_delta_core_factory
from atom_core.layers.mla import LatentAttentionSpec, absorb_q, set_latent_attention_factory, up_project_v
from atom_sglang.attention.window import to_sglang_window
from atom_sglang.resolved_args import attention_backends, server_args_in_effect

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

_current_forward_batch: ContextVar[ForwardBatch | None] = ContextVar(
    "atom_sglang_forward_batch", default=None
)


@contextlib.contextmanager
def bind_forward_batch(forward_batch: ForwardBatch) -> Iterator[None]:
    token = _current_forward_batch.set(forward_batch)
    try:
        yield
    finally:
        _current_forward_batch.reset(token)


def current_forward_batch() -> ForwardBatch:
    forward_batch = _current_forward_batch.get()
    if forward_batch is None:
        raise RuntimeError("ATOM attention ran outside an SGLang forward (no ForwardBatch bound)")
    return forward_batch


class RadixAttentionImpl(nn.Module):
    """ATOM attention as an SGLang ``RadixAttention``: SGLang owns the KV pool and the backend."""

    def __init__(self, spec: AttentionSpec):
        super().__init__()
        from sglang.srt.layers.radix_attention import RadixAttention

        self.attn = RadixAttention(
            spec.num_heads,
            spec.head_size,
            spec.scale,
            spec.num_kv_heads,
            spec.layer_id,
            sliding_window_size=to_sglang_window(spec.sliding_window),
            prefix=spec.prefix,
        )
        # The spec, not the sinks tensor itself: the sinks are a parameter of the model's attention
        # block, and an nn.Module attribute would register them a second time under this name.
        self.spec = spec

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        extra = {} if self.spec.sinks is None else {"sinks": self.spec.sinks}
        return self.attn(q, k, v, current_forward_batch(), **extra)

    def load_kv_cache_scales(self, **scales: torch.Tensor) -> None:
        """The checkpoint's scales (atom_core.layers.attention; compressed-tensors ones are handed
        back, atom_sglang.config_translation), applied by SGLang's own KV-cache method as SGLang's
        Llama applies an ``fp8`` checkpoint's: a legacy ``kv_scale`` serves V too, FNUZ platforms
        double them. SGLang's FP8 pools read them; other pools ignore them."""
        from sglang.srt.layers.quantization.kv_cache import BaseKVCacheMethod

        method = BaseKVCacheMethod(None)
        with torch.device(next(iter(scales.values())).device):
            method.create_weights(self.attn)
        for name, scale in scales.items():
            getattr(self.attn, name).data.copy_(scale.reshape(()))
        method.process_weights_after_loading(self.attn)


def backend_takes_rope_apart(forward_batch: ForwardBatch) -> bool:
    """Whether SGLang's attention backend of this batch takes MLA's rope part apart from the latent
    (``q_rope`` / ``k_rope``), as SGLang's DeepSeek hands it to the backends it lists in
    ``FORWARD_ABSORB_CORE_ATTENTION_BACKENDS`` (fa3 and flashinfer among them: their MLA cache write
    needs ``k_rope``), rather than concatenated (triton, torch_native). The backend's name is
    resolved as SGLang's DeepSeek resolves it: the runner's per-phase name on the backend, else the
    server's setting."""
    from sglang.srt.model_executor.forward_context import get_attn_backend
    from sglang.srt.models.deepseek_common.utils import FORWARD_ABSORB_CORE_ATTENTION_BACKENDS

    backend = get_attn_backend()
    prefill, decode = attention_backends(server_args_in_effect())
    if forward_batch.forward_mode.is_decode_or_idle():
        name = getattr(backend, "decode_attention_backend_str", None) or decode
    else:
        name = getattr(backend, "prefill_attention_backend_str", None) or prefill
    return name in FORWARD_ABSORB_CORE_ATTENTION_BACKENDS


class RadixLatentAttentionImpl(nn.Module):
    """ATOM's MLA over SGLang's MLA KV pool, in the absorbed form for every batch: one shared
    latent "KV head" ``[kv_c | rope(k_pe)]`` of kv_lora_rank + rope dims whose first kv_lora_rank
    channels are the values, queries ``[q_nope W_UK | rope(q_pe)]``, output lifted by W_UV. SGLang's
    pool stores exactly that latent per token; SGLang's MLA-capable backends run the attention,
    given the rope parts apart or concatenated as each backend takes them
    (:func:`backend_takes_rope_apart`). On ATOM's own backend the layer hands it the raw inputs
    (atom_sglang.attention.latent)."""

    def __init__(self, spec: LatentAttentionSpec):
        super().__init__()
        from sglang.srt.layers.radix_attention import RadixAttention

        self.attn = RadixAttention(
            spec.num_heads,
            spec.latent_dim,
            spec.scale,
            1,
            spec.layer_id,
            v_head_dim=spec.kv_lora_rank,
            prefix=spec.prefix,
        )
        # The spec, not its modules: kv_b_proj and rotary_emb belong to the model's MLA block.
        self.spec = spec

    def forward(self, positions: torch.Tensor, q: torch.Tensor, kv_c: torch.Tensor,
                k_pe: torch.Tensor) -> torch.Tensor:
        from sglang.srt.model_executor.forward_context import get_attn_backend

        from atom_sglang.attention.latent import ATOMLatentAttentionBackend

        s = self.spec
        forward_batch = current_forward_batch()
        backend = get_attn_backend()
        if isinstance(backend, ATOMLatentAttentionBackend):
            return backend.attend_latent(s, self.attn, forward_batch, positions, q, kv_c, k_pe)
        q_pe, k_pe = s.rotary_emb(positions, q[..., s.qk_nope_head_dim :], k_pe)
        q_nope = absorb_q(s, q[..., : s.qk_nope_head_dim])
        if backend_takes_rope_apart(forward_batch):
            out = self.attn(q_nope, kv_c, kv_c, forward_batch, q_rope=q_pe, k_rope=k_pe.unsqueeze(1))
        else:
            q_latent = torch.cat([q_nope, q_pe], dim=-1)
            out = self.attn(q_latent.reshape(q.shape[0], -1), torch.cat([kv_c, k_pe], dim=-1), kv_c, forward_batch)
        return up_project_v(s, out.view(q.shape[0], s.num_heads, s.kv_lora_rank))


def install_sglang_hooks() -> None:
    from sglang.srt.distributed import communication_op, parallel_state

    from atom_sglang.attention.gated_delta import RadixGatedDeltaCore

    set_tp_group(TPGroup.from_host(parallel_state, communication_op))
    set_attention_factory(RadixAttentionImpl)
    set_latent_attention_factory(RadixLatentAttentionImpl)
    set_gated_delta_core_factory(RadixGatedDeltaCore)
