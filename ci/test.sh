#!/usr/bin/env bash
# The whole CPU test suite: kernels, core, vLLM plugin (real vLLM CPU build), SGLang plugin
# (real SGLang 0.5.17, CPU engine). GPU tests skip cleanly without a GPU.
source "$(dirname "$0")/common.sh"
sync_vllm_env
.venv/bin/pytest -q packages/atom-kernels/tests packages/atom-core/tests packages/atom-vllm/tests "$@"
if [ -d packages/atom-sglang/tests ]; then
    sync_sglang_env
    SGLANG_USE_CPU_ENGINE=1 .venv-sglang/bin/pytest -q packages/atom-sglang/tests "$@"
fi
