#!/usr/bin/env bash
# The whole CPU test suite: kernels, core, vLLM plugin (real vLLM CPU build), SGLang plugin
# (real SGLang 0.5.17, CPU engine). GPU tests skip cleanly without a GPU.
source "$(dirname "$0")/common.sh"
sync_vllm_env
# The kernel suite runs Triton through its interpreter (TRITON_INTERPRET=1 for the whole process),
# so it gets a process of its own: the model and engine tests use the normal backend selection.
.venv/bin/pytest -q packages/atom-kernels/tests "$@"
.venv/bin/pytest -q packages/atom-core/tests packages/atom-vllm/tests "$@"
sync_sglang_env
.venv-sglang/bin/pytest -q packages/atom-sglang/tests "$@"
# HF config reading once more on the SGLang environment's older transformers (its GptOssConfig has
# no swiglu_alpha, as on common CUDA images).
.venv-sglang/bin/pytest -q packages/atom-core/tests/test_takeover.py "$@"
