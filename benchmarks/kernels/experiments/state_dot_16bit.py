"""The delta rule's state pass with 16-bit dot operands (``gated_delta.STATE_DOT_16BIT``) at Qwen3-Next's
shape, a process per setting (one hit an illegal memory access once: that ends the CUDA context).

    python state_dot_16bit.py OUT.json

Per setting and case: the state pass's eager median (us), the whole op's output and final states
against the fp32 torch reference (largest |difference| / largest |reference|), or the child's end;
then the BLOCK_V 32 setting under compute-sanitizer's memcheck."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_gated_delta import HEAD_DIM, PREFILLS, VALUE_HEADS, cu_seqlens, delta_inputs, distance, rand, run_with, timed  # noqa: E402

import atom_kernels  # noqa: E402
from atom_kernels import gated_delta  # noqa: E402

SETTINGS = [{}] + [{"STATE_DOT_16BIT": True, **extra} for extra in (
    {}, {"STATE_WARPS": 2}, {"STATE_WARPS": 8}, {"STATE_STAGES": 2}, {"STATE_STAGES": 2, "STATE_WARPS": 2},
    {"STATE_BLOCK_V": 128, "STATE_WARPS": 8}, {"STATE_BLOCK_V": 32, "STATE_WARPS": 2}, {"STATE_BLOCK_V": 32})]
SANITIZED = {"STATE_DOT_16BIT": True, "STATE_BLOCK_V": 32}


def write_inputs(path: str) -> None:
    torch.manual_seed(0)
    cases = {}
    for case, lengths in PREFILLS.items():
        q, k, v, g, beta = delta_inputs(sum(lengths))
        state = rand(len(lengths), VALUE_HEADS, HEAD_DIM, HEAD_DIM, dtype=torch.float32, scale=0.1)
        initial = torch.ones(len(lengths), dtype=torch.bool, device="cuda")
        final = state.clone()
        out = gated_delta.gated_delta_rule_torch(q.float(), k.float(), v.float(), g, beta.float(),
                                                 cu_seqlens(lengths), final, initial)
        cases[case] = {"inputs": (q, k, v, g, beta, state, initial), "reference": (out, final)}
    torch.save(cases, path)


def measure(path: str, settings: dict) -> list[dict]:
    rows = []
    for case, data in torch.load(path).items():
        q, k, v, g, beta, start, initial = data["inputs"]
        cu = cu_seqlens(PREFILLS[case])
        row = {"case": case, **settings}

        def run():
            state = start.clone()
            out = atom_kernels.gated_delta_rule(q, k, v, g, beta, cu, state, initial)
            row["out_rel_diff"] = distance([out], [data["reference"][0]])
            row["state_rel_diff"] = distance([state], [data["reference"][1]])
            w, u = gated_delta.prepare_chunks(k, v, g, beta, cu, True)
            row["state_pass_us"] = timed(
                lambda: gated_delta.state_pass(q, k, g, w, u, cu, state, initial, True, None), 50, True)

        run_with(gated_delta, settings, run)
        rows.append(row)
    return rows


def child(command: list[str], settings: dict, inputs: str) -> list[dict]:
    done = subprocess.run([*command, sys.executable, __file__, "--child", json.dumps(settings), inputs],
                          capture_output=True, text=True)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not rows:
        rows.append({**settings, "returncode": done.returncode, "tail": (done.stdout + done.stderr)[-3000:]})
    return rows


def main() -> None:
    if sys.argv[1] == "--child":
        for row in measure(sys.argv[3], json.loads(sys.argv[2])):
            print(json.dumps(row), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        write_inputs(f"{tmp}/inputs.pt")
        rows = [row for settings in SETTINGS for row in child([], settings, f"{tmp}/inputs.pt")]
        rows += [{"memcheck": True, **row} for row in child(
            ["compute-sanitizer", "--tool", "memcheck"], SANITIZED, f"{tmp}/inputs.pt")]
    Path(sys.argv[1]).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    for row in rows:
        print({key: value for key, value in row.items() if key != "tail"})


if __name__ == "__main__":
    main()
