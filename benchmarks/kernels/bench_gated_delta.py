"""GPU benchmark: ATOM's Gated DeltaNet ops at Qwen3-Next-80B-A3B's shape (TP 1) against the kernels
vLLM's Qwen3-Next runs (FLA's).

    python benchmarks/kernels/bench_gated_delta.py --out gated-delta.json [--rep 50] [--no-sweep]

Rows, bf16 activations:
- ``prefill``: ``gated_delta_rule`` over 16 x 1024 and 2 x 8192 new tokens from a state, whole op and
  its two launches (``prepare_chunks``, ``state_pass``), against vLLM's ``chunk_gated_delta_rule``;
- ``decode``: ``gated_delta_rule_decode`` at batch 1, 64 and 256 on rows of a bf16 state cache
  (``state_slots``), against vLLM's ``fused_recurrent_gated_delta_rule`` on its own cache layout;
- ``conv_prefill`` / ``conv_decode``: ``causal_conv1d`` / ``_decode`` (ours only).
With the sweep (default), the prefill rows are also timed at each launch setting of SETTINGS (the
chunked form's in atom_kernels.gated_delta, the conv prefill's in atom_kernels.short_conv; the whole op
with w and u in fp32, WU_16BIT off); the prepare rows give how far their w and u lie from the
inverse's dots in IEEE fp32, the others how far their output and states lie from the defaults'.

Times (microseconds) are ``bench_kernels.time_kernel``'s medians, the prefill rows eager (as both
engines run prefills), the decode rows CUDA-graph replays. A row whose
vLLM kernel fails records the error. Without a CUDA GPU it says so and writes nothing.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from bench_kernels import rand, time_kernel
from triton.testing import do_bench

import atom_kernels
from atom_kernels import gated_delta, short_conv

# benchmarks/models/qwen3-next-80b-a3b-16l.json, per TP rank at TP 1
KEY_HEADS, VALUE_HEADS, HEAD_DIM, CONV_KERNEL = 16, 32, 128, 4
CONV_CHANNELS = 2 * KEY_HEADS * HEAD_DIM + VALUE_HEADS * HEAD_DIM
PREFILLS = {"16x1024": [1024] * 16, "2x8192": [8192] * 2}
DECODE_BATCHES = (1, 64, 256)
# Each launch's settings, swept one launch at a time.
PREPARE_SWEEP = [{"PREPARE_WARPS": w} for w in (4, 8)] + [
    {"INVERSE_PRECISION_NVIDIA": p} for p in ("tf32x3", "ieee")] + [{"INVERSE_SUB": 16}, {"PREPARE_DOT_16BIT": False}]
STATE_SWEEP = [{"STATE_BLOCK_V": b, "STATE_WARPS": w} for b in (64, 128) for w in (4, 8)] + [
    {"STATE_STAGES": n} for n in (1, 3)] + [{"STATE_DOT_16BIT": False}]
# Options that change both launches: the whole op.
WHOLE_OP_SWEEP = [{"WU_16BIT": False}]
CONV_SWEEP = [{"PREFILL_BLOCK_T": t, "PREFILL_BLOCK_C": c, "PREFILL_WARPS": w}
              for t in (64, 128, 256) for c in (512, 1024, 2048) for w in (4, 8)] + [
    {"PREFILL_UNROLL": u} for u in (4, 16)]
SETTINGS = {gated_delta: ("PREPARE_WARPS", "STATE_BLOCK_V", "STATE_WARPS", "STATE_STAGES",
                          "INVERSE_PRECISION_NVIDIA", "INVERSE_SUB", "WU_16BIT", "STATE_DOT_16BIT",
                          "PREPARE_DOT_16BIT"),
            short_conv: ("PREFILL_BLOCK_T", "PREFILL_BLOCK_C", "PREFILL_WARPS", "PREFILL_UNROLL")}


def delta_inputs(num_tokens: int):
    q = rand(num_tokens, KEY_HEADS, HEAD_DIM)
    k = rand(num_tokens, KEY_HEADS, HEAD_DIM)
    v = rand(num_tokens, VALUE_HEADS, HEAD_DIM)
    g = F.logsigmoid(rand(num_tokens, VALUE_HEADS, dtype=torch.float32) + 3.0)
    beta = torch.sigmoid(rand(num_tokens, VALUE_HEADS))
    return q, k, v, g, beta


def cu_seqlens(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device="cuda")


def timed(fn, rep: int, eager_only: bool) -> float:
    """Median microseconds: eager (host work included, as a prefill runs), else a graph replay."""
    if eager_only:
        return do_bench(fn, warmup=10, rep=rep, return_mode="median") * 1e3
    return time_kernel(fn, rep)["graph_us"]


def vllm_ops():
    from vllm.third_party.flash_linear_attention.ops import (
        chunk_gated_delta_rule,
        fused_recurrent_gated_delta_rule,
    )
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def theirs_or_error(row: dict, make_fn, rep: int, eager_only: bool) -> None:
    """vLLM's time for the row (``make_fn()`` returns the call), or the error it stopped with."""
    try:
        row["vllm_us"] = timed(make_fn(), rep, eager_only)
        row["ratio"] = row["ours_us"] / row["vllm_us"]
    except Exception as error:  # noqa: BLE001  (a vLLM kernel that fails here is a row, not the end)
        row["vllm_error"] = f"{type(error).__name__}: {error}"[:300]


