"""SGLang's server arguments as resolved, read the way the installed release publishes them.

SGLang 0.5.17 and 0.5.18 resolve the ``ServerArgs`` record itself: its fields are the values in
effect. SGLang 0.5.19 and later keep the record as the operator wrote it and record each resolution
step's decisions beside it (:func:`atom_sglang.version.resolves_server_args_in_steps`); a read view
over both gives the values in effect, with the record's field names.
"""

from __future__ import annotations

from typing import Any

from atom_sglang.version import resolves_server_args_in_steps


def server_args_in_effect() -> Any:
    """This process's server arguments as resolved (read-only where SGLang resolves in steps)."""
    from sglang.srt.runtime_context import get_server_args

    return in_effect(get_server_args())


def in_effect(server_args: Any) -> Any:
    """The ``ServerArgs`` record ``server_args`` with the values in effect."""
    if not resolves_server_args_in_steps():  # SGLang 0.5.17, 0.5.18: the record is resolved
        return server_args
    from sglang.srt.arg_groups.model_override_base import resolving_view

    return resolving_view(server_args)


def model_config_of(server_args: Any) -> Any:
    """SGLang's ``ModelConfig`` of the served model."""
    if not resolves_server_args_in_steps():  # SGLang 0.5.17, 0.5.18
        return server_args.get_model_config()
    from sglang.srt.arg_groups.model_override_base import model_config_of as host_model_config_of

    return host_model_config_of(server_args)


def attention_backends(server_args: Any) -> tuple[str | None, str | None]:
    """The (prefill, decode) attention backends in effect: the per-phase settings, else the one
    ``attention_backend``."""
    return (server_args.prefill_attention_backend or server_args.attention_backend,
            server_args.decode_attention_backend or server_args.attention_backend)
