"""Native vLLM (or SGLang) vs the same engine with ATOM, same GPU, same run: offline throughput and
correctness.

    python benchmarks/e2e/bench_offline.py --out results.json [--engine sglang] [--kv-cache-dtype fp8] \
        qwen3-8b qwen3-30b-a3b

For each model shape (benchmarks/models/NAME.json, dummy weights in the checkpoint's format: bf16, or
its quantization_config's, e.g. block FP8): one native engine (ATOM_DISABLE_VLLM_PLUGIN=1, or
ATOM_DISABLE_SGLANG_PLUGIN=1) and one ATOM engine, each in a fresh process (engine_run.py for vLLM,
sglang_run.py for SGLang), with the engine's defaults (vLLM: torch.compile + CUDA graphs; SGLang: CUDA
graphs, radix cache, chunked prefill); each runs the correctness probe (64 prompts x 128 greedy tokens,
first-step top-20 logprobs) and the throughput workload (256 prompts x 1024 in / 128 out). Writes one
JSON with both runs (each with the weights' memory: vLLM's "Model loading took X GiB" log line, SGLang's
scheduler's own figure), agreement numbers and ratio = ATOM / native, and a markdown table naming the
engine, its version and which classes and attention served each run.
"""

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

import process_group

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "models")
# vLLM 0.26 logs the weights' memory once loaded: "Model loading took %s GiB memory and %.6f seconds"
# (v1/worker/gpu_model_runner.py) or "Model loading took %s GiB and %.6f seconds" (model runner v2).
WEIGHTS_GIB = re.compile(r"Model loading took ([0-9.]+) GiB")
# vLLM 0.26's choice of linear and MoE kernels for quantized layers: "Selected %s for %s"
# (model_executor/kernels/linear) and "Using %s Fp8 MoE backend ..." (fused_moe/oracle/fp8.py).
KERNEL_CHOICE = re.compile(r"Selected \w+ for \w+|Using \w+ Fp8 MoE backend")
BACKEND_REPORT = re.compile(r"atom kernels: (.*?)$")


@dataclass(frozen=True)
class Engine:
    """A host engine: its name in the report, the script that runs one engine (next to this one), the
    switch that turns ATOM off for the native run, and the package whose version the report names."""

    name: str
    script: str
    disable_switch: str
    package: str


ENGINES = {
    "vllm": Engine("vLLM", "engine_run.py", "ATOM_DISABLE_VLLM_PLUGIN", "vllm"),
    "sglang": Engine("SGLang", "sglang_run.py", "ATOM_DISABLE_SGLANG_PLUGIN", "sglang"),
}


def run_engine(config: str, atom: bool, out: str, extra: list[str], engine: str = "vllm") -> dict:
    switch = ENGINES[engine].disable_switch
    env = {**os.environ}
    if atom:
        env.pop(switch, None)
    else:
        env[switch] = "1"
    cmd = [sys.executable, os.path.join(HERE, ENGINES[engine].script), "--config", config, "--out", out, *extra]
    log_path = out + ".log"
    with open(log_path, "w") as log:
        status = process_group.run(cmd, float(os.environ.get("ATOM_BENCH_ENGINE_TIMEOUT", "900")), env=env,
                                   stdout=log, stderr=subprocess.STDOUT)
    error = "timeout" if status is None else f"exit {status}" if status else None
    return read_run(out, error)


def atom_log_lines(lines: list[str], limit: int) -> list[str]:
    """ATOM's own log lines of a run, at most ``limit``: without the plugin's "Register model" lines
    (every architecture ATOM registers, the same in every run) and without a CUDA-graph progress bar
    printed on the same line, the home directory (ATOM's compile cache) written as ~, and the startup
    backend report naming only the ops not on the default triton backend."""
    home = os.path.expanduser("~")
    kept = []
    for line in lines:
        if "INFO atom:" not in line or "Register model" in line:
            continue
        if "Capturing CUDA graphs" in line:
            line = line[line.index("INFO atom:"):]
        kept.append(short_backend_report(line.replace(home, "~")))
    return kept[:limit]


def short_backend_report(line: str) -> str:
    """The startup line "atom kernels: op=backend, ...[; traced by torch.compile: ...]" with the ops on
    triton left out of its first part."""
    report = BACKEND_REPORT.search(line)
    if not report:
        return line
    backends, _, traced = report.group(1).partition("; ")
    others = [item for item in backends.split(", ") if not item.endswith("=triton")]
    return line[:report.start(1)] + (", ".join(others) + " (others: triton)" if others else "all triton") + \
        (f"; {traced}" if traced else "") + line[report.end(1):]


