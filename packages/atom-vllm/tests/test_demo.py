"""The README's main job (`ci/demo.sh` runs `python -m atom_vllm.demo`): it generates and reports the
ATOM parts that served the request."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.vllm


def test_demo_reports_the_atom_parts_that_served_it():
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    run = subprocess.run([sys.executable, "-m", "atom_vllm.demo", "--max-tokens", "4"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = dict(line.split(":", 1) for line in run.stdout.splitlines()
                 if line.startswith(("platform", "model wrapper", "model:", "attention impl")))
    assert lines["platform"].strip() == "atom_vllm.platform.ATOMPlatform"
    assert lines["model wrapper"].strip() == "atom_vllm.model_wrapper.ATOMForCausalLM"
    assert lines["model"].strip() == "atom_core.models.qwen3.Qwen3ForCausalLM"
    assert lines["attention impl"].strip() == "atom_vllm.attention.mha.ATOMAttentionImpl"
    assert "token ids: [" in run.stdout
