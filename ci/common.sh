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
# pytest-xdist runs the vLLM suite on both cores (its engine starts are single-threaded Python). It is
# installed beside the lock, pinned: adding it to the lock re-resolves the workspace, which today
# fails for Python 3.14 (no SGLang 0.5.17 wheels there).
sync_vllm_env() {
    uv sync --frozen --package atom-vllm --extra cpu --group dev
    uv pip install -q --python .venv/bin/python pytest-xdist==3.8.0 execnet==2.1.2
}
sync_sglang_env() {
    UV_PROJECT_ENVIRONMENT=.venv-sglang uv sync --frozen --package atom-sglang --group dev
}
# The oldest transformers vLLM 0.26.0 accepts (with the hub and tokenizers it needs), beside the
# lock's: ATOM must read published HF configs on it as well. Put first on PYTHONPATH over .venv.
OLDEST_TRANSFORMERS=.venv-transformers-5.5.3
sync_oldest_transformers() {
    [ -d "$OLDEST_TRANSFORMERS/transformers" ] || uv pip install -q --target "$OLDEST_TRANSFORMERS" \
        --no-deps --python .venv/bin/python transformers==5.5.3 "huggingface-hub>=1.5,<2" \
        "tokenizers>=0.22,<=0.23.0"
}
