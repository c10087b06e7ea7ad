"""GPU time per kernel and per op class, from a torch profile: shared by profile_steps.py (vLLM, the
profile in this process) and sglang_run.py (SGLang, a Chrome trace its scheduler wrote), so that both
engines' windows are summarised alike."""

import gzip
import json
import re

# First match wins: kernel name -> op class.
OP_CLASSES = [
    ("moe", r"moe|expert|topk|grouped_gemm|_fused_experts"),
    ("kv_cache", r"reshape_and_cache|concat_and_cache"),
    ("linear_attention", r"gated_delta|delta_rule|chunk_|solve_tril|inverse|recompute_w_u|conv1d|gdn|l2norm"),
    ("attention", r"flash|fmha|attention|attn|paged|merge_splits|mla"),
    ("gemm", r"gemm|nvjet|xmma|cutlass|cublas|sm90_|wgmma|matmul"),
    ("norm", r"rms|norm"),
    ("rope", r"rotary|rope"),
    ("activation", r"silu|gelu|act_and_mul|swiglu|gated_activation"),
    ("sampling", r"sample|softmax|argmax|sort|log_softmax|gumbel|topp|penalt"),
    ("inductor_fused", r"^triton_"),
    ("copy_elementwise", r"copy|elementwise|fill|cat|index|gather|scatter|memcpy|memset|reduce"),
]


def op_class(name: str) -> str:
    lowered = name.lower()
    for label, pattern in OP_CLASSES:
        if re.search(pattern, lowered):
            return label
    return "other"


def kernel_times(prof) -> tuple[dict[str, float], int]:
    """Microseconds of GPU time per kernel name in a finished profile, and the number of kernels run."""
    from torch.autograd import DeviceType

    times: dict[str, float] = {}
    launches = 0
    for event in prof.events():
        if event.device_type == DeviceType.CUDA:
            times[event.name] = times.get(event.name, 0.0) + event.device_time
            launches += 1
    return times, launches


def trace_kernel_times(path: str) -> tuple[dict[str, float], int]:
    """As :func:`kernel_times`, from a gzipped Chrome trace torch.profiler exported (kernels, device
    copies and fills)."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    times: dict[str, float] = {}
    launches = 0
    for event in events:
        if event.get("ph") == "X" and event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            times[event["name"]] = times.get(event["name"], 0.0) + event["dur"]
            launches += 1
    return times, launches


def summarise(times: dict[str, float], launches: int, wall_s: float, steps: int, per: str = "step") -> dict:
    """The window's wall and GPU time, GPU work per op class and the 30 costliest kernels, each divided by
    ``steps`` (keys ``*_per_step``); a host whose steps this cannot count passes 1 and ``per="window"``."""
    classes: dict[str, float] = {}
    for name, us in times.items():
        classes[op_class(name)] = classes.get(op_class(name), 0.0) + us
    busy = sum(times.values())
    per_step = max(steps, 1)
    top = sorted(times.items(), key=lambda kv: -kv[1])[:30]
    return {
        "steps": steps,
        f"wall_ms_per_{per}": 1e3 * wall_s / per_step,
        f"gpu_busy_ms_per_{per}": busy / 1e3 / per_step,
        # GPU work (kernels and copies) per step, CUDA-graph replays included: with wall time against
        # GPU-busy time, what a host-bound step spends its host time on.
        f"gpu_ops_per_{per}": launches / per_step,
        f"classes_ms_per_{per}": {k: v / 1e3 / per_step for k, v in sorted(classes.items(), key=lambda kv: -kv[1])},
        f"top_kernels_ms_per_{per}": [[name[:160], op_class(name), us / 1e3 / per_step] for name, us in top],
    }
