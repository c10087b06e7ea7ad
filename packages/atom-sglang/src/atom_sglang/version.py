"""The SGLang release this plugin is built and tested against.

The plugin hooks a few SGLang internals (see :mod:`atom_sglang.patches`) whose names and signatures
change between releases, so it activates only on the release it was tested with.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from atom_sglang import envs

REQUIRED_SGLANG = "0.5.17"


class SglangVersionError(RuntimeError):
    pass


def check_sglang_version() -> None:
    try:
        found = version("sglang")
    except PackageNotFoundError as exc:
        raise SglangVersionError(f"atom-sglang needs SGLang {REQUIRED_SGLANG}, but it is not installed") from exc
    if found.split("+")[0] == REQUIRED_SGLANG or envs.version_check_skipped():
        return
    raise SglangVersionError(
        f"atom-sglang needs SGLang {REQUIRED_SGLANG}, found {found}. Install sglang=={REQUIRED_SGLANG}, "
        "or set ATOM_SKIP_SGLANG_VERSION_CHECK=1 to try anyway."
    )
