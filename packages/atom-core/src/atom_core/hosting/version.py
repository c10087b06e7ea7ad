"""The host releases a glue supports, checked before the glue activates.

Each glue hooks host internals whose names and signatures change between releases, so it activates
only on the releases it supports (``ATOM_SKIP_<HOST>_VERSION_CHECK=1`` allows another, for
experiments). That range is declared once, in the glue's package metadata: the version specifier of
its requirement on the host (``sglang==0.5.17``; ``vllm>=0.26.0,<0.33`` in atom-vllm's extras), which
:class:`HostRelease` reads back. Where the host's APIs differ inside the range, the glue branches on
:meth:`HostRelease.installed_release`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, requires, version

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from atom_core.envs import HostSwitches


class HostVersionError(RuntimeError):
    """The installed host is missing, or not of a release the glue supports."""


@functools.cache
def declared_range(plugin: str, distributions: tuple[str, ...]) -> SpecifierSet:
    """The versions of the host that ``plugin``'s package metadata requires: the specifier of its
    first requirement (extras included) on one of the host's ``distributions``."""
    for line in requires(plugin) or ():
        requirement = Requirement(line)
        if requirement.name in distributions and requirement.specifier:
            return requirement.specifier
    raise HostVersionError(f"{plugin}'s package metadata declares no version range of {' / '.join(distributions)}")


@dataclass(frozen=True)
class HostRelease:
    host: str  # the host's name in messages: "vLLM"
    plugin: str  # the glue's distribution: "atom-vllm"
    distributions: tuple[str, ...]  # the host's distribution names, tried in order
    switches: HostSwitches

    @property
    def supported(self) -> SpecifierSet:
        return declared_range(self.plugin, self.distributions)

    def range_text(self) -> str:
        """The range as people write it, lower bound first: ">=0.26.0,<0.33"."""
        return ",".join(sorted(map(str, self.supported), key=lambda spec: spec.startswith("<")))

    def needs(self) -> str:
        return f"{self.host} {self.range_text()} ({' or '.join(self.distributions)})"

    def installed_version(self) -> str:
        for distribution in self.distributions:
            try:
                return version(distribution)
            except PackageNotFoundError:
                continue
        raise HostVersionError(f"{self.plugin} needs {self.needs()}, but {self.host} is not installed")

    def installed_release(self) -> tuple[int, ...]:
        """The installed host's release numbers, (0, 26, 0) for 0.26.0+cpu, for the glue's branches."""
        return Version(self.installed_version()).release

    def supports(self, found: str) -> bool:
        """Whether ``found`` is in the declared range (a local build suffix such as ``+cpu`` and
        development releases of a supported version included)."""
        return self.supported.contains(Version(found).public, prereleases=True)

    def check(self, found: str | None = None) -> None:
        """Raise :class:`HostVersionError` unless ``found`` (default: the installed host) is in the
        range, or the glue's skip switch is on."""
        found = found or self.installed_version()
        if self.supports(found) or self.switches.version_check_skipped():
            return
        raise HostVersionError(
            f"{self.plugin} needs {self.needs()}, found {self.host} {found}. Install {self.host} "
            f"{self.range_text()}, or set {self.switches.skip_version_check_name}=1 to try anyway."
        )
