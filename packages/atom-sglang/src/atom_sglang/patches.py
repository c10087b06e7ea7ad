"""Every SGLang internal that atom-sglang hooks, registered through SGLang's ``HookRegistry``.

SGLang 0.5.17 to 0.5.23 (the range of :mod:`atom_sglang.version`); :func:`hooks` names each
target as the installed release defines it. Each entry says why the hook exists and what SGLang
change would let us delete it.

1. The default attention backend: ``ServerArgs._get_default_attn_backend`` (0.5.17, 0.5.18),
   ``arg_groups.model_override_base.get_default_attn_backend`` (0.5.19 on) (AROUND). Why: SGLang
   picks the default attention backend from a fixed per-platform table; an out-of-tree backend is
   reachable only through ``--attention-backend``. ATOM models should run on ATOM's attention
   without a flag, as they do in atom-vllm, except where SGLang's default is the faster one
   (``FASTER_HOST_DEFAULTS``: FlashAttention-3 on Hopper). Remove when SGLang lets a general plugin supply a
   default backend per model (today only an out-of-tree *platform* can, via
   ``get_default_attention_backend``).
2. The CPU defaults: ``ServerArgs._handle_cpu_backends`` (0.5.17, 0.5.18),
   ``arg_groups.platform_hook.handle_cpu_backends`` (0.5.19 on) (AROUND). Why: on ``--device cpu``
   SGLang fills ``intel_amx`` before the default table of (1) is consulted, so (1) never runs
   there. Remove with (1).
3. ``sglang.srt.utils.common.support_triton`` (AROUND). Why: SGLang decides whether its own Triton
   helper kernels (positions, req_to_token writes) may run from the attention backend's *name*,
   with a hard-coded list of CPU backends; ``atom`` runs wherever Triton does and on the CPU engine.
   Remove when SGLang asks the device (or the backend object's ``support_triton()``) instead.
4. ``sglang.srt.layers.attention.attention_registry.attn_backend_wrapper`` (AROUND). Why: SGLang
   wraps a hybrid GDN model's attention backend in ``HybridLinearAttnBackend`` with its own GDN
   backend for the linear-attention layers, chosen by the config alone; ATOM's Gated DeltaNet layers
   run their own kernels and need only the state metadata
   (atom_sglang.attention.gated_delta.GatedDeltaMetadataBackend), and SGLang's GDN backend does not
   even import on CPU without ``sgl_kernel``'s CPU ops. Remove when SGLang lets a model choose the
   linear-attention backend of its hybrid wrapper.
5. ``sglang.srt.model_loader.loader._initialize_model`` (AROUND). Why: for an architecture ATOM
   registers no class of, or one ``--model-impl`` sends to another implementation, SGLang builds its
   own model and no code of ATOM's runs, so nothing would say who serves it; this hook logs the one
   line that says so (as atom-vllm's platform does). Remove when SGLang's plugins can see the model
   config of every model the scheduler builds.

Hooks only change behaviour when ATOM serves the model (or ``atom`` was chosen), so a process serving
other models, or a configuration ATOM hands back, sees SGLang's own choices.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from atom_core.hosting.takeover import FP8_KV_CACHE_DTYPES
from atom_sglang import envs
from atom_sglang.attention import BACKEND_NAME
from atom_sglang.version import cpu_fp8_kv_cache_needs_intel_amx, resolves_server_args_in_steps


def atom_serves_attention(server_args: Any, model_config: Any, use_mla_backend: bool) -> bool:
    """Whether ATOM's attention backend should be this model's default: ATOM serves the model
    (atom_core.hosting.takeover; a strict takeover refuses here, at start-up), and SGLang gives it
    the plain MHA KV pool (not the hybrid sliding-window pool of e.g. GPT-OSS) that the backend runs
    on, or MLA's latent pool in FP8 (with a 16-bit one SGLang's MLA backends serve ATOM's MLA layers:
    on Hopper FlashAttention-3, whose decode ATOM's vLLM backend runs too)."""
    from atom_core.hosting.takeover import enforce_strict
    from atom_core.models import SUPPORTED_ARCHITECTURES
    from atom_sglang.config_translation import takeover_decision

    decision = takeover_decision(server_args, model_config)
    if decision.architecture in SUPPORTED_ARCHITECTURES:
        enforce_strict(decision)
    return (
        decision.atom_serves
        and not envs.attention_disabled()
        and (not use_mla_backend or server_args.kv_cache_dtype in FP8_KV_CACHE_DTYPES)
        and not model_config.is_hybrid_swa
    )


# SGLang defaults that serve ATOM's MHA/GQA models faster than ATOM's backend, so they stay the default:
# FlashAttention-3 (Hopper) took 1214 ms of attention in a Qwen3-30B-A3B-FP8 workload pass on an H200
# where `atom` took 1472, 5735 against 5464 out tok/s, tokens identical
# (benchmarks/results/offline-sglang-h200.json.gz[2026-12-04-e7da6d3-fa3]).
FASTER_HOST_DEFAULTS = frozenset({"fa3"})