def read_run(out: str, error: str | None = None) -> dict:
    """One engine run's result (``out``, written by engine_run.py or sglang_run.py) with what its log
    (``out`` + ".log") says: weights memory (vLLM), ATOM's lines, vLLM's kernel choices."""
    log_text = open(out + ".log").read()
    loaded = WEIGHTS_GIB.search(log_text)
    weights_gib = float(loaded.group(1)) if loaded else None
    if error or not os.path.exists(out):
        return {"error": error or "no result", "weights_gib": weights_gib, "log_tail": log_text[-4000:]}
    result = json.load(open(out))
    # sglang_run.py records the weights' memory itself (SGLang logs it only at log level info).
    result.setdefault("weights_gib", weights_gib)
    lines = log_text.splitlines(keepends=True)
    result["atom_log_lines"] = atom_log_lines(lines, 40)
    scales = result.get("served_by", {}).get("kv_cache_scales")
    # Nothing to record where the cache is 16-bit (the scales go unused; vLLM's dummy loader fills them
    # with its random values) or every layer has the default.
    if scales and (result.get("kv_cache_dtype", "auto") == "auto"
                   or all(pair == [1.0, 1.0] for pair in scales.values())):
        del result["served_by"]["kv_cache_scales"]
    result["vllm_kernel_lines"] = [line for line in lines if KERNEL_CHOICE.search(line)][:20]
    return result


def weights_label(config: dict) -> str:
    """The dummy weights' format: bf16, or the checkpoint's quantization ("block-FP8 128x128")."""
    quant = config.get("quantization_config")
    if not quant:
        return "bf16"
    if quant.get("quant_method") == "fp8" and quant.get("weight_block_size"):
        return "block-FP8 " + "x".join(map(str, quant["weight_block_size"]))
    return quant.get("quant_method", "quantized")


