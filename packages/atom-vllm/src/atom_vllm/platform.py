"""ATOMPlatform: the platform vLLM would have chosen here, with ATOM's attention backend.

vLLM resolves exactly one platform; an activated out-of-tree plugin wins over the built-ins. So the
ATOM platform subclasses whichever built-in platform (CUDA, ROCm, CPU, ...) detects this machine and
changes only what ATOM owns: attention backend selection, and a start-up report.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from vllm.platforms import builtin_platform_plugins
from vllm.utils.import_utils import resolve_obj_by_qualname

from atom_core.hosting.takeover import (
    FP8_KV_CACHE_DTYPES,
    enforce_strict,
    other_model_impl,
    report_hand_back,
    report_not_implemented,
)
from atom_core.log import logger
from atom_core.models import SUPPORTED_ARCHITECTURES
from atom_vllm import envs
from atom_vllm.config_translation import takeover_decision
from atom_vllm.register import MHA_BACKEND, MLA_BACKEND, REGISTRY_BUILT_LANGUAGE_MODELS

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.selector import AttentionSelectorConfig


def detect_builtin_platform_qualname() -> str:
    """What vLLM's own detection would pick on this machine, ignoring plugins."""
    for detect in builtin_platform_plugins.values():
        try:
            qualname = detect()
        except Exception:  # noqa: BLE001 - vLLM's probes raise on absent hardware; same policy as vLLM.
            qualname = None
        if qualname is not None:
            return qualname
    return "vllm.platforms.interface.UnspecifiedPlatform"


_Base = resolve_obj_by_qualname(detect_builtin_platform_qualname())


def atom_serves_current_model() -> bool:
    """Whether ATOM's own model serves the model being built: an architecture ATOM implements, in
    a configuration ATOM supports (atom_core.hosting.takeover). A model ATOM hands back, or never
    took, runs on vLLM's attention as well."""
    from vllm.config import get_current_vllm_config

    return takeover_decision(get_current_vllm_config()).atom_serves


# Selector fields of later vLLM releases (0.32 has them; 0.26 none) for what ATOM's backends do not do:
# reduced-window sliding attention, decode context parallelism, adaptive speculative verification.
NEWER_SELECTOR_FEATURES = ("use_rswa", "use_dcp", "use_adaptive_verification")


def asks_newer_features(config: AttentionSelectorConfig) -> bool:
    return any(getattr(config, name, False) for name in NEWER_SELECTOR_FEATURES)


def atom_attention_supports(config: AttentionSelectorConfig) -> bool:
    """Whether ATOM's MHA backend serves this layer: what it asks for is covered, in a model ATOM
    serves (else vLLM's backend runs)."""
    from vllm.v1.attention.backend import AttentionType

    return (
        not config.use_mla
        and not config.use_sparse
        and not config.use_mm_prefix
        and not config.use_non_causal
        and not config.use_per_head_quant_scales
        and not asks_newer_features(config)
        and config.attn_type == AttentionType.DECODER
        and config.kv_cache_dtype in (None, "auto", *FP8_KV_CACHE_DTYPES)
        and atom_serves_current_model()
    )


@functools.cache
def host_serves_fp8_cache() -> bool:
    """Whether vLLM's own attention backend serves the MHA layers of an FP8 KV cache on this GPU:
    where vLLM's FlashAttention-3 reads it (Hopper), it attends in FP8 (vLLM quantizes the query),
    while ATOM's Triton kernels widen every e4m3 tile to bf16. Qwen3-8B-FP8 with an FP8 cache on an
    H200 ran at 0.99x vLLM alone this way and at 0.93x on ATOM's kernels, in one run
    (benchmarks/results/offline-fp8-h200.json[fcf7495-kv-fp8]).
    ``ATOM_VLLM_FP8_KV_ATTENTION`` (atom_vllm.envs.fp8_kv_attention) overrides. Logged once."""
    requested = envs.fp8_kv_attention()
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.fa_utils import get_flash_attn_version

    fa3_reads_fp8 = (current_platform.is_cuda() and current_platform.is_device_capability_family(90)
                     and get_flash_attn_version() == 3)
    chosen = requested or (envs.HOST if fa3_reads_fp8 else envs.ATOM)
    where = "vLLM's own attention backend" if chosen == envs.HOST else "ATOM's attention kernels"
    logger.info("FP8 KV cache: the attention layers run %s (%s=%s to change)", where,
                envs.FP8_KV_ATTENTION_VARIABLE, envs.ATOM if chosen == envs.HOST else envs.HOST)
    return chosen == envs.HOST


