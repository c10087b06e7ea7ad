"""ATOM as a vLLM plugin. Entry points live in :mod:`atom_vllm.register`."""