def token_agreement(native: list[list[int]], atom: list[list[int]]) -> dict:
    """How far two engines' greedy tokens agree, prompt by prompt (bench_serving.py's probe too)."""
    prefixes = [next((n for n, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                for a, b in zip(native, atom, strict=True)]
    return {"prompts": len(prefixes), "tokens_per_prompt": len(native[0]),
            "identical_sequences": sum(a == b for a, b in zip(native, atom)),
            "first_token_agreement": sum(p > 0 for p in prefixes),
            "mean_common_prefix": sum(prefixes) / len(prefixes)}


def agreement(native: dict, atom: dict) -> dict:
    a, b = native["correctness"], atom["correctness"]
    diffs = []
    for x, y in zip(a["first_logprobs"], b["first_logprobs"]):
        common = set(x) & set(y)
        diffs.extend(abs(x[t] - y[t]) for t in common)
    return {
        **token_agreement(a["tokens"], b["tokens"]),
        "first_step_top20_logprob_max_abs_diff": max(diffs) if diffs else None,
        "first_step_top20_logprob_mean_abs_diff": sum(diffs) / len(diffs) if diffs else None,
    }


def gib(run: dict) -> str:
    return f"{run['weights_gib']:.2f}" if run.get("weights_gib") is not None else "?"


def workload_line(report: dict) -> str:
    """The throughput workload as the runs recorded it."""
    runs = [run for entry in report["models"].values() for run in (entry["native"], entry["atom"])
            if "throughput" in run]
    if not runs:
        return "No throughput run"
    workload = runs[0]["throughput"]
    engine_args = ", ".join(f"{k}={v}" for k, v in runs[0].get("engine_args", {}).items())
    return (f"{workload['prompts']} prompts x {workload['input_len']} random input tokens, "
            f"{workload['output_len']} greedy output tokens"
            + (f", engine arguments {engine_args}" if engine_args else ""))


def served_by_lines(report: dict) -> list[str]:
    """Per run, which classes and attention served it (the engine script's ``served_by``)."""
    lines = []
    for name, entry in report["models"].items():
        for mode in ("native", "atom"):
            served = entry[mode].get("served_by") or {}
            lines.append(f"- {name}, {mode}: " + ", ".join(f"{k} `{v}`" for k, v in served.items() if v))
    return lines


def weights_cell(entry: dict) -> str:
    """"bf16 dummy", "block-FP8 128x128 checkpoint", "bf16 checkpoint, run in float32", ... (runs made
    before engines recorded where their weights came from: dummy; their dtype: bfloat16)."""
    run = entry["native"]
    cell = f"{entry['weights']} {run.get('weights_from', 'dummy')}"
    return cell if run.get("dtype", "bfloat16") == "bfloat16" else f"{cell}, run in {run['dtype']}"


def logprob_cell(diff: float | None) -> str:
    """The largest first-step logprob difference; none where no prompt's top 20 shared a token."""
    return "no common top-20 token" if diff is None else f"{diff:.1e}"


def markdown(report: dict) -> str:
    engine = report["engine"]
    lines = [f"# Offline throughput on {report['device']} ({ENGINES[engine].name} {report[engine]}, "
             f"torch {report['torch']})", "",
             f"{workload_line(report)}, KV cache dtype {report['kv_cache_dtype']}; weights: dummy (vLLM's "
             "load_format=dummy) or a random checkpoint on disk (random_checkpoint.py, random_mxfp4_checkpoint.py).",
             "",
             "| model | weights | weights GiB native / ATOM | native out tok/s | ATOM out tok/s | ATOM / native | "
             "identical sequences | first-step logprob max diff |", "|---|---|---|---|---|---|---|---|"]
    for name, entry in report["models"].items():
        memory = f"{gib(entry['native'])} / {gib(entry['atom'])}"
        if "agreement" not in entry:
            lines.append(f"| {name} | {weights_cell(entry)} | {memory} | failed | | | | |")
            continue
        agreement = entry["agreement"]
        if "ratio" in entry:  # a run with --throughput= (agreement only) has none
            speed = (f"{entry['native']['throughput']['output_tok_s']:.0f} | "
                     f"{entry['atom']['throughput']['output_tok_s']:.0f} | {entry['ratio']['output_tok_s']:.2f}")
        else:
            speed = "— | — | —"
        lines.append(
            f"| {name} | {weights_cell(entry)} | {memory} | {speed} | "
            f"{agreement['identical_sequences']}/{agreement['prompts']} x {agreement['tokens_per_prompt']} tokens | "
            f"{logprob_cell(agreement['first_step_top20_logprob_max_abs_diff'])} |")
    lines += ["", "Served by:", "", *served_by_lines(report)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="+", help="NAME (models/NAME.json) or the path of a config.json")
    parser.add_argument("--out", required=True)
    parser.add_argument("--engine", choices=sorted(ENGINES), default="vllm")
    parser.add_argument("--extra", default="", help="extra arguments of engine_run.py or sglang_run.py")
    parser.add_argument("--kv-cache-dtype", default="auto",
                        help="kv_cache_dtype of both engines (vLLM: fp8, ...; SGLang: fp8_e4m3, ...)")
    parser.add_argument("--runs-dir", default=None,
                        help="assemble the report from engine runs already made (run-NAME-{native,atom}.json "
                             "and .log in this folder, e.g. one engine per call on a time-limited machine)")
    args = parser.parse_args()
    import torch

    version = importlib.import_module(ENGINES[args.engine].package).__version__
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else os.environ.get("ATOM_BENCH_DEVICE", "?")
    if torch.cuda.device_count() > 1:
        device = f"{torch.cuda.device_count()} x {device}"
    report = {"device": device, "engine": args.engine, args.engine: version, "torch": torch.__version__,
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "kv_cache_dtype": args.kv_cache_dtype, "models": {}}
    workdir = os.path.dirname(os.path.abspath(args.out))
    extra = ["--kv-cache-dtype", args.kv_cache_dtype, *args.extra.split()]
    for model in args.models:
        config = model if model.endswith(".json") else os.path.join(MODELS, f"{model}.json")
        name = os.path.splitext(os.path.basename(config))[0]
        runs = {}
        for mode in ("native", "atom"):
            if args.runs_dir:
                runs[mode] = read_run(os.path.join(args.runs_dir, f"run-{name}-{mode}.json"))
            else:
                runs[mode] = run_engine(config, mode == "atom", os.path.join(workdir, f"run-{name}-{mode}.json"),
                                        extra, args.engine)
            print(name, mode, {k: v for k, v in runs[mode].items() if k in ("throughput", "weights_gib", "error")},
                  flush=True)
        entry = {"weights": weights_label(json.load(open(config))), "native": runs["native"], "atom": runs["atom"]}
        if "error" not in runs["native"] and "error" not in runs["atom"]:
            entry["agreement"] = agreement(runs["native"], runs["atom"])
            if "throughput" in runs["native"]:
                entry["ratio"] = {k: runs["atom"]["throughput"][k] / runs["native"]["throughput"][k]
                                  for k in ("output_tok_s", "total_tok_s")}
            for run in runs.values():
                run.pop("correctness")  # the agreement above summarises the tokens
        report["models"][name] = entry
        json.dump(report, open(args.out, "w"), indent=1)
        open(os.path.splitext(args.out)[0] + ".md", "w").write(markdown(report))
        print(name, json.dumps({k: entry.get(k) for k in ("ratio", "agreement")}), flush=True)


if __name__ == "__main__":
    main()
