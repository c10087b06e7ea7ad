#!/usr/bin/env bash
# Every GPU measurement of docs/performance.md, native vLLM against vLLM + ATOM on this GPU.
#   bash benchmarks/run_gpu.sh OUT_DIR [STEP ...]
# STEPs: default all, in the order of the steps= line below;
# on 4 GPUs: mla-tp4-checkpoint-offline flagship-serving (not in the default list; flagship-serving
# runs at FLAGSHIP_TP GPUs, 4 by default).
# tune writes new tile tables under OUT_DIR/tuned (copy them to packages/atom-kernels/src/atom_kernels/tuned).
# Needs vLLM 0.26.0 and the three ATOM wheels installed; kernel-tests also needs pytest-xdist.
# Each step writes its JSON/logs under OUT_DIR; steps are independent, so a time-limited machine can
# run them one call at a time.
set -u
out=$(mkdir -p "$1" && cd "$1" && pwd); shift
steps=${*:-"kernel-tests offline serving profile compile mla kernels op-launch sweep tune fp8-offline fp8-kv-offline fp8-serving fp8-serving-opaque-ops mxfp4-offline mxfp4-120b-offline mxfp4-serving mxfp4-checkpoint-serving fp8-gemm fp8-fusion fp8-swap-ab mla-offline mla-profile mla-checkpoint-offline mla-v3-checkpoint-offline mla-v3-checkpoint-profile mla-lone-prefill-profile fp8-lone-prefill-profile fp8-lone-prefill-inductor-ops mla-serving serving-ttft hybrid-offline hybrid-checkpoint-offline hybrid-checkpoint-profile qwen3.5-checkpoint-offline hybrid-checkpoint-fp32 hybrid-bf16-noise gated-delta vllm-gpu-tests"}
here=$(cd "$(dirname "$0")" && pwd)
# Per-kernel profiles of native vLLM and vLLM + ATOM: of NAME, loaded as SOURCE (--config FILE: dummy
# weights; --checkpoint DIR), and of each named model shape. PROFILE_MODES=atom: vLLM + ATOM only;
# PROFILE_TIMEOUT: seconds per engine run.
profile_source() {  # NAME SOURCE...
  local name=$1 mode flag; shift
  for mode in ${PROFILE_MODES:-native atom}; do
    [ $mode = native ] && flag=1 || flag=
    ATOM_DISABLE_VLLM_PLUGIN=$flag VLLM_ENABLE_V1_MULTIPROCESSING=0 timeout ${PROFILE_TIMEOUT:-0} \
      python3 "$here/e2e/profile_steps.py" \
      --workload-prompts 256 "$@" --out "$out/profile-$name-$mode.json"
  done
}
profile() {
  for model in "$@"; do profile_source $model --config "$here/models/$model.json"; done
}
# Both engines on a random checkpoint of MODEL on disk (WRITER: random_mxfp4_checkpoint.py for MXFP4,
# random_checkpoint.py for bf16: formats or weights that vLLM's dummy loader gets wrong), each run into
# OUT_DIR/RUNS, then bench_offline.py's REPORT from those runs; the checkpoint is deleted after.
# EXTRA: more engine_run.py arguments for both engines (split on spaces), then ENGINE_EXTRA's (e.g.
# '--timed-passes 3'). CHECKPOINT_LAYERS=N writes the model's first N layers only (random_checkpoint.py --layers).
# engine_run.py on CHECKPOINT alone and with ATOM, into PREFIX-{native,atom}.json (+ .log), ARGS for both.
engine_runs() {  # CHECKPOINT PREFIX ARGS...
  local checkpoint=$1 prefix=$2 mode flag; shift 2
  for mode in native atom; do
    [ $mode = native ] && flag=1 || flag=
    ATOM_DISABLE_VLLM_PLUGIN=$flag python3 "$here/e2e/engine_run.py" --checkpoint "$checkpoint" \
      --out "$prefix-$mode.json" "$@" > "$prefix-$mode.json.log" 2>&1
  done
}
# Several GPUs of one host: NVLink multicast stays off (it can take a shared host's GPUs out of service),
# and vLLM's fused all-reduce uses TensorRT-LLM's kernel (FlashInfer's default, mnnvl, needs multicast).
multi_gpu() {  # COMMAND...
  NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
    VLLM_FLASHINFER_ALLREDUCE_BACKEND=trtllm "$@"
}
# ATOM's default traced ops (atom_kernels.registry) as ATOM_INDUCTOR_OPS entries for their torch
# implementations (by default ATOM traces their Triton ones on GPUs).
default_traced_ops() {
  python3 -c "from atom_kernels.registry import DEFAULT_TRACED_OPS as o; print(','.join(o))"
}
TP4_EP_ARGS="--engine-arg tensor_parallel_size=4 --engine-arg enable_expert_parallel=true"
checkpoint_offline() {  # WRITER MODEL RUNS REPORT [EXTRA]
  local writer=$1 model=$2 runs=$out/$3 report=$out/$4 extra="${5:-} ${ENGINE_EXTRA:-}" tmp
  tmp=$(mktemp -d)
  python3 "$here/e2e/$writer" --config "$here/models/$model.json" --out "$tmp/$model" \
    ${CHECKPOINT_LAYERS:+--layers $CHECKPOINT_LAYERS}
  mkdir -p "$runs"
  engine_runs "$tmp/$model" "$runs/run-$model" $extra
  python3 "$here/e2e/bench_offline.py" --runs-dir "$runs" --out "$report" "$model"
  rm -rf "$tmp"
}
for step in $steps; do
  echo "== $step $(date +%T)"
  case $step in
    kernel-tests) python3 -m pytest "$here/../packages/atom-kernels/tests" -q -p no:cacheprovider -n 8 \
                    > "$out/kernel-tests-gpu.log" 2>&1; tail -1 "$out/kernel-tests-gpu.log" ;;
    offline) python3 "$here/e2e/bench_offline.py" --out "$out/offline.json" qwen3-8b qwen3-30b-a3b ;;
    mla-offline) python3 "$here/e2e/bench_offline.py" --out "$out/offline-mla.json" \
                   deepseek-v2-lite moonlight-16b-a3b deepseek-v3-7l ;;
    serving) python3 "$here/e2e/bench_serving.py" --out "$out/serving-qwen3-8b.json" --concurrencies 1,16,64,128 ;;
    profile) profile qwen3-8b qwen3-30b-a3b ;;
    mla-profile) profile deepseek-v2-lite deepseek-v3-7l ;;
    compile) python3 "$here/e2e/compile_vs_eager.py" --out "$out/compile-vs-eager-qwen3-8b.json" ;;
    mla) python3 "$here/mla/bench_mla_decode.py" --out "$out/mla-decode.json" ;;
    kernels) python3 "$here/kernels/bench_kernels.py" --out "$out/kernels.json" ;;
    op-launch) python3 "$here/kernels/bench_op_launch.py" --out "$out/op-launch.json" --rows 1 ;;
    sweep) python3 "$here/kernels/sweep_tokens.py" --out "$out/sweep-tokens.json" ;;
    # TUNE_OPS / TUNE_MODELS / TUNE_TOKENS (tune_kernels.py's --ops / --models / --tokens) narrow a run to
    # fit a lease: on one H100 --ops moe_fp8 took 2.5 minutes with its comparisons, --ops moe --models
    # qwen3-30b-a3b 1.2.
    tune) python3 "$here/kernels/tune_kernels.py" --out-dir "$out/tuned" ${TUNE_OPS:+--ops "$TUNE_OPS"} \
            ${TUNE_MODELS:+--models "$TUNE_MODELS"} ${TUNE_TOKENS:+--tokens "$TUNE_TOKENS"} ;;
    fp8-offline) python3 "$here/e2e/bench_offline.py" --out "$out/offline-fp8.json" qwen3-8b-fp8 qwen3-30b-a3b-fp8 ;;
    # Low-concurrency serving is where the split-K FP8 GEMMs of decode sizes show (06ddc6f).
    fp8-serving) python3 "$here/e2e/bench_serving.py" --out "$out/serving-qwen3-8b-fp8.json" --model qwen3-8b-fp8 \
                   --concurrencies 1,16,64 ;;
    # The ATOM server alone with its norm / rope / activation / quant ops called opaquely (traced as
    # Triton by default since 2026-11-29), to set beside an fp8-serving run on the same machine.
    fp8-serving-opaque-ops) mkdir -p "$out/serving-opaque-ops"
                            ATOM_INDUCTOR_OPS=none python3 "$here/e2e/bench_serving.py" \
                              --out "$out/serving-opaque-ops/serving-qwen3-8b-fp8.json" --model qwen3-8b-fp8 \
                              --concurrencies 1,16,64 --modes atom ;;
    # The last run keeps the FP8 cache on ATOM's kernels (on Hopper vLLM's FlashAttention-3 serves it).
    fp8-kv-offline) python3 "$here/e2e/bench_offline.py" --kv-cache-dtype fp8 --out "$out/offline-fp8-kv.json" \
                      qwen3-8b-fp8 qwen3-30b-a3b-fp8
                    ATOM_VLLM_FP8_KV_ATTENTION=atom python3 "$here/e2e/engine_run.py" --kv-cache-dtype fp8 \
                      --config "$here/models/qwen3-8b-fp8.json" --out "$out/run-qwen3-8b-fp8-atom-kernels.json" \
                      > "$out/run-qwen3-8b-fp8-atom-kernels.json.log" 2>&1 ;;
    # ATOM serves MXFP4 checkpoints only when asked (atom_core.envs.serve_mxfp4).
    mxfp4-offline) ATOM_SERVE_MXFP4=1 checkpoint_offline random_mxfp4_checkpoint.py gpt-oss-20b-mxfp4 mxfp4-runs \
                     offline-mxfp4.json ;;
    # Dummy MXFP4 weights: vLLM's MXFP4 method and ATOM's both allocate the packed experts as zeros
    # (vLLM's dummy loader skips integer parameters), so both engines run the same weights.
    mxfp4-120b-offline) ATOM_SERVE_MXFP4=1 python3 "$here/e2e/bench_offline.py" --out "$out/offline-mxfp4-120b.json" \
                          gpt-oss-120b-mxfp4 ;;
    # MXFP4_SERVING_MODELS narrows the sweep (a lease fits about one model). Dummy weights have every
    # scale code 0, which keeps ATOM's MXFP4 GEMMs off register decoding (atom_kernels.moe.mx_register_decode).
    mxfp4-serving) for model in ${MXFP4_SERVING_MODELS:-gpt-oss-20b-mxfp4 gpt-oss-120b-mxfp4}; do
                     mkdir -p "$out/serving-$model"; ATOM_SERVE_MXFP4=1 python3 "$here/e2e/bench_serving.py" --out "$out/serving-$model/serving-$model.json" \
                       --model $model --concurrencies 1,16,64
                   done ;;
    # The same sweep on a random gpt-oss-20b MXFP4 checkpoint, whose scale codes let ATOM's GEMMs decode
    # in registers; twice, the second reported (d45091a's single sweep: vLLM alone stalled at 16).
    mxfp4-checkpoint-serving) tmp=$(mktemp -d)
                              python3 "$here/e2e/random_mxfp4_checkpoint.py" --config "$here/models/gpt-oss-20b-mxfp4.json" \
                                --out "$tmp/gpt-oss-20b-mxfp4"
                              mkdir -p "$out/serving-mxfp4-checkpoint"
                              ATOM_SERVE_MXFP4=1 python3 "$here/e2e/bench_serving.py" --model gpt-oss-20b-mxfp4 \
                                --checkpoint "$tmp/gpt-oss-20b-mxfp4" --concurrencies 1,16,64 --sweeps 2 \
                                --out "$out/serving-mxfp4-checkpoint/serving-gpt-oss-20b-mxfp4.json"
                              rm -rf "$tmp" ;;
    # As mla-offline, on N(0, 0.02) weights: dummy weights route a MoE onto a few experts, differently in
    # each engine.
    # MLA_CHECKPOINT_MODELS picks the shapes (each checkpoint is about 31 GB on disk, one at a time).
    mla-checkpoint-offline) for model in ${MLA_CHECKPOINT_MODELS:-deepseek-v2-lite moonlight-16b-a3b}; do
                              checkpoint_offline random_checkpoint.py $model $model-ckpt-runs \
                                offline-mla-checkpoint-$model.json
                            done ;;
    # DeepSeek-V3's width on N(0, 0.02) weights: its first 5 layers (3 dense, 2 MoE; 53 GB on disk)
    # are what fits the machine's disk.
    mla-v3-checkpoint-offline) CHECKPOINT_LAYERS=5 checkpoint_offline random_checkpoint.py deepseek-v3-7l \
                                 v3-ckpt-runs offline-mla-checkpoint-deepseek-v3-5l.json ;;
    mla-v3-checkpoint-profile) tmp=$(mktemp -d)
                               python3 "$here/e2e/random_checkpoint.py" --config "$here/models/deepseek-v3-7l.json" \
                                 --layers 5 --out "$tmp/ckpt"
                               profile_source deepseek-v3-5l-checkpoint --checkpoint "$tmp/ckpt"
                               rm -rf "$tmp" ;;
    # What TTFT at one request measures: one 1024-token prefill alone in its step (and decode at batch
    # 1), on the random checkpoint mla-serving serves; wall time against GPU time per step.
    mla-lone-prefill-profile) tmp=$(mktemp -d)
                              python3 "$here/e2e/random_checkpoint.py" --config "$here/models/deepseek-v2-lite.json" \
                                --out "$tmp/ckpt"
                              profile_source deepseek-v2-lite-lone-prefill --checkpoint "$tmp/ckpt" \
                                --prefill-prompts 1 --decode-batch 1 --decode-steps 64 --workload-prompts 0
                              rm -rf "$tmp" ;;
    # The same for Qwen3-8B-FP8 (dummy weights; TTFT at one request 17 ms longer with ATOM), host ops
    # too. vLLM alone's DeepGEMM warm-up (4.2 min on an H200) skipped: the warm-up passes compile theirs.
    fp8-lone-prefill-profile) VLLM_DEEP_GEMM_WARMUP=skip \
                              profile_source qwen3-8b-fp8-lone-prefill --config "$here/models/qwen3-8b-fp8.json" \
                                --prefill-prompts 1 --decode-batch 1 --decode-steps 64 --workload-prompts 0 \
                                --host-ops --engine-arg max_num_batched_tokens=2048 ;;
    # The same, vLLM + ATOM only, with ATOM's norm / rope / activation / quantization ops called opaquely
    # (ATOM_INDUCTOR_OPS=none), then with their torch implementations traced (Inductor's kernels).
    fp8-lone-prefill-inductor-ops) for variant in opaque inductor-ops; do
                                     [ $variant = opaque ] && traced=none || traced=$(default_traced_ops)
                                     PROFILE_MODES=atom PROFILE_TIMEOUT=600 ATOM_INDUCTOR_OPS=$traced \
                                       profile_source qwen3-8b-fp8-lone-prefill-$variant \
                                       --config "$here/models/qwen3-8b-fp8.json" --prefill-prompts 1 --decode-batch 1 \
                                       --decode-steps 64 --workload-prompts 0 --host-ops \
                                       --engine-arg max_num_batched_tokens=2048
                                   done ;;
    mla-serving) python3 "$here/e2e/bench_serving.py" --out "$out/serving-deepseek-v2-lite.json" \
                   --model deepseek-v2-lite --random-weights --concurrencies 1,16,64 ;;
    # MLA serving latency (issue 19), on one random V2-Lite checkpoint: greedy tokens of prompts served
    # fresh, then again from the prefix cache (the short-extend path), native and ATOM; the serving
    # sweep with the engines' per-request TTFT parts; a 1008-token prefix shared by each burst's requests
    # (prefix-cache hits) at 1 and 16; one request at a time under the worker's profiler.
    serving-ttft) tmp=$(mktemp -d)
                  python3 "$here/e2e/random_checkpoint.py" --config "$here/models/deepseek-v2-lite.json" --out "$tmp/ckpt"
                  engine_runs "$tmp/ckpt" "$out/prefix-hits" --correctness '' --throughput '' --prefix-hits 16,1024,32
                  v2_lite() { python3 "$here/e2e/bench_serving.py" --model deepseek-v2-lite --checkpoint "$tmp/ckpt" "$@"; }
                  v2_lite --out "$out/ttft-sweep/serving-deepseek-v2-lite.json" --concurrencies 1,16,64
                  v2_lite --out "$out/ttft-shared-prefix/serving-deepseek-v2-lite.json" --concurrencies 1,16 \
                    --prefix-len 1008 --input-len 16
                  v2_lite --out "$out/ttft-profiled/serving-deepseek-v2-lite.json" --concurrencies 1 --output-len 16 \
                    --profile
                  rm -rf "$tmp" ;;
    # ATOM serves hybrid linear-attention models on GPUs only when asked (atom_core.envs.serve_hybrid_on_gpu).
    # vLLM 0.26 alone picks FlashInfer's SM90 Gated DeltaNet prefill, whose CuTe-DSL kernel is missing
    # from some installs ("SM90 GDN prefill DSL kernel is unavailable"): both engines get vLLM's Triton
    # (FLA) prefill, which ATOM's model does not use.
    hybrid-offline) ATOM_SERVE_HYBRID_ON_GPU=1 python3 "$here/e2e/bench_offline.py" --out "$out/offline-hybrid.json" \
                      --extra '--engine-arg additional_config={"gdn_prefill_backend":"triton"}' qwen3-next-80b-a3b-16l ;;
    # As hybrid-offline, on N(0, 0.02) weights both engines load (54 GB on disk while it runs).
    hybrid-checkpoint-offline) ATOM_SERVE_HYBRID_ON_GPU=1 checkpoint_offline random_checkpoint.py qwen3-next-80b-a3b-16l \
                                 hybrid-ckpt-runs offline-hybrid-checkpoint.json \
                                 '--engine-arg additional_config={"gdn_prefill_backend":"triton"}' ;;
    # Both engines' per-step profiles (profile_steps.py) on that checkpoint.
    hybrid-checkpoint-profile) tmp=$(mktemp -d)
                               python3 "$here/e2e/random_checkpoint.py" --config "$here/models/qwen3-next-80b-a3b-16l.json" \
                                 --out "$tmp/ckpt"
                               ATOM_SERVE_HYBRID_ON_GPU=1 profile_source qwen3-next-80b-a3b-16l-checkpoint --checkpoint "$tmp/ckpt" \
                                 --engine-arg 'additional_config={"gdn_prefill_backend":"triton"}'
                               rm -rf "$tmp" ;;
    # Qwen3.5-35B-A3B's language model (the VLM checkpoint, vision tower included), its first 20 layers (5 of
    # them full attention; 35 GB on disk), served text-only (vLLM's language_model_only: no vision tower).
    qwen3.5-checkpoint-offline) ATOM_SERVE_HYBRID_ON_GPU=1 CHECKPOINT_LAYERS=20 checkpoint_offline random_checkpoint.py \
                                  qwen3.5-35b-a3b qwen3.5-ckpt-runs offline-hybrid-checkpoint-qwen3.5-35b-a3b-20l.json \
                                  '--engine-arg additional_config={"gdn_prefill_backend":"triton"} --engine-arg language_model_only=true' ;;
    # Agreement only, in fp32 (100 GB of weights), eager: in bf16 this checkpoint's near-tied logits differ
    # by bf16's rounding alone (docs/performance.md, "Qwen3-Next on an H200"). vLLM alone does not run
    # Qwen3-Next in fp32 (its FLA chunk kernel asserts bf16), so ATOM's first-step logprobs go against
    # HF's model in fp32 on the same GPU.
    hybrid-checkpoint-fp32) tmp=$(mktemp -d); mkdir -p "$out/hybrid-fp32-runs"
                            python3 "$here/e2e/random_checkpoint.py" --config "$here/models/qwen3-next-80b-a3b-16l.json" \
                              --out "$tmp/ckpt"
                            run=$out/hybrid-fp32-runs/run-qwen3-next-80b-a3b-16l-atom.json
                            ATOM_SERVE_HYBRID_ON_GPU=1 python3 "$here/e2e/engine_run.py" --checkpoint "$tmp/ckpt" \
                              --out "$run" --dtype float32 --eager --throughput= \
                              --engine-arg 'additional_config={"gdn_prefill_backend":"triton"}' > "$run.log" 2>&1
                            (cd "$here/e2e" && python3 hf_first_logprobs.py --checkpoint "$tmp/ckpt" --runs "$run" \
                              --dtype float32 --out "$out/hybrid-fp32-vs-hf.json")
                            rm -rf "$tmp" ;;
    # The bf16 floor for reading those agreement numbers: HF's model in fp32 against bf16 on the GPU,
    # at all 512 experts (the CPU machine holds 48 in fp32).
    hybrid-bf16-noise) tmp=$(mktemp -d)
                       python3 "$here/e2e/random_checkpoint.py" --config "$here/models/qwen3-next-80b-a3b-16l.json" \
                         --out "$tmp/ckpt"
                       (cd "$here/e2e" && python3 bf16_noise.py --checkpoint "$tmp/ckpt" --prompts 64 \
                         --out "$out/bf16-noise-qwen3-next-80b-a3b-16l.json")
                       rm -rf "$tmp" ;;
    gated-delta) python3 "$here/kernels/bench_gated_delta.py" --out "$out/gated-delta.json" ;;
    # MLA at TP 4 with expert parallelism (issue 19; a 4-GPU machine): each of MLA_TP4_MODELS (NAME, or
    # NAME:LAYERS for its first LAYERS layers) on a random checkpoint, both engines with
    # --tensor-parallel-size FLAGSHIP_TP --enable-expert-parallel (ATOM splits every expert across the 4 ranks
    # instead: atom_core.hosting.takeover). Random weights route over all experts, as EP needs to be fair.
    mla-tp4-checkpoint-offline) for spec in ${MLA_TP4_MODELS:-deepseek-v2-lite moonlight-16b-a3b deepseek-v3-7l:5}; do
                                  model=${spec%%:*} layers=${spec#*:}; [ "$layers" = "$spec" ] && layers=
                                  CHECKPOINT_LAYERS=$layers multi_gpu checkpoint_offline random_checkpoint.py $model \
                                    tp4-$model-runs offline-mla-tp4-$model${layers:+-${layers}l}.json "$TP4_EP_ARGS"
                                done ;;
    # The flagship configuration (issue 22) at reduced depth on FLAGSHIP_TP GPUs (4 by default):
    # DeepSeek-V3's width at 8 layers on a random block-FP8 checkpoint (random_checkpoint.py: dummy
    # weights collapse routing, and both engines must load the same bytes for the greedy agreement of 32
    # fixed prompts), `vllm serve --tensor-parallel-size FLAGSHIP_TP --enable-expert-parallel
    # --kv-cache-dtype fp8` with FULL_AND_PIECEWISE CUDA graphs; random 8000 in / 1000 out at concurrency 64, FLAGSHIP_PROMPTS requests (the issue's 640 by
    # default). vLLM's own DeepGEMM warm-up stays on (its default): skipping it had vLLM alone's server
    # not up after 420 s on 4 H200s (b355b2b), compiling during graph capture. Each server gets 20 minutes.
    # vLLM alone stays off the FlashInfer kernels that it compiles from source on first use where the
    # install ships none prebuilt (this GPU image): with EP it picks FlashInfer's CUTLASS FP8 MoE (not up
    # after 900 s at 627ee3d), so FLAGSHIP_NATIVE_MOE_BACKEND names its MoE backend (triton by default;
    # recorded in the report); and its block-FP8 linears' FlashInfer DeepGEMM path, whose TP workers
    # race on one JIT cache entry during CUDA-graph capture and crash (d113dee, 4 H200s), is turned off
    # (VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER=0: next in vLLM's kernel order is its own DeepGEMM, which its
    # warm-up compiles at start; not yet run on a GPU).
    # Neither changes ATOM's server, which serves these layers with its own kernels.
    flagship-serving) tp=${FLAGSHIP_TP:-4}; ATOM_BENCH_SERVER_TIMEOUT=${ATOM_BENCH_SERVER_TIMEOUT:-1200} \
                        VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER=${VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER:-0} \
                          multi_gpu python3 "$here/e2e/bench_serving.py" \
                            --out "$out/flagship-tp$tp/serving-deepseek-v3-8l-fp8-tp$tp-ep.json" --model deepseek-v3-8l-fp8 \
                            --random-weights --greedy-prompts 32 \
                            --native-server-arg=--moe-backend=${FLAGSHIP_NATIVE_MOE_BACKEND:-triton} \
                            --concurrencies 64 --input-len 8000 --output-len 1000 --num-prompts "${FLAGSHIP_PROMPTS:-640}" \
                            --server-arg=--tensor-parallel-size=$tp --server-arg=--enable-expert-parallel \
                            --server-arg=--kv-cache-dtype=fp8 \
                            --server-arg=--compilation-config='{"cudagraph_mode":"FULL_AND_PIECEWISE"}' ;;
    # atom-vllm's GPU-only tests (no ATOM kernel compiling while serving; FA3 MLA against ATOM's kernels).
    vllm-gpu-tests) python3 -m pytest "$here/../packages/atom-vllm/tests/test_gpu_no_jit_while_serving.py" \
                      "$here/../packages/atom-vllm/tests/test_mla_fa3_gpu.py" -q -p no:cacheprovider \
                      > "$out/vllm-gpu-tests.log" 2>&1; tail -1 "$out/vllm-gpu-tests.log" ;;
    fp8-gemm) python3 "$here/kernels/bench_fp8_gemm.py" --out "$out/fp8-gemm.json" ;;
    # Also at Qwen3-30B-A3B's widths, whose 2048-wide norms pack two rows a program.
    fp8-fusion) python3 "$here/kernels/bench_fp8_fusion.py" --out "$out/fp8-fusion.json"
                python3 "$here/kernels/bench_fp8_fusion.py" --hidden 2048 --intermediate 768 --rows 1,16,64,256 \
                  --out "$out/fp8-fusion-2048.json"
                # DeepSeek-V3's width: no power of two, so the fused norm's last groups are masked.
                python3 "$here/kernels/bench_fp8_fusion.py" --hidden 7168 --intermediate 2048 --rows 1,16,64,256,4096 \
                  --out "$out/fp8-fusion-7168.json" ;;
    # The block-FP8 GEMM with swapped operands / TMA weight loads at 1-64 rows (kernel only, 1536 timings:
    # about 5 min on an H200).
    fp8-swap-ab) python3 "$here/kernels/experiments/fp8_swap_ab.py" "$out/fp8-swap-ab.json" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
