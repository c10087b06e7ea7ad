"""Loads SGLang's plugins in a fresh process and prints what ATOM's plugin changed, as one JSON line.

``python plugin_probe.py MODEL_DIR``; the environment decides the scenario (ATOM active, disabled,
a user's own model package). Fresh processes because SGLang loads plugins once per process.
"""

import json
import os
import sys

RESULT_MARKER = "PLUGIN_PROBE_RESULT "


def resolved_attention_backend(server_args) -> str | None:
    """The attention backend SGLang resolved for ``server_args``."""
    from atom_sglang.version import resolves_server_args_in_steps

    if not resolves_server_args_in_steps():  # SGLang 0.5.17, 0.5.18: resolved while it was built
        return server_args.attention_backend
    from sglang.srt.arg_groups.model_override_base import resolving_view

    server_args.resolve_once()
    return resolving_view(server_args).attention_backend


def main() -> None:
    model_dir = sys.argv[1]
    from sglang.srt.plugins import load_plugins

    inherited_package = os.environ.get("SGLANG_EXTERNAL_MODEL_PACKAGE")
    load_plugins()
    load_plugins()
    if os.environ.get("ATOM_DISABLE_SGLANG_PLUGIN") != "1":
        from atom_sglang.register import register_plugin

        register_plugin()  # a third call, outside load_plugins' own guard
    env_package = os.environ.get("SGLANG_EXTERNAL_MODEL_PACKAGE")

    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.models.registry import ModelRegistry
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES, ServerArgs, prepare_server_args
    from sglang.srt.utils.common import support_triton

    from atom_core.models import SUPPORTED_ARCHITECTURES
    from atom_sglang.patches import hooks

    def default_backend(**kwargs) -> str:
        return resolved_attention_backend(ServerArgs(model_path=model_dir, device="cpu", dtype="float32", **kwargs))

    report = {
        "inherited_package": inherited_package,
        "env_package": env_package,
        "backend_registered": "atom" in ATTENTION_BACKENDS,
        "choice_count": ATTENTION_BACKEND_CHOICES.count("atom"),
        "hooks": {t: len(HookRegistry._hooks.get(t, [])) for t, _ in hooks()},
        "model_modules": {a: ModelRegistry.models[a].__module__ for a in SUPPORTED_ARCHITECTURES
                          if a in ModelRegistry.models},
        "default_backend": default_backend(),
        "explicit_backend": default_backend(attention_backend="torch_native"),
        "default_backend_fp8_kv_cache": default_backend(kv_cache_dtype="fp8_e4m3"),
        "support_triton_atom": support_triton("atom"),
        "support_triton_torch_native": support_triton("torch_native"),
    }
    if report["backend_registered"]:
        argv = ["--model-path", model_dir, "--device", "cpu", "--dtype", "float32", "--attention-backend", "atom"]
        report["cli_backend"] = resolved_attention_backend(prepare_server_args(argv))
        os.environ["ATOM_DISABLE_SGLANG_PLUGIN_ATTENTION"] = "1"
        report["default_backend_attention_disabled"] = default_backend()
    print(RESULT_MARKER + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
