"""The host release a glue is built and tested against, checked before the glue activates.

Each glue hooks host internals whose names and signatures change between releases, so it
activates only on the release series it was tested with (``ATOM_SKIP_<HOST>_VERSION_CHECK=1``
allows another, for experiments). The glues describe their host as a :class:`HostRelease`.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version

from atom_core.envs import HostSwitches


class HostVersionError(RuntimeError):
    """The installed host is missing, or not of the release series the glue supports."""


@dataclass(frozen=True)
class HostRelease:
    host: str  # the host's name in messages: "vLLM"
    plugin: str  # the glue's distribution: "atom-vllm"
    series: str  # leading version components every supported release has: "0.26" is any 0.26.x
    distributions: tuple[str, ...]  # the host's distribution names, tried in order
    needs: str  # what the errors say the glue needs: "vLLM 0.26.x (...)"
    install: str  # what they say to install
    switches: HostSwitches

    def installed_version(self) -> str:
        for distribution in self.distributions:
            try:
                return version(distribution)
            except PackageNotFoundError:
                continue
        raise HostVersionError(f"{self.plugin} needs {self.needs}, but {self.host} is not installed")

    def supports(self, found: str) -> bool:
        """Whether ``found`` is of the series (a local build suffix such as ``+cpu`` aside)."""
        series = self.series.split(".")
        return found.split("+")[0].split(".")[: len(series)] == series

    def check(self, found: str | None = None) -> None:
        """Raise :class:`HostVersionError` unless ``found`` (default: the installed host) is of
        the series, or the glue's skip switch is on."""
        found = found or self.installed_version()
        if self.supports(found) or self.switches.version_check_skipped():
            return
        raise HostVersionError(
            f"{self.plugin} needs {self.needs}, found {self.host} {found}. Install {self.install}, "
            f"or set {self.switches.skip_version_check_name}=1 to try anyway."
        )
