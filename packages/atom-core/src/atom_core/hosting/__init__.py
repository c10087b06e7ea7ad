"""The host-agnostic part of hosting a model in vLLM or SGLang: whether the installed host is the
release a glue supports (:mod:`~atom_core.hosting.version`), whether ATOM serves a model at all
(:mod:`~atom_core.hosting.takeover`), its HF config completed with HF's defaults
(:mod:`~atom_core.hosting.hf_config`), and building the ATOM model (:mod:`~atom_core.hosting.build`).
The glues' environment switches are :class:`atom_core.envs.HostSwitches`.
"""
