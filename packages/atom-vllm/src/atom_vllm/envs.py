"""Environment switches of the vLLM plugin: ATOM_DISABLE_VLLM_PLUGIN, ATOM_DISABLE_VLLM_PLUGIN_ATTENTION
(ATOM models on vLLM's own attention backend) and ATOM_SKIP_VLLM_VERSION_CHECK
(atom_core.envs.HostSwitches says what each does); ATOM_VLLM_FP8_KV_ATTENTION (below)."""

import os

from atom_core.envs import HostSwitches

SWITCHES = HostSwitches("VLLM")
plugin_disabled = SWITCHES.plugin_disabled
attention_disabled = SWITCHES.attention_disabled

FP8_KV_ATTENTION_VARIABLE = "ATOM_VLLM_FP8_KV_ATTENTION"
HOST, ATOM = "host", "atom"


def fp8_kv_attention() -> str | None:
    """ATOM_VLLM_FP8_KV_ATTENTION: who serves the MHA layers of an FP8 KV cache, ``host`` (vLLM's own
    backend) or ``atom`` (ATOM's kernels); unset: the platform's measured choice
    (atom_vllm.platform.host_serves_fp8_cache)."""
    requested = os.environ.get(FP8_KV_ATTENTION_VARIABLE) or None
    if requested not in (None, HOST, ATOM):
        raise ValueError(f"{FP8_KV_ATTENTION_VARIABLE}={requested!r}: expected {HOST!r} or {ATOM!r}")
    return requested
