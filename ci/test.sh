#!/usr/bin/env bash
# The whole CPU test suite: kernels, core, vLLM plugin (real vLLM CPU build: 0.26, then the engine-level
# suites on 0.32), SGLang plugin (real SGLang CPU engine: 0.5.17, then 0.5.23). GPU tests skip cleanly
# without a GPU.
source "$(dirname "$0")/common.sh"
sync_vllm_env
# The other environments sync under the tests from here; each stage waits for its own.
sync_in_background newest_vllm_env oldest_transformers sglang_env newest_sglang_env
.venv/bin/ruff check packages benchmarks ci
# The kernel suite runs Triton through its interpreter (TRITON_INTERPRET=1 for the whole process),
# so it gets processes of its own (two workers; its conftest sets the interpreter in each): the model
# and engine tests use the normal backend selection.
.venv/bin/pytest -q -n 2 packages/atom-kernels/tests "$@"
# Two workers, each test file whole on one (its module fixtures build once).
.venv/bin/pytest -q -n 2 --dist loadfile packages/atom-core/tests packages/atom-vllm/tests "$@"
# The engine-level vLLM suites again on the newest supported vLLM with a CPU build (0.32).
wait_for_sync newest_vllm_env
run_vllm_engine_suites "$NEWEST_VLLM_ENV" "$@"
# HF config reading again on the oldest transformers vLLM accepts.
wait_for_sync oldest_transformers
PYTHONPATH="$OLDEST_TRANSFORMERS" .venv/bin/pytest -q -p no:cacheprovider packages/atom-core/tests/test_takeover.py "$@"
wait_for_sync sglang_env
.venv-sglang/bin/pytest -q packages/atom-sglang/tests "$@"
# And on the SGLang environment's transformers (5.12: no GptOssConfig.swiglu_alpha either).
.venv-sglang/bin/pytest -q packages/atom-core/tests/test_takeover.py "$@"
# The SGLang suites again on the newest supported SGLang (0.5.23).
wait_for_sync newest_sglang_env
"$NEWEST_SGLANG_ENV/bin/pytest" -q -p no:cacheprovider packages/atom-sglang/tests "$@"
