"""Every SGLang internal that atom-sglang hooks, registered through SGLang's ``HookRegistry``.

SGLang 0.5.17 (the only release the plugin activates on, see :mod:`atom_sglang.version`). Each entry
says why the hook exists and what SGLang change would let us delete it.

1. ``ServerArgs._get_default_attn_backend`` (AROUND). Why: SGLang picks the default attention
   backend from a fixed per-platform table; an out-of-tree backend is reachable only through
   ``--attention-backend``. ATOM models should run on ATOM's attention without a flag, as they do
   in atom-vllm. Remove when SGLang lets a general plugin supply a default backend per model (today
   only an out-of-tree *platform* can, via ``get_default_attention_backend``).
2. ``ServerArgs._handle_cpu_backends`` (AROUND). Why: on ``--device cpu`` SGLang fills
   ``intel_amx`` before the default table of (1) is consulted, so (1) never runs there. Remove with (1).
3. ``sglang.srt.utils.common.support_triton`` (AROUND). Why: SGLang decides whether its own Triton
   helper kernels (positions, req_to_token writes) may run from the attention backend's *name*,
   with a hard-coded list of CPU backends; ``atom`` runs wherever Triton does and on the CPU engine.
   Remove when SGLang asks the device (or the backend object's ``support_triton()``) instead.

Hooks only change behaviour when ATOM serves the model (or ``atom`` was chosen), so a process serving
other models, or a configuration ATOM hands back, sees SGLang's own choices.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from atom_sglang import envs
from atom_sglang.attention import BACKEND_NAME


def atom_serves_attention(server_args: Any, model_config: Any, use_mla_backend: bool) -> bool:
    """Whether ATOM's attention backend should be this model's default: ATOM serves the model
    (atom_core.hosting.takeover; a strict takeover refuses here, at start-up), and SGLang gives it
    the plain MHA KV pool (not MLA's latent pool, not the hybrid sliding-window pool of e.g. GPT-OSS)
    that the backend runs on."""
    from atom_core.hosting.takeover import enforce_strict
    from atom_core.models import SUPPORTED_ARCHITECTURES
    from atom_sglang.config_translation import takeover_decision

    decision = takeover_decision(server_args, model_config)
    if decision.architecture in SUPPORTED_ARCHITECTURES:
        enforce_strict(decision)
    return (
        decision.atom_serves
        and not envs.attention_disabled()
        and not use_mla_backend
        and not model_config.is_hybrid_swa
    )


def default_attention_backend(original, server_args, use_mla_backend: bool, model_config):
    if atom_serves_attention(server_args, model_config, use_mla_backend):
        return BACKEND_NAME
    return original(server_args, use_mla_backend, model_config)


def cpu_default_attention_backend(original, server_args) -> None:
    if (
        server_args.device == "cpu"
        and server_args.attention_backend is None
        and atom_serves_attention(server_args, server_args.get_model_config(),
                                  server_args.use_mla_backend())
    ):
        server_args.attention_backend = BACKEND_NAME
    original(server_args)


def support_triton(original, backend: str) -> bool:
    if backend == BACKEND_NAME:
        from sglang.srt.utils.common import is_cpu

        return not is_cpu()
    return original(backend)


HOOKS = [
    ("sglang.srt.server_args.ServerArgs._get_default_attn_backend", default_attention_backend),
    ("sglang.srt.server_args.ServerArgs._handle_cpu_backends", cpu_default_attention_backend),
    ("sglang.srt.utils.common.support_triton", support_triton),
]


def register_hooks() -> None:
    for target, hook in HOOKS:
        HookRegistry.register(target, hook, HookType.AROUND)
