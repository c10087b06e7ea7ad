"""Runs the real SGLang engine (CPU) on models in a fresh process and prints one JSON line per run.

Separate from pytest because SGLang loads plugins and reads the ATOM_* switches once per process, and
its engines spawn scheduler processes. The runs of one spec share the process (one engine after
another) to pay SGLang's import once. ``python sglang_runner.py '<json spec>'`` with spec
``{"runs": [{"model", "phases", "max_tokens", "engine_kwargs"}]}``: each phase is one ``generate``
call over a list of token-id prompts, so later phases can hit the radix cache filled by earlier ones
(a phase with ``{"text", "image"}`` or ``{"ids", "image"}`` prompts among them sends each prompt as
its own request, all at once, which the scheduler batches: SGLang's processor expands each image's
placeholder);
``"prompt_logprobs": true`` in a run returns each prompt token's log-probability after the first;
``"return_hidden_states": true`` each output's hidden states (the engine needs
``enable_return_hidden_states``); ``"weight_updates"``, one entry per phase (null or as
:func:`update_weights` takes it), updates the weights before that phase.
After each run, the result line goes to stdout and the bare marker to stderr, which ends that run's
log (the engine's processes share this process's stderr); within a run's log, READY_MARKER separates
the engine's start-up from the requests.
The caller puts ``tests/support`` (the sgl_kernel stand-in) first on PYTHONPATH for the CPU engine.
With ATOM_TEST_LOG_TRITON_COMPILES=1 every process logs its Triton compiles
(atom_core.testing.jit_monitor): SGLang starts its scheduler with ``spawn``, which runs this
module's top level again there (as ``__mp_main__``).
"""

import asyncio
import glob
import json
import os
import sys
import time

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
if os.environ.get("ATOM_TEST_LOG_TRITON_COMPILES") == "1":
    from atom_core.testing.jit_monitor import log_triton_compiles

    log_triton_compiles()

RESULT_MARKER = "SGLANG_RUNNER_RESULT "
READY_MARKER = "SGLANG_RUNNER_ENGINE_READY"
ENGINE_KWARGS = dict(
    device="cpu",
    dtype="float32",
    mem_fraction_static=0.2,
    max_total_tokens=4096,
    disable_cuda_graph=True,
    random_seed=0,
    log_level="warning",
)


def update_weights(engine, update: dict) -> None:
    """SGLang's weight updates of RL frameworks: ``{"from_disk": DIR}`` (``update_weights_from_disk``)
    or ``{"from_tensors": DIR}`` (DIR's safetensors by name through ``update_weights_from_tensor``, in
    two buckets, inside a weight-update session where SGLang has them: 0.5.23).
    First wait until the scheduler is idle: it retires a finished batch one loop after streaming its
    output, and the cache flush that follows an update asserts an idle scheduler."""
    for _ in range(200):
        if engine.flush_cache().success:
            break
        time.sleep(0.05)
    else:
        raise RuntimeError("SGLang's scheduler did not become idle")
    if "from_disk" in update:
        ok, message, *_ = engine.update_weights_from_disk(update["from_disk"])
    else:
        from safetensors.torch import load_file

        files = sorted(glob.glob(os.path.join(update["from_tensors"], "*.safetensors")))
        tensors = [t for f in files for t in load_file(f).items()]
        session = hasattr(engine, "begin_weight_update")
        if session:
            engine.begin_weight_update()
        for bucket in (tensors[:len(tensors) // 2], tensors[len(tensors) // 2:]):
            ok, message, *_ = engine.update_weights_from_tensor(bucket)
            if not ok:
                break
        if session:
            engine.end_weight_update()
    if not ok:
        raise RuntimeError(f"weight update {update} failed: {message}")


def generate(engine, prompts: list, params: dict, **extra) -> list[dict]:
    if all(isinstance(prompt, list) for prompt in prompts):
        return engine.generate(input_ids=prompts, sampling_params=params, **extra)

    def request(prompt) -> dict:
        if isinstance(prompt, list):
            return {"input_ids": prompt}
        tokens = {"input_ids": prompt["ids"]} if "ids" in prompt else {"prompt": prompt["text"]}
        return {**tokens, "image_data": prompt.get("image")}

    async def together() -> list[dict]:
        return await asyncio.gather(*(engine.async_generate(**request(prompt), sampling_params=params, **extra)
                                      for prompt in prompts))

    return engine.loop.run_until_complete(together())


def main() -> None:
    spec = json.loads(sys.argv[1])
    import sglang

    from atom_sglang.resolved_args import in_effect

    for run in spec["runs"]:
        engine = sglang.Engine(model_path=run["model"], **{**ENGINE_KWARGS, **run.get("engine_kwargs", {})})
        print(READY_MARKER, file=sys.stderr, flush=True)
        try:
            params = {"temperature": 0, "max_new_tokens": run["max_tokens"], "ignore_eos": True}
            logprobs = {"return_logprob": True, "logprob_start_len": 0} if run.get("prompt_logprobs") else {}
            hidden = {"return_hidden_states": True} if run.get("return_hidden_states") else {}
            updates = run.get("weight_updates") or [None] * len(run["phases"])
            phases = []
            for prompts, update in zip(run["phases"], updates):
                if update:
                    update_weights(engine, update)
                phases.append(
                    [{"tokens": o["output_ids"], "cached_tokens": o["meta_info"]["cached_tokens"],
                      **({"prompt_logprobs": [lp[0] for lp in o["meta_info"]["input_token_logprobs"][1:]]}
                         if logprobs else {}),
                      **({"hidden_states": o["meta_info"]["hidden_states"]} if hidden else {})}
                     for o in generate(engine, prompts, params, **logprobs, **hidden)])
            result = {"model": run["model"], "phases": phases,
                      "attention_backend": in_effect(engine.server_args).attention_backend}
        finally:
            engine.shutdown()
        print(RESULT_MARKER + json.dumps(result), flush=True)
        print(RESULT_MARKER, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
