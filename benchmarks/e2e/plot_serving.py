"""PNG of a bench_serving.py result: output throughput and mean TPOT against concurrency, native vs ATOM.

    python benchmarks/e2e/plot_serving.py benchmarks/results/serving-h200-qwen3-8b.json

Needs matplotlib (not a dependency of any ATOM package: `uv run --no-project --with matplotlib ...`).
Writes the PNG next to the JSON.
"""

import json
import os
import sys


def main(path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.load(open(path))
    engine = report.get("engine", "vllm")
    host = {"vllm": "vLLM", "sglang": "SGLang"}[engine]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, style in (("native", "o-"), ("atom", "s-")):
        results = report[mode].get("results", {})
        points = [(c, results[str(c)]) for c in report["concurrencies"]
                  if "output_throughput" in results.get(str(c), {})]
        label = f"{host} alone" if mode == "native" else f"{host} + ATOM"
        left.plot([c for c, _ in points], [r["output_throughput"] for _, r in points], style, label=label)
        right.plot([c for c, _ in points], [r["mean_tpot_ms"] for _, r in points], style, label=label)
    for axis, title, unit in ((left, "Output throughput", "tokens/s"), (right, "Mean time per output token", "ms")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrency (requests in flight)")
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(f"{report['model']} shape, {report['device']}, {host} {report[engine]}: "
                    "random 1024 in / 128 out, dummy bf16 weights")
    figure.tight_layout()
    out = os.path.splitext(path)[0] + ".png"
    figure.savefig(out, dpi=80)
    from PIL import Image  # matplotlib's own dependency

    Image.open(out).convert("RGB").quantize(colors=32).save(out, optimize=True)  # a quarter of the bytes
    print(out)


if __name__ == "__main__":
    main(sys.argv[1])
