"""One SGLang offline engine (``sglang.Engine``) in this process: engine_run.py's workload and result
keys, for SGLang.

Run in a fresh process per configuration (SGLang loads plugins and reads ATOM_* switches once per process):
    python sglang_run.py (--config CONFIG.json | --checkpoint DIR) --out RESULT.json [--eager]
        [--correctness N,L] [--throughput N,IN,OUT] [--kv-cache-dtype auto|fp8_e4m3|...] [--dtype float32]
        [--engine-arg KEY=VALUE ...] [--profile]
ATOM_DISABLE_SGLANG_PLUGIN=1 runs SGLang without ATOM (native). Otherwise SGLang's defaults: CUDA
graphs (``--eager``: disable_cuda_graph), radix cache, chunked prefill, its default attention backend
(as ATOM's plugin picks it: atom_sglang.patches). ``--engine-arg`` passes any further
``sglang.Engine`` argument, its value read as JSON where it parses (``mem_fraction_static=0.8``,
``disable_radix_cache=true``) and as a string otherwise (``device=cpu``).

The same random prompts as engine_run.py (offline_workload.py). No tokenizer: the engine takes and
returns token ids (``skip_tokenizer_init``); SGLang still loads a vision-language model's processor,
so a ``--config`` with a ``vision_config`` gets the tiny test processor (text prompts only). Dummy
weights as SGLang's dummy loader draws them: from one seed per parameter, so they depend only on its
size and dtype, and native and ATOM see the same.

``served_by`` (atom_sglang.served_by): SGLang builds the model in its scheduler process, which this
process cannot reach; ATOM's log lines from there say which model class served, so this script keeps a
copy of its stderr, which the scheduler inherits. ``weights_gib``: the scheduler's own figure (the
device memory loading the weights took; on CPU, a difference of free system memory, meaningless).

With ATOM_LOG_TRITON_COMPILES=1 every process of the engine logs its Triton compiles
(atom_core.testing.jit_monitor; SGLang's scheduler is spawned, which runs this module's top level again)
and the result lists, under ``compiled_while_serving``, the kernels (ATOM's or SGLang's) compiled after
the engine was ready: the kernels whose compiling a first timed pass pays for.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

from kernel_summary import summarise, trace_kernel_times
from offline_workload import (
    add_workload_arguments,
    correctness_prompts,
    measure_throughput,
    model_dir,
    random_prompts,
    run_header,
    vocab_size,
    write_result,
)

from atom_core.testing.jit_monitor import JIT_LINE
from atom_core.testing.tiny_vision_language import write_tokenizer_and_processor
from atom_sglang import envs
from atom_sglang.served_by import describe_served_model

LOG_COMPILES = os.environ.get("ATOM_LOG_TRITON_COMPILES") == "1"
if LOG_COMPILES:
    from atom_core.testing.jit_monitor import log_triton_compiles

    log_triton_compiles()

TOP_LOGPROBS = 20
# The profiled windows (profile_windows): prompts of the prefill window, and a seed apart from the
# measured passes' (offline_workload), so that no window's prompt hits the radix cache.
PREFILL_PROMPTS = 16
PROFILE_SEED = 500


def copy_stderr() -> str:
    """From now on, what this process and the processes it starts write to stderr also goes to a file,
    whose path is returned. ``tee`` does the copying rather than a thread here, so that a traceback
    written as this process dies still reaches both."""
    fd, path = tempfile.mkstemp(prefix="sglang-run-", suffix=".log")
    os.close(fd)
    sys.stderr.flush()
    tee = subprocess.Popen(["tee", path], stdin=subprocess.PIPE, stdout=sys.stderr.fileno())
    os.dup2(tee.stdin.fileno(), sys.stderr.fileno())
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    add_workload_arguments(parser)
    parser.add_argument("--profile", action="store_true",
                        help="then per-kernel GPU time of a prefill window and of the workload (profile_windows)")
    args = parser.parse_args()
    log_path = copy_stderr()

    import sglang

    path, load_format, config = model_dir(args)
    if load_format == "dummy" and "vision_config" in config:
        write_tokenizer_and_processor(path, config["architectures"][0])
    vocab = vocab_size(config)
    start = time.perf_counter()
    engine = sglang.Engine(**{
        "model_path": path, "load_format": load_format, "skip_tokenizer_init": True, "dtype": args.dtype,
        "context_length": args.max_model_len, "disable_cuda_graph": args.eager, "random_seed": 0,
        "kv_cache_dtype": args.kv_cache_dtype, **dict(args.engine_arg)})
    engine_start_s = time.perf_counter() - start
    ready_at = os.path.getsize(log_path)
    try:
        measured = measure(engine, args, vocab)
        if args.profile:
            measured["profile"] = profile_windows(engine, args, vocab)
        scheduler = engine.get_server_info()["internal_states"][0]
    except BaseException:
        traceback.print_exc()  # before SGLang's shutdown, which stops every child process (tee too)
        raise
    finally:
        engine.shutdown()
    # The scheduler wrote ATOM's lines while it built the model, long before: tee has copied them.
    with open(log_path, "rb") as log:
        logged = log.read()
    os.unlink(log_path)
    text = logged.decode(errors="replace")
    result = run_header(args, "sglang", envs.plugin_disabled(), engine_start_s,
                        describe_served_model(text, scheduler))
    if LOG_COMPILES:
        result["compiled_while_serving"] = sorted(set(JIT_LINE.findall(logged[ready_at:].decode(errors="replace"))))
    write_result({**result, "weights_gib": float(scheduler["memory_usage"]["weight"]), **measured}, args.out)


def generate(engine, prompts: list[list[int]], max_tokens: int, **logprobs) -> list[dict]:
    params = {"temperature": 0, "max_new_tokens": max_tokens, "ignore_eos": True}
    return engine.generate(input_ids=prompts, sampling_params=params, **logprobs)


def measure(engine, args: argparse.Namespace, vocab: int) -> dict:
    """The correctness probe and the throughput workload, as engine_run.py runs them."""
    measured = {}
    if args.correctness:
        count, new_tokens = map(int, args.correctness.split(","))
        outputs = generate(engine, correctness_prompts(count, vocab), new_tokens, return_logprob=True,
                           top_logprobs_num=TOP_LOGPROBS)
        measured["correctness"] = {
            "tokens": [o["output_ids"] for o in outputs],
            # First generated position: top-20 logprobs by token id (SGLang gives (logprob, id, text)).
            "first_logprobs": [{str(token): logprob for logprob, token, _ in o["meta_info"]["output_top_logprobs"][0]}
                               for o in outputs],
        }
    if args.throughput:
        measured["throughput"] = measure_throughput(
            lambda prompts, max_tokens: sum(len(o["output_ids"]) for o in generate(engine, prompts, max_tokens)),
            args.throughput, vocab, args.warm_passes, args.timed_passes)
    return measured


def profile_windows(engine, args: argparse.Namespace, vocab: int) -> dict:
    """Per-kernel GPU time of two windows after the measured passes (so nothing compiles in them), under
    the scheduler's torch profiler (``Engine.start_profile``, GPU activity): ``prefill``, PREFILL_PROMPTS
    x 1024-token prompts and one output token each, and ``workload``, the throughput workload
    (``--throughput``) on new prompts. SGLang's steps are not counted here: times are per window."""
    count, in_len, out_len = map(int, args.throughput.split(","))
    windows = {"prefill": random_prompts(PREFILL_PROMPTS, 1024, vocab, seed=PROFILE_SEED),
               "workload": random_prompts(count, in_len, vocab, seed=PROFILE_SEED + 1)}
    out_lens = {"prefill": 1, "workload": out_len}
    trace_dir = tempfile.mkdtemp(prefix="sglang-profile-")
    profiles = {}
    for window, prompts in windows.items():
        engine.start_profile(output_dir=trace_dir, activities=["GPU"], with_stack=False, record_shapes=False,
                             profile_id=window)
        begin = time.perf_counter()
        generate(engine, prompts, out_lens[window])
        wall_s = time.perf_counter() - begin
        engine.stop_profile()
        trace = os.path.join(trace_dir, f"{window}-TP-0.trace.json.gz")
        profiles[window] = {"window": f"{len(prompts)} prompts x {len(prompts[0])} in / {out_lens[window]} out",
                            **summarise(*trace_kernel_times(trace), wall_s, steps=1, per="window")}
    shutil.rmtree(trace_dir)
    return profiles


if __name__ == "__main__":
    main()
