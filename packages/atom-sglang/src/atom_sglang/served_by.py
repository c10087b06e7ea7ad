"""Which classes serve a model in SGLang: for the benchmarks and the tests.

SGLang builds the model in its scheduler process, out of reach of the process that started the engine
(vLLM's ``LLM.apply_model``, which atom_vllm.served_by uses, has no SGLang counterpart). So the answer
comes from what the scheduler tells: ATOM's log lines (written whatever SGLang's log level) and its
resolved server arguments (``Engine.get_server_info()["internal_states"][0]``).
"""

from __future__ import annotations

import re

# Written by atom_core.hosting.build (ATOM builds the model) and atom_core.hosting.takeover (ATOM
# hands the configuration back to SGLang's own model class).
ATOM_MODEL_LINE = re.compile(r"INFO atom: Use ATOM model (\S+) for (\S+) in SGLang")
HAND_BACK_LINE = re.compile(r"INFO atom: ATOM hands (\S+) back to SGLang: (.*)")


def describe_served_model(log_text: str, server_args: dict) -> dict:
    """``atom_model``: ATOM's model class (``None``: SGLang's own model class served, because ATOM
    was disabled or handed the model back, ``handed_back`` saying why); ``architecture``: the one ATOM
    served or handed back; the attention backends as the scheduler resolved them (prefill and decode
    are ``None`` where SGLang uses ``attention_backend`` for both)."""
    model = ATOM_MODEL_LINE.search(log_text)
    hand_back = HAND_BACK_LINE.search(log_text)
    atom_model, architecture = model.groups() if model else (None, None)
    return {
        "atom_model": atom_model,
        "architecture": architecture or (hand_back.group(1) if hand_back else None),
        "handed_back": hand_back.group(2) if hand_back else None,
        "attention_backend": server_args["attention_backend"],
        "prefill_attention_backend": server_args.get("prefill_attention_backend"),
        "decode_attention_backend": server_args.get("decode_attention_backend"),
    }
