"""Host time per call of ATOM's norm / activation / rope / quantization ops, four ways, on a CUDA GPU:

    python benchmarks/kernels/bench_op_launch.py --out launch.json [--rows 1,1024]

- eager: ``atom_kernels.<op>(...)`` (registry dispatch, the Python wrapper, Triton's launcher);
- opaque: inside a torch.compile'd function, the opaque custom op ``torch.ops.atom.<op>``
  (ATOM_INDUCTOR_OPS=none; the default before 2026-11-29): the dispatcher's call into Python, then eager;
- inductor: inside a torch.compile'd function with ATOM_INDUCTOR_OPS=<op> (its torch implementation
  traced: Inductor's own kernels);
- triton: the same with ATOM_INDUCTOR_OPS=<op>:triton (its Triton implementation traced: Inductor
  allocates the outputs and launches ATOM's kernel itself; the default on GPUs).

This is what a step outside CUDA graphs (a long prefill) pays per op on the host. Each compiled
function calls the op CALLS times (on distinct inputs), so Dynamo's per-call guard and graph entry
are spread over them; the GPU work at one row is far below the host time, so the loop measures the
host. Inputs as in the GPU test of the traced path (atom-kernels' test_kernels_traced_by_compile.py).
Results: benchmarks/results/traced-ops-h200-qwen3-8b-fp8.json (op_launch_host_us).
"""

import argparse
import json
import sys
from pathlib import Path

import torch

import atom_kernels
from atom_kernels.registry import set_inductor_ops

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "packages" / "atom-kernels" / "tests"))
from bench_kernels import host_us  # noqa: E402
from test_kernels_traced_by_compile import CASES  # noqa: E402

CALLS = 16
MODES = ("eager", "opaque", "inductor", "triton")
REPEATS = 50


def host_us_per_call(fn, inputs) -> float:
    """bench_kernels' host time of one call of ``fn`` (after a first, compiling one), per op call."""
    fn(inputs)
    return host_us(lambda: fn(inputs), REPEATS) / CALLS


def measure(name: str, rows: int) -> dict[str, float]:
    _, make_inputs, call = CASES[name]
    op = getattr(atom_kernels, name)
    # Distinct inputs per call: identical calls of a functional op would be merged in the graph.
    inputs = [make_inputs(rows) for _ in range(CALLS)]

    def calls(inputs):
        return [call(one, op) for one in inputs]

    result = {"eager": host_us_per_call(calls, inputs)}
    for mode, traced in (("opaque", "none"), ("inductor", name), ("triton", f"{name}:triton")):
        torch._dynamo.reset()
        set_inductor_ops(traced)
        try:
            result[mode] = host_us_per_call(torch.compile(calls, fullgraph=True, dynamic=True), inputs)
        finally:
            set_inductor_ops()
    torch._dynamo.reset()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", default="1,1024")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_op_launch needs a CUDA GPU")
    results = {"device": torch.cuda.get_device_name(), "calls_per_graph": CALLS, "host_us_per_call": {}}
    print(f"{'op':32} {'rows':>5}" + "".join(f"{mode + ' us':>12}" for mode in MODES))
    with torch.inference_mode():
        for name in sorted(CASES):
            for rows in map(int, args.rows.split(",")):
                times = measure(name, rows)
                results["host_us_per_call"][f"{name}@{rows}"] = times
                print(f"{name:32} {rows:5}" + "".join(f"{times[mode]:12.1f}" for mode in MODES))
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
