"""ATOM as an SGLang plugin. The entry point lives in :mod:`atom_sglang.register`."""
