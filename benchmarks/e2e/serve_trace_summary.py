"""Per-step summary of a served vLLM engine core's torch-profiler trace (CPU and GPU activity).

    python serve_trace_summary.py TRACE.pt.trace.json[.gz] [--out SUMMARY.json]

The trace is what ``vllm serve --profiler-config '{"profiler": "torch", ...}'`` writes for its worker
between ``/start_profile`` and ``/stop_profile`` (``vllm bench serve --profile``). vLLM marks each
``execute_model`` on the host with ``execute_context_C(T)_generation_G(U)``; a step here runs from
one such mark to the next on that thread. Per step: the host time of the mark, the host time spent
waiting on the GPU (synchronising calls, and copies that block), the GPU time of the work launched in
the step and when it ended. Steps are grouped by kind: ``prefill`` (new prompt tokens only), ``mixed``,
``decode``, and ``after_prefill`` (the decode step launched right after a prefill: with async
scheduling the engine launches it before it hands the prefill's token out). With Python stacks in the
trace (``torch_profiler_with_stack``), each wait longer than WAIT_REPORT_MS is attributed to its
innermost Python frames, and ``prefill_to_output_ms`` is the time from a prefill step's mark to the
end of the engine's next ``update_from_output`` (at one request at a time, the engine's part of TTFT).
The profiler slows the host (Python-heavy code more): compare engines, not absolute times.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import statistics
from collections import defaultdict

STEP = re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$")
WAIT_CALLS = re.compile(r"Synchronize|^cudaMemcpy$|^cuMemcpyDtoH")
# Asynchronous copies that took this long blocked the host (pageable memory or a full queue).
BLOCKING_COPY_US = 50.0
WAIT_REPORT_MS = 0.2
LAUNCH_CALLS = re.compile(r"LaunchKernel|GraphLaunch|cuLaunch")
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
# Frames of these files say nothing about who waited.
UNINFORMATIVE_FRAMES = re.compile(r"torch/|<built-in|contextlib|threading|functools|^<")
MAX_FRAMES_BACK = 200_000


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def step_kind(ctx_tokens: int, gen_requests: int) -> str:
    if ctx_tokens and gen_requests:
        return "mixed"
    return "prefill" if ctx_tokens else "decode"


def is_wait(event: dict) -> bool:
    return bool(WAIT_CALLS.search(event["name"])) or (
        event["name"].startswith("cudaMemcpyAsync") and event.get("dur", 0) > BLOCKING_COPY_US)


def enclosing_frames(frames: list[dict], starts: list[float], event: dict, depth: int = 4) -> str:
    """The innermost informative Python frames around ``event`` (frames of its thread, by start).
    Walking back from the event, the first frame that contains it is the innermost one."""
    end = event["ts"] + event.get("dur", 0)
    names: list[str] = []
    index = bisect.bisect_right(starts, event["ts"])
    for k in range(index - 1, max(-1, index - 1 - MAX_FRAMES_BACK), -1):
        frame = frames[k]
        if frame["ts"] + frame["dur"] >= end and not UNINFORMATIVE_FRAMES.search(frame["name"]):
            names.append(frame["name"])
            if len(names) == depth:
                break
    return " < ".join(names) or "(no Python frame)"


def summarise(events: list[dict]) -> dict:
    complete = [e for e in events if e.get("ph") == "X" and "ts" in e]
    marks = sorted((e for e in complete if e.get("cat") == "user_annotation" and STEP.match(e["name"])),
                   key=lambda e: e["ts"])
    if not marks:
        return {"error": "no execute_context_* marks: not a vLLM worker trace"}
    tid = marks[0]["tid"]
    host = sorted((e for e in complete if e.get("tid") == tid and e.get("cat") in ("cuda_runtime", "cuda_driver")),
                  key=lambda e: e["ts"])
    host_starts = [e["ts"] for e in host]
    frames = sorted((e for e in complete if e.get("tid") == tid and e.get("cat") == "python_function"),
                    key=lambda e: e["ts"])
    frame_starts = [f["ts"] for f in frames]
    outputs_end = sorted(f["ts"] + f["dur"] for f in frames if f["name"].endswith(": update_from_output"))
    gpu_by_correlation: dict[int, list[dict]] = defaultdict(list)
    for e in complete:
        if e.get("cat") in GPU_CATEGORIES and "correlation" in e.get("args", {}):
            gpu_by_correlation[e["args"]["correlation"]].append(e)

    steps = []
    for i, mark in enumerate(marks):
        ctx_requests, ctx_tokens, gen_requests, gen_tokens = map(int, STEP.match(mark["name"]).groups())
        end = marks[i + 1]["ts"] if i + 1 < len(marks) else mark["ts"] + mark["dur"]
        calls = host[bisect.bisect_left(host_starts, mark["ts"]):bisect.bisect_left(host_starts, end)]
        waits = [c for c in calls if is_wait(c)]
        gpu = [g for c in calls for g in gpu_by_correlation.get(c.get("args", {}).get("correlation"), [])]
        kind = step_kind(ctx_tokens, gen_requests)
        if kind == "decode" and steps and steps[-1]["kind"] == "prefill":
            kind = "after_prefill"
        step = {
            "kind": kind, "tokens": ctx_tokens + gen_tokens, "host_mark_ms": mark["dur"] / 1e3,
            "window_ms": (end - mark["ts"]) / 1e3,
            "host_wait_ms": sum(c["dur"] for c in waits) / 1e3,
            "launches": sum(1 for c in calls if LAUNCH_CALLS.search(c["name"])),
            "gpu_busy_ms": sum(g["dur"] for g in gpu) / 1e3,
            "gpu_end_after_mark_ms": (max(g["ts"] + g["dur"] for g in gpu) - mark["ts"]) / 1e3 if gpu else None,
            "waits": [(enclosing_frames(frames, frame_starts, c), c["dur"] / 1e3) for c in waits
                      if c["dur"] / 1e3 >= WAIT_REPORT_MS],
        }
        if kind == "prefill":
            j = bisect.bisect_left(outputs_end, mark["ts"])
            step["prefill_to_output_ms"] = (outputs_end[j] - mark["ts"]) / 1e3 if j < len(outputs_end) else None
        steps.append(step)
    return {"steps": len(steps), "by_kind": by_kind(steps)}


def by_kind(steps: list[dict]) -> dict:
    report = {}
    for kind in ("prefill", "after_prefill", "mixed", "decode"):
        group = [s for s in steps if s["kind"] == kind]
        if not group:
            continue
        row: dict = {"count": len(group)}
        for key in ("tokens", "host_mark_ms", "window_ms", "host_wait_ms", "launches", "gpu_busy_ms",
                    "gpu_end_after_mark_ms", "prefill_to_output_ms"):
            values = [s[key] for s in group if s.get(key) is not None]
            if values:
                row[f"median_{key}"] = statistics.median(values)
        waits: dict[str, list[float]] = defaultdict(list)
        for s in group:
            for frames, ms in s["waits"]:
                waits[frames].append(ms)
        row["waits_per_step"] = sorted(([frames, len(ms) / len(group), sum(ms) / len(group)]
                                        for frames, ms in waits.items()), key=lambda w: -w[2])[:8]
        report[kind] = row
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    parser.add_argument("--out")
    args = parser.parse_args()
    summary = summarise(load(args.trace))
    text = json.dumps(summary, indent=1)
    if args.out:
        open(args.out, "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