def prefill_launches(lengths: list[int]) -> dict:
    """The whole prefill op and its two launches, on one set of inputs continuing from states."""
    q, k, v, g, beta = delta_inputs(sum(lengths))
    cu = cu_seqlens(lengths)
    state = rand(len(lengths), VALUE_HEADS, HEAD_DIM, HEAD_DIM, dtype=torch.float32, scale=0.1)
    initial = torch.ones(len(lengths), dtype=torch.bool, device="cuda")
    w, u = gated_delta.prepare_chunks(k, v, g, beta, cu, True)
    return {"inputs": (q, k, v, g, beta, cu, state),
            "ours_us": lambda: atom_kernels.gated_delta_rule(q, k, v, g, beta, cu, state, initial),
            "prepare_us": lambda: gated_delta.prepare_chunks(k, v, g, beta, cu, True),
            "state_pass_us": lambda: gated_delta.state_pass(q, k, g, w, u, cu, state, initial, True, None)}


def prefill_row(name: str, lengths: list[int], rep: int) -> dict:
    launches = prefill_launches(lengths)
    q, k, v, g, beta, cu, state = launches["inputs"]
    row = {"op": "prefill", "case": name, "tokens": sum(lengths),
           **{key: timed(launches[key], rep, True) for key in ("ours_us", "prepare_us", "state_pass_us")}}
    vllm_state = state.transpose(-1, -2).to(torch.bfloat16).contiguous()  # vLLM's [N, HV, V, K]

    def theirs():
        chunk = vllm_ops()[0]
        return lambda: chunk(q[None], k[None], v[None], g[None], beta[None], initial_state=vllm_state,
                             output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)

    theirs_or_error(row, theirs, rep, True)
    return row


def decode_row(batch: int, rep: int) -> dict:
    q, k, v, g, beta = delta_inputs(batch)
    slots = torch.randperm(2 * batch + 1, device="cuda")[:batch].to(torch.int32)
    cache = rand(2 * batch + 1, VALUE_HEADS, HEAD_DIM, HEAD_DIM, scale=0.1)
    row = {"op": "decode", "case": f"batch {batch}", "tokens": batch,
           "ours_us": timed(lambda: atom_kernels.gated_delta_rule_decode(q, k, v, g, beta, cache, state_slots=slots),
                            rep, False)}
    def theirs():
        recurrent = vllm_ops()[1]
        return lambda: recurrent(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
                                 initial_state=cache, inplace_final_state=True, ssm_state_indices=slots,
                                 use_qk_l2norm_in_kernel=True)

    theirs_or_error(row, theirs, rep, False)
    return row


def conv_prefill_launch(lengths: list[int]):
    x = rand(sum(lengths), CONV_CHANNELS)
    weight = rand(CONV_CHANNELS, CONV_KERNEL, scale=0.5)
    state = rand(len(lengths), CONV_CHANNELS, CONV_KERNEL - 1)
    initial = torch.ones(len(lengths), dtype=torch.bool, device="cuda")
    cu = cu_seqlens(lengths)
    return lambda: atom_kernels.causal_conv1d(x, weight, None, cu, state, initial), state


