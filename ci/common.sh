# Shared by ci/demo.sh and ci/test.sh: make sure uv exists, then sync the vLLM (CPU) environment.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# uv: already on PATH, else pip-installed (a user install where the system Python is read-only), else
# Astral's standalone installer; the last two can put it in ~/.local/bin, off PATH.
export PATH="$PATH:$HOME/.local/bin"
if ! command -v uv >/dev/null 2>&1; then
    python3 -m pip install --quiet uv 2>/dev/null \
        || python3 -m pip install --quiet --user --break-system-packages uv 2>/dev/null \
        || curl -LsSf https://astral.sh/uv/install.sh | sh
    hash -r
fi
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
# Bytecode is cached even where the environment turns it off (PYTHONDONTWRITEBYTECODE, and uv installs
# no .pyc): every engine the tests start is a fresh interpreter, which would otherwise compile the
# ~8,600 modules of torch, vLLM and transformers again (18 of the 36 s a tiny model's vLLM start takes
# on a 2-core machine). Kept outside the environments and the source tree.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$PWD/.cache/pycache}"
sync_vllm_env() {
    uv sync --frozen --package atom-vllm --extra cpu --group dev
}
# Syncs in the background, so that a fresh machine's downloads and installs overlap the tests. Each
# writes its own directory (uv's cache takes concurrent use); its output goes to a log, shown when it
# is waited for, and a failed sync fails the wait.
declare -A SYNC_PIDS
sync_in_background() {  # NAME... (sync_NAME)
    mkdir -p .cache/sync-logs
    local name
    for name in "$@"; do
        "sync_$name" >".cache/sync-logs/$name.log" 2>&1 &
        SYNC_PIDS[$name]=$!
    done
}
wait_for_sync() {  # NAME
    local status=0
    wait "${SYNC_PIDS[$1]}" || status=$?
    cat ".cache/sync-logs/$1.log"
    [ "$status" -eq 0 ] || echo "sync_$1 failed (exit $status)" >&2
    return "$status"
}
# The newest vLLM atom-vllm supports that has a CPU build, from its own lock (torch 2.13, which the
# workspace lock's vLLM 0.26 cannot share): ci/hosts/vllm-0.32.
NEWEST_VLLM_ENV=ci/hosts/vllm-0.32/.venv
sync_newest_vllm_env() {
    (cd ci/hosts/vllm-0.32 && uv sync --frozen)
}
# The suites that run real vLLM engines (and the plugin's guards) on it. Not these: the VLM tests (no
# torchvision there), the OpenAI-server soak and the wheel install (slow; host-independent).
NEWEST_VLLM_SUITES=(test_plugin_guards.py test_vllm_parity.py test_families_vllm.py test_mla_backend.py
    test_mla_vllm_parity.py test_qwen3_next_vllm.py test_takeover_vllm.py test_kv_cache_fp8_vllm.py
    test_fp8_vllm.py test_mxfp4_vllm.py test_openai_server.py test_attention_warmup.py test_vllm_compile.py
    test_speculative_vllm.py test_quark_mxfp4_vllm.py)
