"""vLLM+ATOM with default compilation and CUDA graphs against vLLM+ATOM with ``enforce_eager=True``.

    python benchmarks/e2e/compile_vs_eager.py --out compile-vs-eager.json [MODEL]

One engine each, in fresh processes on the same GPU (benchmarks/models/MODEL.json, default
qwen3-8b, bf16 dummy weights): greedy tokens of 32 prompts x 16 tokens (agreement recorded) and
the decode-step time at batch 32 (speedup recorded).
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_offline import MODELS, agreement, run_engine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default="qwen3-8b")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torch
    import vllm

    config = os.path.join(MODELS, f"{args.model}.json")
    workdir = os.path.dirname(os.path.abspath(args.out))
    common = ["--correctness", "32,16", "--throughput", "", "--decode-step", "32,128"]
    runs = {}
    for mode in ("compiled", "eager"):
        extra = common + (["--eager"] if mode == "eager" else [])
        runs[mode] = run_engine(config, True, os.path.join(workdir, f"run-{args.model}-{mode}.json"), extra)
        print(mode, {k: runs[mode].get(k) for k in ("decode_step", "error", "engine_start_s")}, flush=True)
    report = {"device": torch.cuda.get_device_name(), "vllm": vllm.__version__, "torch": torch.__version__,
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "model": args.model, "runs": runs}
    if all("error" not in r for r in runs.values()):
        report["agreement"] = agreement(runs["eager"], runs["compiled"])
        report["decode_step_speedup"] = (runs["eager"]["decode_step"]["ms_per_decode_step"]
                                         / runs["compiled"]["decode_step"]["ms_per_decode_step"])
        for run in runs.values():
            run.pop("correctness")  # the agreement above summarises the tokens
    json.dump(report, open(args.out, "w"), indent=1)
    print(json.dumps({k: report.get(k) for k in ("agreement", "decode_step_speedup")}), flush=True)


if __name__ == "__main__":
    main()
