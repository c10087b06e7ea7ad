"""The chunked delta rule's state pass in its dot forms at Qwen3-Next's shape (16 x 1024 and 2 x 8192
tokens from states, bf16): per form, the whole op's output and final states against the fp32 torch
reference (largest |difference| over the largest |reference|) and the eager medians (us) of the op and
its two launches. One JSON line a row; PYTHONPATH picks the tree.

    PYTHONPATH=packages/atom-kernels/src:benchmarks/kernels python benchmarks/kernels/experiments/state_pass_forms.py TAG

Data: gated-delta-h200.json.gz[2026-12-02-state-pass-forms]."""

import json
import sys

import bench_gated_delta as bench
import torch

import atom_kernels
from atom_kernels import gated_delta

FORMS = [{"STATE_DOT_16BIT": False}, {"STATE_DOT_16BIT": True}, {"STATE_DOT_16BIT": True, "STATE_WARPS": 8}]


def main() -> None:
    torch.manual_seed(0)
    for case, lengths in bench.PREFILLS.items():
        launches = bench.prefill_launches(lengths)
        q, k, v, g, beta, cu, state = launches["inputs"]
        initial = torch.ones(len(lengths), dtype=torch.bool, device="cuda")
        start, ref_state = state.clone(), state.clone()
        ref_out = gated_delta.gated_delta_rule_torch(q.float(), k.float(), v.float(), g, beta.float(), cu,
                                                     ref_state, initial)
        for form in FORMS:
            saved = {name: getattr(gated_delta, name) for name in form}
            try:
                for name, value in form.items():
                    setattr(gated_delta, name, value)
                final = start.clone()
                out = atom_kernels.gated_delta_rule(q, k, v, g, beta, cu, final, initial)
                row = {"tag": sys.argv[1], "case": case, **form, "out_err": bench.distance([out], [ref_out]),
                       "state_err": bench.distance([final], [ref_state]),
                       **{key: round(bench.timed(launches[key], 50, True), 1)
                          for key in ("ours_us", "prepare_us", "state_pass_us")}}
            finally:
                for name, value in saved.items():
                    setattr(gated_delta, name, value)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