def cpu_runner_zeroes_only_its_layout() -> bool:
    """Whether the model being built is one with recurrent-state layers on vLLM's CPU runner. vLLM
    zeroes the full-attention cache blocks of such models when it hands them out (their pages are
    shared with the state cache); its CPU runner indexes them as ``kv_cache[block]``, the layout of
    vLLM's CPU backend, where ATOM's MHA cache has K and V outermost (the GPU runner asks the
    backend for its block dimension). So on CPU vLLM's backend serves those layers."""
    from vllm.config import get_current_vllm_config
    from vllm.platforms import current_platform

    architecture = takeover_decision(get_current_vllm_config()).architecture
    entry = SUPPORTED_ARCHITECTURES.get(architecture)
    return current_platform.is_cpu() and entry is not None and entry.recurrent_state


def atom_mla_supports(config: AttentionSelectorConfig) -> bool:
    """Whether ATOM's MLA backend serves this layer: dense MLA in a model ATOM serves. (The MLA
    layers of the models vLLM serves itself are vLLM's own and need vLLM's MLA backends.)"""
    from vllm.v1.attention.backend import AttentionType

    return (
        config.use_mla
        and not config.use_sparse
        and not asks_newer_features(config)
        and config.attn_type == AttentionType.DECODER
        and config.kv_cache_dtype in (None, "auto", *FP8_KV_CACHE_DTYPES)
        and atom_serves_current_model()
    )


class ATOMPlatform(_Base):
    _atom_attention_logged = False
    _atom_mla_logged = False
    _cpu_hybrid_logged = False

    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None) -> str:
        if not envs.attention_disabled() and atom_mla_supports(attn_selector_config):
            if not cls._atom_mla_logged:
                logger.info("Use atom MLA attention backend")
                cls._atom_mla_logged = True
            return MLA_BACKEND
        if (envs.attention_disabled() or not atom_attention_supports(attn_selector_config)
                or (attn_selector_config.kv_cache_dtype in FP8_KV_CACHE_DTYPES and host_serves_fp8_cache())):
            return super().get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)
        if cpu_runner_zeroes_only_its_layout():
            if not cls._cpu_hybrid_logged:
                logger.info("vLLM's CPU attention serves the full-attention layers of this hybrid model "
                            "(vLLM's CPU runner zeroes reused cache blocks in its own layout only)")
                cls._cpu_hybrid_logged = True
            return super().get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)
        if not cls._atom_attention_logged:
            logger.info("Use atom attention backend")
            cls._atom_attention_logged = True
        return MHA_BACKEND

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        scheduler_config = vllm_config.scheduler_config
        requested = (scheduler_config.enable_chunked_prefill, scheduler_config.max_num_batched_tokens)
        requested_prefix_caching = vllm_config.cache_config.enable_prefix_caching
        super().check_and_update_config(vllm_config)
        model_config = vllm_config.model_config
        if model_config is None:
            return
        decision = takeover_decision(vllm_config)
        if decision.architecture in SUPPORTED_ARCHITECTURES:
            # Refused here, at start-up, rather than when the workers build the model.
            enforce_strict(decision)
        if model_config.use_mla and decision.atom_serves and not envs.attention_disabled():
            # vLLM's CPU platform turns chunked prefill (0.26) and prefix caching (0.32, on CPUs
            # without AMX) off for every MLA model, because its CPU MLA backends do not run them; ATOM's
            # MLA backend does. Undo it (catalogued in patches.md; delete once vLLM leaves the choice
            # to the attention backend).
            if (scheduler_config.enable_chunked_prefill, scheduler_config.max_num_batched_tokens) != requested:
                logger.info("ATOM's MLA backend serves this model: keeping chunked prefill as configured")
                scheduler_config.enable_chunked_prefill, scheduler_config.max_num_batched_tokens = requested
            if vllm_config.cache_config.enable_prefix_caching != requested_prefix_caching:
                logger.info("ATOM's MLA backend serves this model: keeping prefix caching as configured")
                vllm_config.cache_config.enable_prefix_caching = requested_prefix_caching
        language_model = REGISTRY_BUILT_LANGUAGE_MODELS.get(decision.architecture)
        if language_model is not None:
            logger.info("vLLM's %s builds its language model as %s, which ATOM serves where it supports "
                        "the configuration", decision.architecture, language_model)
        elif decision.architecture and decision.architecture not in SUPPORTED_ARCHITECTURES:
            report_not_implemented("vLLM", decision.architecture)
        elif other_model_impl("vLLM", model_config.model_impl):
            # vLLM builds that implementation, so ATOM's wrapper, which logs hand-backs, is never asked.
            report_hand_back(decision)
