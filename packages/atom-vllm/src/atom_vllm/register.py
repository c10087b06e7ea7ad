"""vLLM entry points. vLLM calls them in every process, possibly several times: both are idempotent
and cheap (no model or kernel imports here)."""

from __future__ import annotations

from atom_core.hosting.version import HostVersionError
from atom_core.log import logger
from atom_vllm import envs
from atom_vllm.version import VLLM_RELEASE

PLATFORM_QUALNAME = "atom_vllm.platform.ATOMPlatform"
DENSE_WRAPPER = "atom_vllm.model_wrapper:ATOMForCausalLM"
MOE_WRAPPER = "atom_vllm.model_wrapper:ATOMMoEForCausalLM"
HYBRID_WRAPPER = "atom_vllm.model_wrapper:ATOMHybridForCausalLM"
VISION_LANGUAGE_MODULE = "atom_vllm.vision_language"
MHA_BACKEND = "atom_vllm.attention.mha.ATOMAttentionBackend"
MLA_BACKEND = "atom_vllm.attention.mla.ATOMMLABackend"
# vLLM vision-language classes that build their language model through vLLM's model registry (vLLM
# 0.26's ``init_vllm_registered_model``), under an architecture ATOM registers: ATOM serves that
# language model with no class of its own for the VLM.
REGISTRY_BUILT_LANGUAGE_MODELS = {"KimiK25ForConditionalGeneration": "DeepseekV2ForCausalLM"}

_registered_models = False


def register_platform() -> str | None:
    """``vllm.platform_plugins``: the qualname of ATOMPlatform, or None to stay out of the way."""
    if envs.plugin_disabled():
        return None
    try:
        VLLM_RELEASE.check()
    except HostVersionError as exc:
        # vLLM swallows exceptions from platform plugins; say it loudly and do not activate.
        logger.error("platform plugin not activated: %s", exc)
        return None
    return PLATFORM_QUALNAME


def wrapper_for(architecture: str, entry) -> str:
    """ATOM's vLLM model class for an atom_core.models registry entry."""
    if entry.vision_language:
        return f"{VISION_LANGUAGE_MODULE}:ATOM{architecture}"
    if entry.recurrent_state:
        return HYBRID_WRAPPER
    return MOE_WRAPPER if entry.is_moe else DENSE_WRAPPER


def register_model() -> None:
    """``vllm.general_plugins``: point vLLM's registry at ATOM for each supported architecture."""
    global _registered_models
    if envs.plugin_disabled() or _registered_models:
        return
    VLLM_RELEASE.check()
    from vllm import ModelRegistry
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from atom_core.models import SUPPORTED_ARCHITECTURES
    from atom_vllm.registry_entry import register_atom_model

    for architecture, entry in SUPPORTED_ARCHITECTURES.items():
        wrapper = wrapper_for(architecture, entry)
        register_atom_model(ModelRegistry, architecture, wrapper)
        logger.info("Register model %s to vLLM with %s", architecture, wrapper)
    # ATOM's backend names itself CUSTOM (vLLM's slot for out-of-tree attention backends).
    register_backend(AttentionBackendEnum.CUSTOM, MHA_BACKEND)
    _registered_models = True
