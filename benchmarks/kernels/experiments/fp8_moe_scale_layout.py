"""The block-FP8 fused MoE reading its activation scales row-major (as ``run_fused_moe`` quantizes for
its GEMMs) against group-major (the registered quant ops' layout, ``atom_kernels.quant.new_scales``,
which the MoE read from b3c29dd until this comparison), in one process: the group-major runs swap the
MoE's two quantizers for the registered ones. The shipped tables, ``tune_kernels.MoeShape``'s inputs,
the whole op as CUDA graphs, each layout twice, alternately:

    PYTHONPATH=packages/atom-kernels/src python3 benchmarks/kernels/experiments/fp8_moe_scale_layout.py \
        [--sizes '[["qwen3-30b-a3b", [256, 4096]], ["deepseek-v3", [4096]]]']

Writes ``$OUT/fp8-moe-scale-layout.json`` (default /tmp); data: ``fp8-h200.json.gz[moe-scale-layout]``.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tune_kernels as tk  # noqa: E402  (benchmarks/kernels)

from atom_kernels import moe  # noqa: E402
from atom_kernels.tuned import lookup  # noqa: E402

ROW_MAJOR = moe.per_group_quant_fp8_row_major, moe.launch_gated_activation


def use_layout(row_major: bool) -> None:
    quantize, activation = ROW_MAJOR
    if row_major:
        moe.per_group_quant_fp8_row_major, moe.launch_gated_activation = quantize, activation
    else:
        moe.per_group_quant_fp8_row_major = moe.per_group_quant_fp8.impl("triton")
        moe.launch_gated_activation = lambda *args, row_major_scales=False, **kw: activation(*args, **kw)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default='[["qwen3-30b-a3b", [1, 16, 64, 256, 1024, 4096, 16384]], '
                                           '["deepseek-v3", [1, 64, 512, 4096, 16384]]]')
    args = parser.parse_args()
    device = torch.cuda.get_device_name()
    rows = []
    for model, sizes in json.loads(args.sizes):
        dims = tk.MOE_FP8_MODELS[model]
        experts, top_k, hidden, inter = dims
        key = moe.moe_shape_key(experts, hidden, inter, top_k, tk.FP8)
        for tokens in sizes:
            config = lookup("fused_moe", device, key, tokens)
            if config is None:
                sys.exit(f"no packaged fused_moe table for {device} and {key}: it times the shipped tiles")
            shape = tk.MoeShape(dims, tokens, tk.FP8)
            inputs, quant = (shape.x, shape.w13, shape.w2, shape.weights, shape.ids, config), shape.quant_args()

            def run():
                return moe.run_fused_moe(*inputs, **quant)

            times, outputs = {False: [], True: []}, {}
            for row_major in (False, True, False, True):
                use_layout(row_major)
                times[row_major].append(round(tk.graph_us(run), 1))
                outputs[row_major] = run().float()
            row = {"model": model, "tokens": tokens, "block_m": config.get("BLOCK_M"),
                   "plain": bool(config["gate_up"].get("PLAIN")), "group_major_us": times[False],
                   "row_major_us": times[True],
                   "max_abs_diff": (outputs[True] - outputs[False]).abs().max().item()}
            print(json.dumps(row), flush=True)
            rows.append(row)
    use_layout(True)
    out = Path(os.environ.get("OUT", "/tmp")) / "fp8-moe-scale-layout.json"
    out.write_text(json.dumps({"device": device, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