# Cells of those suites left to the 0.26 stage: each takes a host path that a sibling cell run on 0.32
# takes too (the dense compile cell, the tensor-parallel cells, Qwen3 / Qwen3-MoE full attention in
# test_vllm_parity, DeepSeek-V3's MLA, block FP8 on Qwen3 and DeepSeek-V3, two handed-back cells, the
# published bf16 dense and MoE configs and the second Qwen3.5: one config path, which the quantized
# and hybrid configs take too, at about 20 s a config on 0.32), or checks vLLM alone rather than
# ATOM. Keeps CI well inside its 90 minutes.
NEWEST_VLLM_REPEATED_CELLS=(
    "test_families_vllm.py::test_gpt_oss_tensor_parallel_2[tp+ep]"
    "test_families_vllm.py::test_atom_matches_hf_with_chunked_prefill_and_prefix_cache[Glm4MoeForCausalLM]"
    "test_families_vllm.py::test_atom_matches_hf_with_chunked_prefill_and_prefix_cache[LlamaForCausalLM]"
    "test_families_vllm.py::test_native_vllm_matches_hf"
    "test_vllm_compile.py::test_piecewise_compile_in_vllm[Qwen3MoeForCausalLM]"
    "test_mla_vllm_parity.py::test_atom_mla_matches_hf_with_prefix_cache[DeepseekV2ForCausalLM]"
    "test_mla_vllm_parity.py::test_atom_mla_with_forced_chunked_prefill[DeepseekV2ForCausalLM]"
    "test_takeover_vllm.py::test_handed_back_cells_end_as_vllm_alone[dynamic rope]"
    "test_takeover_vllm.py::test_handed_back_cells_end_as_vllm_alone[Quark FP8]"
    "test_takeover_vllm.py::test_published_configs_decided_from_vllm_config[qwen3-8b]"
    "test_takeover_vllm.py::test_published_configs_decided_from_vllm_config[qwen3-30b-a3b]"
    "test_takeover_vllm.py::test_published_configs_decided_from_vllm_config[llama-3.1-8b-instruct]"
    "test_takeover_vllm.py::test_published_configs_decided_from_vllm_config[mixtral-8x7b-instruct-v0.1]"
    "test_takeover_vllm.py::test_published_configs_decided_from_vllm_config[deepseek-v2-lite]"
    "test_takeover_vllm.py::test_published_configs_decided_from_vllm_config[llama-3.1-70b]"
    "test_takeover_vllm.py::test_published_configs_decided_from_vllm_config[mixtral-8x22b-v0.1]"
    "test_takeover_vllm.py::test_published_configs_decided_from_vllm_config[qwen3-coder-480b-a35b-instruct]"
    "test_takeover_vllm.py::test_published_configs_decided_from_vllm_config[qwen3.5-27b]"
    "test_fp8_vllm.py::test_fp8_checkpoint_served_by_atom[Qwen3-MoE, block FP8]"
    "test_mla_vllm_parity.py::test_atom_mla_tensor_parallel_2_with_expert_parallel"
    "test_fp8_vllm.py::test_block_fp8_mla_tensor_parallel_2_with_expert_parallel"
    "test_quark_mxfp4_vllm.py::test_tensor_parallel_2_with_expert_parallel"
    "test_mxfp4_vllm.py::test_gpt_oss_mxfp4_served_by_atom[tp2-padded]")
# The engine-level vLLM suites in ENV (a host environment other than .venv), as CI runs them on the
# newest vLLM. vLLM from 0.27 refuses a max_model_len past a config's max_position_embeddings unless
# told; 0.26 allowed the tiny models' 256-token contexts.
run_vllm_engine_suites() {  # ENV [PYTEST ARGS...]
    local env=$1; shift
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 "$env/bin/pytest" -q -n 2 --dist loadfile -p no:cacheprovider \
        "${NEWEST_VLLM_SUITES[@]/#/packages/atom-vllm/tests/}" \
        "${NEWEST_VLLM_REPEATED_CELLS[@]/#/--deselect=packages/atom-vllm/tests/}" "$@"
}
sync_sglang_env() {
    UV_PROJECT_ENVIRONMENT=.venv-sglang uv sync --frozen --package atom-sglang --group dev
}
# The newest SGLang atom-sglang supports, from its own lock (torch 2.14, which the workspace lock's
# SGLang 0.5.17 cannot share): ci/hosts/sglang-0.5.23. Its engine-level suites run there whole.
NEWEST_SGLANG_ENV=ci/hosts/sglang-0.5.23/.venv
sync_newest_sglang_env() {
    (cd ci/hosts/sglang-0.5.23 && uv sync --frozen)
}
# The oldest transformers vLLM 0.26.0 accepts (with the hub and tokenizers it needs), beside the
# lock's: ATOM must read published HF configs on it as well. Put first on PYTHONPATH over .venv.
OLDEST_TRANSFORMERS=.venv-transformers-5.5.3
sync_oldest_transformers() {
    [ -d "$OLDEST_TRANSFORMERS/transformers" ] || uv pip install -q --target "$OLDEST_TRANSFORMERS" \
        --no-deps --python .venv/bin/python transformers==5.5.3 "huggingface-hub>=1.5,<2" \
        "tokenizers>=0.22,<=0.23.0"
}
