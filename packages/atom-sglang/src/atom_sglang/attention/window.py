"""Sliding windows in ATOM's and SGLang's conventions.

ATOM (``AttentionSpec.sliding_window``, atom_kernels): a window of w lets a query at position p see
keys at positions > p - w, itself included. SGLang (``RadixAttention.sliding_window_size``, -1 for
none): the number of keys before the query it may see, so SGLang's own models pass w - 1.
"""

from __future__ import annotations


def to_sglang_window(window: int | None) -> int:
    return -1 if window is None else window - 1


def to_atom_window(sliding_window_size: int | None) -> int | None:
    if sliding_window_size is None or sliding_window_size < 0:
        return None
    return sliding_window_size + 1
