"""The SGLang releases this plugin supports: the range atom-sglang's package metadata requires, checked
as atom_core.hosting.version checks every host.

The plugin hooks a few SGLang internals (see :mod:`atom_sglang.patches`) whose names and signatures
change between releases, so it activates only inside that range; where they differ inside it, the
glue branches on the helpers below.
"""

from __future__ import annotations

import functools

from atom_core.hosting.version import HostRelease
from atom_sglang import envs

SGLANG_RELEASE = HostRelease(host="SGLang", plugin="atom-sglang", distributions=("sglang",),
                             switches=envs.SWITCHES)


@functools.cache
def sglang_release() -> tuple[int, int, int]:
    """(major, minor, patch) of the installed SGLang: (0, 5, 17)."""
    major, minor, patch = (SGLANG_RELEASE.installed_release() + (0, 0))[:3]
    return major, minor, patch


def resolves_server_args_in_steps() -> bool:
    """Whether SGLang resolves its server arguments in the steps of ``sglang.srt.arg_groups``
    (0.5.19 and later): each step declares its decisions (``declare_resolution``) over the operator's
    input, which stays as given, and ``ServerArgs.resolve_once`` runs them. SGLang 0.5.17 and 0.5.18
    resolve in ``ServerArgs``' own methods, which assign the fields while the record is built."""
    return sglang_release() >= (0, 5, 19)


def cpu_fp8_kv_cache_needs_intel_amx() -> bool:
    """Whether SGLang runs an FP8 KV cache on CPU with its own ``intel_amx`` attention only (and only
    on CPUs with AMX): 0.5.20 and later refuse any other backend there at start-up."""
    return sglang_release() >= (0, 5, 20)
