#!/usr/bin/env bash
# The main job: vLLM + ATOM on a tiny Qwen3 built in code, printing tokens and the active ATOM parts.
source "$(dirname "$0")/common.sh"
sync_vllm_env
.venv/bin/python -m atom_vllm.demo "$@"
