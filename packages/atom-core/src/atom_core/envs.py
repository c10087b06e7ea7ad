"""ATOM's environment switches, read at call time so tests can flip them: the ones every host glue
shares, and each glue's own three (:class:`HostSwitches`, which ``atom_vllm.envs`` and
``atom_sglang.envs`` name for their host)."""

from __future__ import annotations

import os
from dataclasses import dataclass


def flag(name: str) -> bool:
    """A boolean environment switch: ``1``, ``true`` or ``yes`` (any case) turns it on."""
    return os.environ.get(name, "0").lower() in ("1", "true", "yes")


def strict_takeover() -> bool:
    """ATOM_STRICT_TAKEOVER=1: where ATOM would hand a model back to the host (see
    :mod:`atom_core.hosting.takeover`), refuse to start instead, naming the reasons."""
    return flag("ATOM_STRICT_TAKEOVER")


def serve_mxfp4() -> bool:
    """ATOM_SERVE_MXFP4=1: ATOM serves gpt-oss MXFP4 checkpoints. Off by default, because on an H200
    ATOM is only level with vLLM alone on them offline (1.02-1.16x) and slower serving 16 and 64
    requests (0.81-0.85x; docs/performance.md): the host serves them until ATOM is measurably faster."""
    return flag("ATOM_SERVE_MXFP4")


def serve_hybrid_on_gpu() -> bool:
    """ATOM_SERVE_HYBRID_ON_GPU=1: ATOM serves its hybrid linear-attention models (Qwen3-Next) on
    GPUs too. Off by default: Qwen3-Next ran at 0.92-1.00x vLLM alone on an H200 (docs/performance.md;
    its kernels pass on the GPU and it matches HF there in fp32) and Qwen3.5-35B-A3B at 0.98x, so on
    a GPU the host serves them."""
    return flag("ATOM_SERVE_HYBRID_ON_GPU")


def serve_where_slower() -> bool:
    """ATOM_SERVE_WHERE_SLOWER=1: ATOM serves the models that ran slower with ATOM than with the host
    alone on a GPU (:data:`atom_core.hosting.takeover.SLOWER_ON_GPU`). Off by default: there the
    host serves them."""
    return flag("ATOM_SERVE_WHERE_SLOWER")


def fp8_activation_fusion_disabled() -> bool:
    """ATOM_DISABLE_FP8_ACTIVATION_FUSION=1: the RMSNorms and SiLU * mul before FP8 linear layers
    emit the model dtype and each FP8 linear quantizes its own input, in a launch of its own (see
    :mod:`atom_core.quantization.fp8`); read when the layers are built."""
    return flag("ATOM_DISABLE_FP8_ACTIVATION_FUSION")


@dataclass(frozen=True)
class HostSwitches:
    """The switches of one host glue, named for the host (``VLLM``, ``SGLANG``):

    - ``ATOM_DISABLE_<HOST>_PLUGIN=1``: the host runs exactly as if ATOM were not installed;
    - ``ATOM_DISABLE_<HOST>_PLUGIN_ATTENTION=1``: ATOM models run on the host's own attention;
    - ``ATOM_SKIP_<HOST>_VERSION_CHECK=1``: allow a host release other than the pinned one
      (experiments only; see :mod:`atom_core.hosting.version`).
    """

    host: str

    @property
    def skip_version_check_name(self) -> str:
        return f"ATOM_SKIP_{self.host}_VERSION_CHECK"

    def plugin_disabled(self) -> bool:
        return flag(f"ATOM_DISABLE_{self.host}_PLUGIN")

    def attention_disabled(self) -> bool:
        return flag(f"ATOM_DISABLE_{self.host}_PLUGIN_ATTENTION")

    def version_check_skipped(self) -> bool:
        return flag(self.skip_version_check_name)
