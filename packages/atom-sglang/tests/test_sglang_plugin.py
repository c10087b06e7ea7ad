"""The ``sglang.srt.plugins`` entry point, in fresh SGLang processes (no engine): idempotent,
activation from installation alone, the disable switches, and precedence of a user's own package."""

import json
import os
import sys
from importlib.metadata import entry_points, requires

import pytest
from packaging.requirements import Requirement
from sglang_testing import TESTS_DIR, run_parallel

from atom_core.models import SUPPORTED_ARCHITECTURES

pytestmark = pytest.mark.sglang

PROBE = os.path.join(TESTS_DIR, "plugin_probe.py")
MARKER = "PLUGIN_PROBE_RESULT "
# The module of ATOM's SGLang class of each architecture.
ATOM_MODULES = {a: "atom_sglang.vision_language" if entry.vision_language else "atom_sglang.model_wrapper"
                for a, entry in SUPPORTED_ARCHITECTURES.items()}
SCENARIOS = {
    "active": {},
    # As if a parent process with ATOM active had handed its model package down.
    "disabled": {"ATOM_DISABLE_SGLANG_PLUGIN": "1", "SGLANG_EXTERNAL_MODEL_PACKAGE": "atom_sglang.models"},
    "user_package": {"SGLANG_EXTERNAL_MODEL_PACKAGE": "user_models"},
}


@pytest.fixture(scope="module")
def probes(tiny_model_dir) -> dict[str, dict]:
    model = tiny_model_dir("Qwen3ForCausalLM")
    commands = [([sys.executable, PROBE, model], env) for env in SCENARIOS.values()]
    reports = {}
    for name, (returncode, stdout, stderr) in zip(SCENARIOS, run_parallel(commands, timeout=300)):
        lines = [line for line in stdout.splitlines() if line.startswith(MARKER)]
        assert returncode == 0 and lines, f"{name}: rc={returncode}\n{stdout[-3000:]}\n{stderr[-6000:]}"
        reports[name] = json.loads(lines[0][len(MARKER):])
        reports[name]["log"] = stderr
    return reports


def test_entry_point_is_installed():
    (ep,) = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "atom"]
    assert ep.value == "atom_sglang.register:register_plugin"
    assert ep.dist.name == "atom-sglang"


def test_active_after_install_and_idempotent(probes):
    report = probes["active"]
    assert report["env_package"] == "atom_sglang.models"
    assert report["backend_registered"] and report["choice_count"] == 1
    assert set(report["hooks"].values()) == {1}, report["hooks"]
    assert report["model_modules"] == ATOM_MODULES
    assert report["log"].count("INFO atom: SGLang plugin active") == 1


def test_attention_backend_selection(probes):
    report = probes["active"]
    assert report["default_backend"] == "atom"  # no flag needed
    assert report["explicit_backend"] == "torch_native"  # the user's choice wins
    # SGLang 0.5.20 and later run an FP8 KV cache on CPU with their intel_amx backend only.
    from atom_sglang.version import cpu_fp8_kv_cache_needs_intel_amx

    sglang_default = report["default_backend_attention_disabled"]  # SGLang's own choice on this CPU
    assert report["default_backend_fp8_kv_cache"] == (sglang_default if cpu_fp8_kv_cache_needs_intel_amx() else "atom")
    assert report["cli_backend"] == "atom"  # --attention-backend atom parses
    assert report["default_backend_attention_disabled"] == "torch_native"  # ATOM_DISABLE_..._ATTENTION=1
    # SGLang's Triton helpers stay off on the CPU engine with ATOM's backend, as with torch_native.
    assert report["support_triton_atom"] is False and report["support_triton_torch_native"] is False


def test_disable_switch_turns_everything_off(probes):
    report = probes["disabled"]
    assert report["env_package"] is None
    assert not report["backend_registered"] and report["choice_count"] == 0
    assert set(report["hooks"].values()) == {0}
    assert all(not m.startswith("atom_sglang") for m in report["model_modules"].values())
    assert report["model_modules"]["Qwen3ForCausalLM"] == "sglang.srt.models.qwen3"
    assert report["default_backend"] == "torch_native"
    assert "INFO atom:" not in report["log"]


