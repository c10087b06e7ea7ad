"""Test setup for atom-kernels.

Without a GPU the Triton kernels run through Triton's interpreter, which ``@triton.jit`` picks when it
decorates a kernel, so TRITON_INTERPRET is set here, before anything imports atom_kernels. With a GPU
the same tests run the compiled kernels on CUDA.
"""

import os
import zlib

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def poison_uninitialized_memory():
    """torch.empty fills floats with NaN and ints with their max, so an output element a kernel never
    writes fails the comparison instead of passing on leftover memory."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    yield
    torch.use_deterministic_algorithms(False)


@pytest.fixture(autouse=True)
def fresh_seed(request):
    """Fresh random inputs per test, reproducible from the test's id."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def pytest_configure(config):
    # The interpreter evaluates masked-off lanes too (exp overflow in sigmoid, 0/0 in padding rows) and
    # trips NumPy deprecations of its own; neither says anything about the kernels.
    for category in ("RuntimeWarning", "DeprecationWarning"):
        config.addinivalue_line("filterwarnings", f"ignore::{category}:triton.runtime.interpreter")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