def conv_rows(rep: int) -> list[dict]:
    rows = [{"op": "conv_prefill", "case": name, "tokens": sum(lengths),
             "ours_us": timed(conv_prefill_launch(lengths)[0], rep, True)} for name, lengths in PREFILLS.items()]
    weight = rand(CONV_CHANNELS, CONV_KERNEL, scale=0.5)
    for batch in DECODE_BATCHES:
        x = rand(batch, CONV_CHANNELS)
        cache = rand(2 * batch + 1, CONV_CHANNELS, CONV_KERNEL - 1)
        slots = torch.randperm(2 * batch + 1, device="cuda")[:batch].to(torch.int32)
        rows.append({"op": "conv_decode", "case": f"batch {batch}", "tokens": batch, "ours_us": timed(
            lambda: atom_kernels.causal_conv1d_decode(x, weight, None, cache, state_slots=slots), rep, False)})
    return rows


def outputs_from(launch, states: list[torch.Tensor], starts: list[torch.Tensor]) -> list[torch.Tensor]:
    """``launch()``'s output and the states it leaves, run from ``starts`` (timed runs move states on)."""
    for state, start in zip(states, starts):
        state.copy_(start)
    return [launch(), *(state.clone() for state in states)]


def distance(outputs: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """Largest |x - ref| over the outputs, relative to that reference's largest |ref|."""
    return max(((x.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
               for x, ref in zip(outputs, reference))


def defaults() -> dict:
    return {module: {name: getattr(module, name) for name in names} for module, names in SETTINGS.items()}


def run_with(module, settings: dict, fn):
    """``fn()`` with ``settings`` set on ``module``, every setting back at its default after."""
    saved = defaults()
    try:
        for name, value in settings.items():
            setattr(module, name, value)
        return fn()
    finally:
        for saved_module, values in saved.items():
            for name, value in values.items():
                setattr(saved_module, name, value)


def sweep_rows(rep: int) -> list[dict]:
    """Each prefill case's launches at every setting of their own, the others at their defaults."""
    rows = []
    for case, lengths in PREFILLS.items():
        launches = prefill_launches(lengths)
        launches["conv_us"], conv_state = conv_prefill_launch(lengths)
        states = {"state_pass_us": [launches["inputs"][-1]], "ours_us": [launches["inputs"][-1]],
                  "conv_us": [conv_state]}
        starts = {key: [state.clone() for state in held] for key, held in states.items()}
        at_defaults = {key: outputs_from(launches[key], states[key], starts[key]) for key in states}
        reference = run_with(gated_delta, {"INVERSE_PRECISION_NVIDIA": "ieee"}, launches["prepare_us"])
        for module, key, settings_list in ((gated_delta, "prepare_us", PREPARE_SWEEP),
                                           (gated_delta, "state_pass_us", STATE_SWEEP),
                                           (gated_delta, "ours_us", WHOLE_OP_SWEEP),
                                           (short_conv, "conv_us", CONV_SWEEP)):
            launch = launches[key]
            for settings in settings_list:
                row = {"op": "prefill_sweep", "case": case, **settings}

                def measure():
                    if key == "prepare_us":
                        row["rel_diff_vs_ieee"] = distance(launch(), reference)
                    else:
                        row["rel_diff_vs_default"] = distance(outputs_from(launch, states[key], starts[key]),
                                                              at_defaults[key])
                    row[key] = timed(launch, rep, True)

                try:
                    run_with(module, settings, measure)
                except Exception as error:  # noqa: BLE001  (a setting that does not compile is a row)
                    row["error"] = f"{type(error).__name__}: {error}"[:200]
                rows.append(row)
                print(row, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--rep", type=int, default=50)
    parser.add_argument("--no-sweep", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_gated_delta: no CUDA GPU, nothing measured")
        return
    rows = [prefill_row(name, lengths, args.rep) for name, lengths in PREFILLS.items()]
    rows += [decode_row(batch, args.rep) for batch in DECODE_BATCHES]
    rows += conv_rows(args.rep)
    for row in rows:
        print(row, flush=True)
    if not args.no_sweep:
        rows += sweep_rows(args.rep)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "defaults": {name: value for values in defaults().values() for name, value in values.items()},
              "rows": rows}
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
