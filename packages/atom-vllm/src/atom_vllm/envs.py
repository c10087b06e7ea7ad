"""Environment switches of the vLLM plugin (read at call time, so tests can flip them)."""

import os


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").lower() in ("1", "true", "yes")


def plugin_disabled() -> bool:
    """ATOM_DISABLE_VLLM_PLUGIN=1: vLLM runs exactly as if ATOM were not installed."""
    return _flag("ATOM_DISABLE_VLLM_PLUGIN")


def attention_disabled() -> bool:
    """ATOM_DISABLE_VLLM_PLUGIN_ATTENTION=1: ATOM models run on vLLM's own attention backend."""
    return _flag("ATOM_DISABLE_VLLM_PLUGIN_ATTENTION")


def version_check_skipped() -> bool:
    """ATOM_SKIP_VLLM_VERSION_CHECK=1: allow a vLLM other than the pinned one (experiments only)."""
    return _flag("ATOM_SKIP_VLLM_VERSION_CHECK")
