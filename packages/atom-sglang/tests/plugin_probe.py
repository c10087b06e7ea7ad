"""Loads SGLang's plugins in a fresh process and prints what ATOM's plugin changed, as one JSON line.

``python plugin_probe.py MODEL_DIR``; the environment decides the scenario (ATOM active, disabled,
a user's own model package). Fresh processes because SGLang loads plugins once per process.
"""

import json
import os
import sys

RESULT_MARKER = "PLUGIN_PROBE_RESULT "
HOOK_TARGETS = [
    "sglang.srt.server_args.ServerArgs._get_default_attn_backend",
    "sglang.srt.server_args.ServerArgs._handle_cpu_backends",
    "sglang.srt.utils.common.support_triton",
]


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

    def default_backend(**kwargs) -> str:
        return ServerArgs(model_path=model_dir, device="cpu", dtype="float32", **kwargs).attention_backend

    report = {
        "inherited_package": inherited_package,
        "env_package": env_package,
        "backend_registered": "atom" in ATTENTION_BACKENDS,
        "choice_count": ATTENTION_BACKEND_CHOICES.count("atom"),
        "hooks": {t: len(HookRegistry._hooks.get(t, [])) for t in HOOK_TARGETS},
        "model_modules": {a: ModelRegistry.models[a].__module__ for a in SUPPORTED_ARCHITECTURES
                          if a in ModelRegistry.models},
        "default_backend": default_backend(),
        "explicit_backend": default_backend(attention_backend="torch_native"),
        "support_triton_atom": support_triton("atom"),
        "support_triton_torch_native": support_triton("torch_native"),
    }
    if report["backend_registered"]:
        argv = ["--model-path", model_dir, "--device", "cpu", "--dtype", "float32", "--attention-backend", "atom"]
        report["cli_backend"] = prepare_server_args(argv).attention_backend
        os.environ["ATOM_DISABLE_SGLANG_PLUGIN_ATTENTION"] = "1"
        report["default_backend_attention_disabled"] = default_backend()
    print(RESULT_MARKER + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
