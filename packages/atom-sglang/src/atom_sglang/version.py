"""The SGLang release this plugin supports: the one atom-sglang's package metadata requires, checked
as atom_core.hosting.version checks every host.

The plugin hooks a few SGLang internals (see :mod:`atom_sglang.patches`) whose names and signatures
change between releases, so it activates only on the release it was tested with.
"""

from __future__ import annotations

from atom_core.hosting.version import HostRelease
from atom_sglang import envs

SGLANG_RELEASE = HostRelease(host="SGLang", plugin="atom-sglang", distributions=("sglang",),
                             switches=envs.SWITCHES)
