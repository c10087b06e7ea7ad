"""Helpers of the atom-sglang tests: running SGLang in fresh processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
SUPPORT_DIR = os.path.join(TESTS_DIR, "support")
RUNNER = os.path.join(TESTS_DIR, "sglang_runner.py")
RESULT_MARKER = "SGLANG_RUNNER_RESULT "
READY_MARKER = "SGLANG_RUNNER_ENGINE_READY"
# Every SGLang engine spawns fresh interpreters that import all of SGLang; with bytecode caching off
# (PYTHONDONTWRITEBYTECODE, no .pyc in the environment) each one compiles it again. The engine
# processes of the tests share one bytecode cache outside the environment instead: the caller's
# (ci/common.sh sets one), else one in the temporary directory.
PYCACHE_DIR = os.environ.get("PYTHONPYCACHEPREFIX") or os.path.join(tempfile.gettempdir(),
                                                                     "atom-sglang-tests-pycache")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sglang_env(cpu_engine: bool = True, **overrides: str) -> dict[str, str]:
    """Environment of an SGLang process: CPU engine, the sgl_kernel stand-in first on the path (on a
    GPU, ``cpu_engine=False``: neither), and none of the caller's ATOM/SGLang plugin switches unless
    given in ``overrides``. One OpenMP thread: the tiny models gain nothing from more, and several
    engines start at once on few cores (spinning OpenMP workers of one process would take the cores
    the others are waiting for)."""
    dropped = ("ATOM_DISABLE_SGLANG", "SGLANG_PLUGINS", "SGLANG_EXTERNAL_MODEL_PACKAGE",
               "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
    if cpu_engine:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (SUPPORT_DIR, env.get("PYTHONPATH")) if p)
    return {**env, "SGLANG_USE_CPU_ENGINE": "1" if cpu_engine else "0", "PYTHONPYCACHEPREFIX": PYCACHE_DIR,
            "OMP_NUM_THREADS": "1", **overrides}


def run_parallel(commands: list[tuple[list[str], dict[str, str]]], timeout: int,
                 cpu_engine: bool = True) -> list[tuple[int, str, str]]:
    """Run ``(argv, env overrides)`` commands in SGLang environments, all at once (an engine start
    is mostly waiting); (returncode, stdout, stderr) of each."""
    with tempfile.TemporaryDirectory() as logs:
        procs, files = [], []
        for i, (argv, env) in enumerate(commands):
            # Files, not pipes: a pipe nobody reads yet would stall a chatty process.
            out_path, err_path = os.path.join(logs, f"{i}.out"), os.path.join(logs, f"{i}.err")
            with open(out_path, "w") as out, open(err_path, "w") as err:
                procs.append(subprocess.Popen(argv, env=sglang_env(cpu_engine, **env), stdout=out,
                                              stderr=err))
            files.append((out_path, err_path))
        for proc in procs:
            proc.wait(timeout=timeout)
        outputs = []
        for proc, (out_path, err_path) in zip(procs, files):
            with open(out_path) as out, open(err_path) as err:
                outputs.append((proc.returncode, out.read(), err.read()))
    return outputs


# SGLang takes each engine's distributed-init port from the OS (bind to port 0, release, bind again
# at start-up), so engines started at once can race for one port (EADDRINUSE, seen once in a fresh
# clone's run). Each run gets its own instead, below Linux's ephemeral range, which the OS never
# hands out that way.
NCCL_PORT_BASE = 21000


def with_own_nccl_ports(job: int, runs: list[dict]) -> list[dict]:
    return [{**run, "engine_kwargs": {"nccl_port": NCCL_PORT_BASE + 100 * job + i, **run.get("engine_kwargs", {})}}
            for i, run in enumerate(runs)]


def run_sglang(*jobs: tuple[list[dict], dict[str, str]], timeout: int = 900,
               cpu_engine: bool = True) -> list[list[dict]]:
    """Run each job ``(runs, env overrides)`` (runs as in sglang_runner.py) in its own fresh process,
    all at once. Per job, one result per run, each with the log lines its engine produced under
    ``"log"``: those of its start-up under ``"startup_log"``, those while serving the requests under
    ``"serving_log"``."""
    commands = [([sys.executable, RUNNER, json.dumps({"runs": with_own_nccl_ports(job, runs)})], env)
                for job, (runs, env) in enumerate(jobs)]
    all_results = []
    for (runs, _), (returncode, stdout, stderr) in zip(jobs, run_parallel(commands, timeout, cpu_engine)):
        results = [json.loads(line[len(RESULT_MARKER):]) for line in stdout.splitlines()
                   if line.startswith(RESULT_MARKER)]
        if returncode != 0 or len(results) != len(runs):
            raise AssertionError(f"SGLang run failed (rc={returncode}):\n{stdout[-4000:]}\n{stderr[-8000:]}")
        for result, log in zip(results, stderr.split(RESULT_MARKER)):
            result["log"] = log
            result["startup_log"], _, result["serving_log"] = log.partition(READY_MARKER)
        all_results.append(results)
    return all_results


class ResolvedWith:
    """SGLang's (read-only) server arguments with some of them taking other values."""

    def __init__(self, server_args, **overrides):
        self.server_args, self.overrides = server_args, overrides

    def __getattr__(self, name: str):
        return self.overrides[name] if name in self.overrides else getattr(self.server_args, name)


def decision_for(model_path: str, **server_args):
    """ATOM's takeover decision for ``model_path`` from SGLang's own resolved ``ServerArgs`` (CPU,
    ``server_args`` on top) and ``ModelConfig``: no engine start."""
    from sglang.srt.server_args import ServerArgs

    from atom_sglang.config_translation import takeover_decision
    from atom_sglang.resolved_args import in_effect, model_config_of

    resolved = in_effect(ServerArgs(model_path=model_path, device="cpu", **server_args))
    return takeover_decision(resolved, model_config_of(resolved))