def test_user_model_package_keeps_precedence(probes):
    report = probes["user_package"]
    assert report["env_package"] == "user_models"
    modules = report["model_modules"]
    assert modules.pop("Qwen3ForCausalLM") == "user_models.qwen3"
    assert modules == {a: m for a, m in ATOM_MODULES.items() if a != "Qwen3ForCausalLM"}


def test_installed_sglang_is_in_the_supported_range():
    from atom_sglang.version import SGLANG_RELEASE

    assert SGLANG_RELEASE.supports(SGLANG_RELEASE.installed_version())
    SGLANG_RELEASE.check()


def test_supported_range_is_the_one_the_package_metadata_declares():
    from atom_sglang.version import SGLANG_RELEASE

    (declared,) = [Requirement(line).specifier for line in requires("atom-sglang")
                   if Requirement(line).name == "sglang"]
    assert declared == SGLANG_RELEASE.supported
    assert SGLANG_RELEASE.range_text() == ">=0.5.17,<0.5.24"


@pytest.mark.parametrize("found", ["0.5.16", "0.5.24", "0.5.24rc0", "0.6.0"])
def test_other_sglang_versions_are_refused_naming_the_supported_range(found, monkeypatch):
    from atom_core.hosting.version import HostVersionError
    from atom_sglang.version import SGLANG_RELEASE

    monkeypatch.delenv("ATOM_SKIP_SGLANG_VERSION_CHECK", raising=False)
    with pytest.raises(HostVersionError, match=rf"atom-sglang needs SGLang >=0\.5\.17,<0\.5\.24 \(sglang\), "
                                               rf"found SGLang {found}\. Install SGLang >=0\.5\.17,<0\.5\.24, "
                                               r"or set ATOM_SKIP_SGLANG_VERSION_CHECK=1"):
        SGLANG_RELEASE.check(found)
    monkeypatch.setenv("ATOM_SKIP_SGLANG_VERSION_CHECK", "1")
    SGLANG_RELEASE.check(found)


@pytest.mark.parametrize("found", ["0.5.17", "0.5.19", "0.5.23", "0.5.23.post1"])
def test_releases_in_the_range_are_accepted(found, monkeypatch):
    from atom_sglang.version import SGLANG_RELEASE

    monkeypatch.delenv("ATOM_SKIP_SGLANG_VERSION_CHECK", raising=False)
    SGLANG_RELEASE.check(found)
    monkeypatch.setenv("ATOM_SKIP_SGLANG_VERSION_CHECK", "1")
    SGLANG_RELEASE.check(found)


@pytest.mark.parametrize("architecture, kv_cache_dtype, host_default, expected", [
    ("DeepseekV3ForCausalLM", "fp8_e4m3", "fa3", "atom"),  # ATOM's latent attention reads the FP8 pool in place
    ("DeepseekV3ForCausalLM", "auto", "fa3", "fa3"),  # a 16-bit latent pool stays on SGLang's MLA backends
    ("DeepseekV3ForCausalLM", "auto", "triton", "triton"),
    ("Qwen3ForCausalLM", "auto", "fa3", "fa3"),  # FASTER_HOST_DEFAULTS
    ("Qwen3ForCausalLM", "fp8_e4m3", "fa3", "fa3"),
    ("Qwen3ForCausalLM", "auto", "triton", "atom"),
])
def test_default_backend_on_gpus(tiny_model_dir, architecture, kv_cache_dtype, host_default, expected):
    """What ATOM makes of SGLang's GPU default attention backend (``host_default``), per model kind
    and KV-cache dtype (atom_sglang.patches.default_attention_backend)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.server_args import ServerArgs

    from atom_sglang.patches import default_attention_backend

    server_args = ServerArgs(model_path=tiny_model_dir(architecture), device="cpu", dtype="bfloat16",
                             kv_cache_dtype=kv_cache_dtype)
    use_mla = architecture.startswith("Deepseek")
    backend = default_attention_backend(lambda *args: host_default, server_args, use_mla,
                                        ModelConfig.from_server_args(server_args))
    assert backend == expected