def default_attention_backend(original, server_args, use_mla_backend: bool, model_config):
    """ATOM's backend where it serves attention, except under a faster host default; for an FP8 latent
    pool always: SGLang's FA3 MLA path converts a layer's whole FP8 pool to bf16 on every call, ATOM's
    kernels read the entries in place (atom_sglang.attention.latent)."""
    host_default = original(server_args, use_mla_backend, model_config)
    if not atom_serves_attention(server_args, model_config, use_mla_backend):
        return host_default
    return BACKEND_NAME if use_mla_backend or host_default not in FASTER_HOST_DEFAULTS else host_default


def atom_default_on_cpu(view: Any, model_config: Any, use_mla_backend: bool) -> bool:
    """Whether ATOM's backend should be the default of a ``--device cpu`` server (``view``: the
    server arguments as resolved so far) that names no attention backend. Not with an FP8 KV cache
    where SGLang serves that on CPU with its own backend only."""
    return (
        view.device == "cpu"
        and view.attention_backend is None
        and not (view.kv_cache_dtype in FP8_KV_CACHE_DTYPES and cpu_fp8_kv_cache_needs_intel_amx())
        and atom_serves_attention(view, model_config, use_mla_backend)
    )


def assign_cpu_default_attention_backend(original, server_args) -> None:
    """SGLang 0.5.17 and 0.5.18: ``ServerArgs._handle_cpu_backends`` assigns the field."""
    if atom_default_on_cpu(server_args, server_args.get_model_config(), server_args.use_mla_backend()):
        server_args.attention_backend = BACKEND_NAME
    original(server_args)


def declare_cpu_default_attention_backend(original, server_args) -> None:
    """SGLang 0.5.19 and later: the ``handle_cpu_backends`` step declares its decision."""
    from sglang.srt.arg_groups.model_override_base import model_config_of, resolving_view, use_mla_backend
    from sglang.srt.arg_groups.overrides import declare_resolution

    if atom_default_on_cpu(resolving_view(server_args), model_config_of(server_args),
                           use_mla_backend(server_args)):
        declare_resolution(server_args, "atom_sglang", attention_backend=BACKEND_NAME)
    original(server_args)


def support_triton(original, backend: str) -> bool:
    if backend == BACKEND_NAME:
        from sglang.srt.utils.common import is_cpu

        return not is_cpu()
    return original(backend)


def hybrid_linear_attention_backend(original, runner, full_attn_backend):
    """Where ATOM's model serves a hybrid GDN configuration: SGLang's hybrid wrapper, full-attention
    layers on ``full_attn_backend``, linear-attention layers planned by ATOM's metadata backend."""
    from sglang.srt.configs.hybrid_arch import hybrid_gdn_config

    gdn_config = hybrid_gdn_config(runner.model_config)
    if gdn_config is None:
        return original(runner, full_attn_backend)
    from atom_sglang.attention.gated_delta import RadixGatedDeltaCore, hybrid_backend

    if not any(isinstance(module, RadixGatedDeltaCore) for module in runner.model.modules()):
        return original(runner, full_attn_backend)
    return hybrid_backend(runner, full_attn_backend, gdn_config.full_attention_layer_ids)


def report_host_model(original, model_config, *args, **kwargs):
    from sglang.srt.model_loader.utils import get_model_architecture

    from atom_core.hosting.takeover import report_hand_back, report_not_implemented
    from atom_core.models import SUPPORTED_ARCHITECTURES
    from atom_sglang.config_translation import served_architecture, takeover_decision
    from atom_sglang.resolved_args import server_args_in_effect

    architecture = served_architecture(model_config)
    if architecture and architecture not in SUPPORTED_ARCHITECTURES:
        report_not_implemented("SGLang", architecture)
    elif architecture and not get_model_architecture(model_config)[0].__module__.startswith("atom_sglang."):
        # SGLang builds another implementation (--model-impl), so ATOM's class, which logs hand-backs,
        # is never asked.
        decision = takeover_decision(server_args_in_effect(), model_config)
        if not decision.atom_serves:
            report_hand_back(decision)
    return original(model_config, *args, **kwargs)


def hooks() -> list[tuple[str, Any]]:
    """(target, AROUND hook) of each hook above, where the installed SGLang defines the target."""
    every_release = [
        ("sglang.srt.utils.common.support_triton", support_triton),
        ("sglang.srt.layers.attention.attention_registry.attn_backend_wrapper", hybrid_linear_attention_backend),
        ("sglang.srt.model_loader.loader._initialize_model", report_host_model),
    ]
    if resolves_server_args_in_steps():  # SGLang 0.5.19 to 0.5.23
        return [
            ("sglang.srt.arg_groups.model_override_base.get_default_attn_backend", default_attention_backend),
            ("sglang.srt.arg_groups.platform_hook.handle_cpu_backends", declare_cpu_default_attention_backend),
            *every_release,
        ]
    return [  # SGLang 0.5.17 and 0.5.18
        ("sglang.srt.server_args.ServerArgs._get_default_attn_backend", default_attention_backend),
        ("sglang.srt.server_args.ServerArgs._handle_cpu_backends", assign_cpu_default_attention_backend),
        *every_release,
    ]


def register_hooks() -> None:
    for target, hook in hooks():
        HookRegistry.register(target, hook, HookType.AROUND)
