"""Adapters from ATOM's ops onto AMD AITER: the ``aiter`` backend, one module per op module.

UNTESTED ON HARDWARE: no AMD GPU was reachable when these were written. Their calls into AITER are
checked against the signatures of ROCm/aiter's sources (``tests/test_kernels_aiter_contract.py``
records them, with the file of each), not run; AITER's Python API drifts between releases, so pin
AITER and run ``tests/`` on a ROCm machine before trusting a release.

``aiter`` is imported inside each adapter, never at module import: importing it builds or loads its
compiled core, and it does not exist on NVIDIA or CPU. The registry selects this backend only on ROCm
with ``aiter`` installed (:func:`atom_kernels.registry.backend_available`). Options that AITER has no
kernel for fall through to our Triton kernels, which also run on ROCm.
"""

from atom_kernels.aiter import (  # noqa: F401  (each module registers its adapters)
    activation,
    attention,
    cache,
    gemm,
    mla,
    moe,
    norm,
    quant,
    rope,
    routing,
)
