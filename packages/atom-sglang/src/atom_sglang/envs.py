"""Environment switches of the SGLang plugin (read at call time, so tests can flip them)."""

import os


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").lower() in ("1", "true", "yes")


def plugin_disabled() -> bool:
    """ATOM_DISABLE_SGLANG_PLUGIN=1: SGLang runs exactly as if ATOM were not installed."""
    return _flag("ATOM_DISABLE_SGLANG_PLUGIN")


def attention_disabled() -> bool:
    """ATOM_DISABLE_SGLANG_PLUGIN_ATTENTION=1: ATOM models run on SGLang's default attention
    backend instead of ATOM's (``--attention-backend atom`` still selects ATOM's explicitly)."""
    return _flag("ATOM_DISABLE_SGLANG_PLUGIN_ATTENTION")


def version_check_skipped() -> bool:
    """ATOM_SKIP_SGLANG_VERSION_CHECK=1: allow an SGLang other than the pinned one (experiments only)."""
    return _flag("ATOM_SKIP_SGLANG_VERSION_CHECK")
