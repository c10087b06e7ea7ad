#!/usr/bin/env bash
# The SGLang GPU measurements of docs/performance.md ("SGLang on an H200"): SGLang alone against
# SGLang + ATOM on this GPU, with SGLang's defaults and dummy weights.
#   bash benchmarks/run_gpu_sglang.sh OUT_DIR [STEP ...]
# STEPs: default all, in the order of the steps= line below. Needs SGLang 0.5.17 (sglang-kernel's
# FlashAttention-3 makes fa3 its Hopper default) and the atom-kernels, atom-core and atom-sglang wheels
# installed (benchmarks/README.md, "SGLang"). Every engine runs in a process of its own (SGLang reads
# ATOM's switches once per process) under ENGINE_TIMEOUT seconds (default 600; a fresh machine's first
# SGLang start compiles its JIT kernels and DeepGEMM's, about 250-310 s for an FP8 model). Each
# step's report is rewritten after every model, so a time-limited machine keeps what finished.
set -u
out=$(mkdir -p "$1" && cd "$1" && pwd); shift
steps=${*:-"offline kv-fp8-offline gpt-oss-offline gpt-oss-tuned-offline mla-offline mla-checkpoint-offline mla-kv-fp8-offline mla-atom-attention-offline hybrid-offline profile serving gpu-tests"}
here=$(cd "$(dirname "$0")" && pwd)
export HF_HUB_OFFLINE=1 ATOM_LOG_TRITON_COMPILES=1
# sglang_run.py on each MODEL alone and with ATOM into OUT_DIR/RUNS, then bench_offline.py's REPORT
# from the runs so far. KV: both engines' kv_cache_dtype; EXTRA: more sglang_run.py arguments for both,
# ATOM_EXTRA for SGLang + ATOM only.
# RANDOM_CHECKPOINT=1: each model's weights are a random checkpoint (random_checkpoint.py), written
# before its runs and removed after them, not the engines' dummy weights.
offline_pairs() {  # RUNS REPORT KV MODEL...
  local runs=$out/$1 report=$out/$2 kv=$3 done=() model mode flag source ckpt; shift 3
  mkdir -p "$runs"
  for model in "$@"; do
    source="--config $here/models/$model.json" ckpt=
    if [ -n "${RANDOM_CHECKPOINT:-}" ]; then
      ckpt=$(mktemp -d)
      python3 "$here/e2e/random_checkpoint.py" --config "$here/models/$model.json" --out "$ckpt/$model" \
        > "$runs/checkpoint-$model.log" 2>&1 || echo "$model checkpoint rc=$?"
      source="--checkpoint $ckpt/$model"
    fi
    for mode in native atom; do
      [ $mode = native ] && flag=1 extra= || flag= extra=${ATOM_EXTRA:-}
      ATOM_DISABLE_SGLANG_PLUGIN=$flag timeout "${ENGINE_TIMEOUT:-600}" python3 "$here/e2e/sglang_run.py" \
        $source --kv-cache-dtype "$kv" ${EXTRA:-} $extra \
        --out "$runs/run-$model-$mode.json" > "$runs/run-$model-$mode.json.log" 2>&1
      echo "$model $mode rc=$? $(date +%T)"
    done
    [ -n "$ckpt" ] && rm -rf "$ckpt"
    done+=("$model")
    python3 "$here/e2e/bench_offline.py" --engine sglang --runs-dir "$runs" --kv-cache-dtype "$kv" \
      --out "$report" "${done[@]}" > "$runs/report.log" 2>&1 || tail -3 "$runs/report.log"
  done
}
for step in $steps; do
  echo "== $step $(date +%T)"
  case $step in
    # MODELS narrows the list.
    offline) offline_pairs runs offline-sglang.json auto \
               ${MODELS:-qwen3-8b llama-3.1-8b qwen3-30b-a3b qwen3-30b-a3b-fp8} ;;
    kv-fp8-offline) offline_pairs kv-fp8-runs offline-sglang-kv-fp8.json fp8_e4m3 qwen3-30b-a3b-fp8 ;;
    # On GPUs SGLang serves gpt-oss itself unless asked (atom_core.hosting.takeover.SLOWER_ON_GPU).
    gpt-oss-offline) ATOM_SERVE_WHERE_SLOWER=1 offline_pairs gpt-oss-runs offline-sglang-gpt-oss.json auto \
                       gpt-oss-20b ;;
    # gpt-oss-20b's bf16 MoE tiles tuned on this GPU (no vLLM rows in SGLang's environment), then the pair
    # on them; OUT_DIR/tuned/fused_moe.json is the table to ship (atom_kernels/tuned/README.md).
    gpt-oss-tuned-offline) python3 "$here/kernels/tune_kernels.py" --ops moe --models gpt-oss-20b \
                             --out-dir "$out/tuned" > "$out/tune-gpt-oss.log" 2>&1 || tail -3 "$out/tune-gpt-oss.log"
                           ATOM_SERVE_WHERE_SLOWER=1 ATOM_TUNED_CONFIG_DIR=$out/tuned offline_pairs gpt-oss-tuned-runs \
                             offline-sglang-gpt-oss-tuned.json auto gpt-oss-20b ;;
    # ATOM's MLA models on SGLang's MLA attention (its fa3 on Hopper); MLA_MODELS narrows the list.
    mla-offline) offline_pairs mla-runs offline-sglang-mla.json auto ${MLA_MODELS:-deepseek-v2-lite moonlight-16b-a3b} ;;
    # The same on random checkpoints: dummy weights route MoE tokens unlike a real model's.
    mla-checkpoint-offline) RANDOM_CHECKPOINT=1 offline_pairs mla-checkpoint-runs offline-sglang-mla-checkpoint.json \
                              auto ${MLA_MODELS:-deepseek-v2-lite moonlight-16b-a3b} ;;
    # An FP8 latent pool: ATOM's MLA models run on ATOM's latent attention there by default.
    mla-kv-fp8-offline) offline_pairs mla-kv-fp8-runs offline-sglang-mla-kv-fp8.json fp8_e4m3 \
                          ${MLA_MODELS:-deepseek-v2-lite} ;;
    # ATOM's latent attention with a 16-bit pool too, where ATOM's default is SGLang's fa3.
    mla-atom-attention-offline) ATOM_EXTRA="--engine-arg attention_backend=atom" offline_pairs \
                                  mla-atom-attention-runs offline-sglang-mla-atom-attention.json auto \
                                  ${MLA_MODELS:-deepseek-v2-lite} ;;
    # Qwen3-Next and Qwen3.5 (on GPUs the host serves hybrids unless asked), both engines with the state
    # cache ATOM's Gated DeltaNet layers keep (atom_sglang.config_translation.STATE_CHECKPOINTS_REASON).
    # HYBRID_MODELS narrows the list.
    hybrid-offline) ATOM_SERVE_HYBRID_ON_GPU=1 EXTRA="--engine-arg mamba_radix_cache_strategy=no_buffer
                      --engine-arg disable_overlap_schedule=true" offline_pairs hybrid-runs offline-sglang-hybrid.json \
                      auto ${HYBRID_MODELS:-qwen3-next-80b-a3b-16l qwen3.5-35b-a3b} ;;
    # Per-kernel GPU time of a prefill window and a workload pass (SGLang's scheduler profiler).
    profile) EXTRA="--profile --correctness 32,64" offline_pairs profile-runs offline-sglang-profiled.json auto \
               ${PROFILE_MODELS:-qwen3-30b-a3b-fp8} ;;
    # Output throughput, TTFT and TPOT at concurrency 1 / 16 / 64 per model of SERVING_MODELS.
    serving) for model in ${SERVING_MODELS:-qwen3-8b qwen3-30b-a3b-fp8}; do
               mkdir -p "$out/serving-$model"
               python3 "$here/e2e/bench_serving.py" --engine sglang --model "$model" --concurrencies 1,16,64 \
                 --out "$out/serving-$model/serving-sglang-$model.json"
             done ;;
    gpu-tests) python3 -m pytest -q -p no:cacheprovider "$here"/../packages/atom-sglang/tests/test_sglang_gpu_*.py \
                 > "$out/sglang-gpu-tests.log" 2>&1; tail -1 "$out/sglang-gpu-tests.log" ;;
    *) echo "unknown step $step" ;;
  esac
done
