"""Tile configs measured per GPU model by ``benchmarks/kernels/tune_kernels.py``.

A table is ``<op>.json`` in this package's folder (``atom_kernels/tuned/``)::

    {"<torch.cuda.get_device_name()>": {"<shape key>": {"<size>": {<config>}, ...}, ...}, ...}

:func:`tuned_config` returns the entry of the smallest size at or above the one asked for (the largest
entry past the end), or None where this GPU or shape was never tuned; the launchers then fall back to
their built-in defaults. ``ATOM_TUNED_CONFIG_DIR`` names a directory whose tables are read before the
packaged ones, so a fresh tuning run is used without reinstalling.
"""

from __future__ import annotations

import bisect
import functools
import json
import os
from pathlib import Path
from typing import Any

import torch

PACKAGED_DIR = Path(__file__).parent


def table_paths(op: str) -> list[Path]:
    env_dir = os.environ.get("ATOM_TUNED_CONFIG_DIR")
    dirs = ([Path(env_dir)] if env_dir else []) + [PACKAGED_DIR]
    return [d / f"{op}.json" for d in dirs]


@functools.cache
def _shape_tables(op: str, device_name: str) -> dict[str, tuple[list[int], list[dict]]]:
    """Shape key -> (sorted sizes, their configs), the first table that has the key winning."""
    merged: dict[str, dict[str, Any]] = {}
    for path in reversed(table_paths(op)):
        if path.exists():
            merged.update(json.loads(path.read_text()).get(device_name, {}))
    tables = {}
    for key, by_size in merged.items():
        sizes = sorted(int(s) for s in by_size)
        tables[key] = (sizes, [by_size[str(s)] for s in sizes])
    return tables


def tuned_config(op: str, shape_key: str, size: int, device: torch.device) -> dict | None:
    if device.type != "cuda":
        return None
    return lookup(op, _device_name(device.index), shape_key, size)


@functools.cache
def _device_name(index: int | None) -> str:
    """The GPU's name, read once per device (the lookups run on every eager kernel launch)."""
    return torch.cuda.get_device_name(index)


def lookup(op: str, device_name: str, shape_key: str, size: int) -> dict | None:
    entry = _shape_tables(op, device_name).get(shape_key)
    if entry is None:
        return None
    sizes, configs = entry
    return configs[min(bisect.bisect_left(sizes, size), len(sizes) - 1)]


def all_tuned_configs(op: str, shape_key: str, device: torch.device) -> list[dict]:
    """The distinct configs of one shape on this GPU (for compiling them all before serving)."""
    if device.type != "cuda":
        return []
    entry = _shape_tables(op, _device_name(device.index)).get(shape_key)
    distinct: list[dict] = []
    for config in entry[1] if entry else []:
        if config not in distinct:
            distinct.append(config)
    return distinct


def clear_cache() -> None:
    """Forget loaded tables (after the tuner wrote new ones)."""
    _shape_tables.cache_clear()
