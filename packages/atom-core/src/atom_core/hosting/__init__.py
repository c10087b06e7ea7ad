"""The host-agnostic part of hosting a model in vLLM or SGLang: whether ATOM serves it at all
(:mod:`~atom_core.hosting.takeover`), its HF config completed with HF's defaults
(:mod:`~atom_core.hosting.hf_config`), and building the ATOM model (:mod:`~atom_core.hosting.build`).
"""
