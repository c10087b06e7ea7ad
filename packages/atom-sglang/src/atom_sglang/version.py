"""The SGLang release this plugin is built and tested against (checked as atom_core.hosting.version
checks every host).

The plugin hooks a few SGLang internals (see :mod:`atom_sglang.patches`) whose names and signatures
change between releases, so it activates only on the release it was tested with.
"""

from __future__ import annotations

from atom_core.hosting.version import HostRelease
from atom_sglang import envs

REQUIRED_SGLANG = "0.5.17"

SGLANG_RELEASE = HostRelease(
    host="SGLang",
    plugin="atom-sglang",
    series=REQUIRED_SGLANG,
    distributions=("sglang",),
    needs=f"SGLang {REQUIRED_SGLANG}",
    install=f"sglang=={REQUIRED_SGLANG}",
    switches=envs.SWITCHES,
)
