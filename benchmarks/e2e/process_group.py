"""Engine processes started so that they can be stopped whole.

An engine (``vllm serve``, ``LLM(...)`` at TP > 1, ``sglang.launch_server``) starts worker processes
that outlive a stopped parent and keep their GPU memory: on 4 H200s the workers of a server that had
not come up in time still held 21 GiB a GPU after its API server was stopped, and the next engine on
those GPUs refused to start ("Free memory on device ... is less than desired GPU memory utilization").
Each engine therefore runs in a process group of its own, and stopping it stops the group.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time


def start(command: list[str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(command, **kwargs)`` as the leader of a new process group."""
    return subprocess.Popen(command, start_new_session=True, **kwargs)


def stop(process: subprocess.Popen, grace_s: float = 60) -> None:
    """SIGTERM to ``process``'s group, SIGKILL to what is left of it after ``grace_s`` (or once the
    leader has gone), and return once no process of the group is left (at most 30 s more)."""
    group = process.pid
    _signal(group, signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        pass
    _signal(group, signal.SIGKILL)
    process.wait()
    deadline = time.time() + 30
    while time.time() < deadline and _signal(group, 0):
        time.sleep(0.5)


def run(command: list[str], timeout_s: float, **kwargs) -> int | None:
    """Run ``command`` in its own group to its end, or stop the group after ``timeout_s``: its exit
    status, None on a timeout. Workers it leaves behind are stopped either way."""
    process = start(command, **kwargs)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None
    finally:
        stop(process)


def _signal(group: int, sig: int) -> bool:
    """Send ``sig`` to process group ``group``: whether any process of it was there."""
    try:
        os.killpg(group, sig)
        return True
    except ProcessLookupError:
        return False
