import inspect
import subprocess
import sys

import pytest
import torch
from kernel_testing import DEVICE, ON_GPU, rand

import atom_kernels
from atom_kernels import BackendUnavailableError, reset_selection
from atom_kernels.registry import OPS, Op

DEFAULT_TRACED = ("rms_norm", "fused_add_rms_norm", "qk_norm_rope", "silu_and_mul", "rms_norm_quant_fp8",
                  "fused_add_rms_norm_quant_fp8", "silu_and_mul_quant_fp8", "per_group_quant_fp8", "rotary_embedding",
                  "topk_softmax", "grouped_topk")

# Ops that AITER has no adapter for yet: Qwen3-Next's linear attention, MLA's expanded keys, the
# norm and activation that quantise their output to fp8, and Quark's emulated W4A4 (AITER's MXFP4 ops
# pack activations for FP4 matrix units; on ROCm the Triton kernels run).
WITHOUT_AITER = {"causal_conv1d", "causal_conv1d_decode", "gated_delta_rule", "gated_delta_rule_decode",
                 "concat_mla_k", "rms_norm_quant_fp8", "fused_add_rms_norm_quant_fp8", "silu_and_mul_quant_fp8",
                 "mxfp4_quant_dequant", "mxfp4_linear"}
# A plain GEMM: torch's own kernels on GPUs (torchlib), the fp32 reference elsewhere.
GEMM_ONLY = {"router_logits": {"torch", "torchlib"}}


def test_every_op_has_all_three_backends():
    assert len(OPS) >= 19
    for name, op in OPS.items():
        if name in GEMM_ONLY:
            assert set(op.impls) == GEMM_ONLY[name], name
            continue
        expected = {"torch", "triton"} if name in WITHOUT_AITER else {"torch", "triton", "aiter"}
        assert expected <= set(op.impls), name
    # torch's own kernels, where they measured faster (atom_kernels.gemm.LIBRARY_MIN_ROWS).
    assert {name for name, op in OPS.items() if "torchlib" in op.impls} == {
        "fp8_block_scaled_mm", "fp8_scaled_mm", "router_logits"}


@pytest.mark.skipif(ON_GPU, reason="checks the CPU interpreter setup")
def test_triton_kernels_run_in_the_interpreter_on_cpu():
    from triton.runtime.interpreter import InterpretedFunction

    from atom_kernels import attention, norm, triton_utils

    assert triton_utils.interpreting()
    assert isinstance(norm._rms_norm_kernel, InterpretedFunction)
    assert isinstance(attention._attention_kernel, InterpretedFunction)


def test_importing_the_package_never_imports_aiter():
    code = "import sys, atom_kernels; assert 'aiter' not in sys.modules; print(atom_kernels.backend_report_line())"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "rms_norm=" in result.stdout


@pytest.fixture
def clean_selection(monkeypatch):
    for name in list(OPS):
        monkeypatch.delenv(f"ATOM_KERNEL_BACKEND_{name.upper()}", raising=False)
    monkeypatch.delenv("ATOM_KERNEL_BACKEND", raising=False)
    reset_selection()
    yield monkeypatch
    reset_selection()


def test_global_and_per_op_overrides(clean_selection):
    assert atom_kernels.rms_norm.select(DEVICE.type) == "triton"
    clean_selection.setenv("ATOM_KERNEL_BACKEND", "torch")
    clean_selection.setenv("ATOM_KERNEL_BACKEND_SILU_AND_MUL", "triton")
    reset_selection()
    report = atom_kernels.backend_report(DEVICE.type)
    assert report["rms_norm"] == "torch" and report["silu_and_mul"] == "triton"


def test_dispatch_follows_the_override(clean_selection):
    calls = []
    op = atom_kernels.silu_and_mul
    original = op.impls["torch"]
    clean_selection.setitem(op.impls, "torch", lambda x: calls.append(x) or original(x))
    clean_selection.setenv("ATOM_KERNEL_BACKEND_SILU_AND_MUL", "torch")
    reset_selection()
    op(rand(2, 8))
    assert len(calls) == 1


def test_aiter_requested_without_rocm_raises(clean_selection):
    clean_selection.setenv("ATOM_KERNEL_BACKEND", "aiter")
    reset_selection()
    with pytest.raises(BackendUnavailableError):
        atom_kernels.rms_norm(rand(2, 8), rand(8), 1e-6)


def test_global_request_skips_ops_without_that_backend(clean_selection):
    """ATOM_KERNEL_BACKEND forces the ops that have the backend; the others keep their default
    selection, marked in the report line. A per-op request for a missing backend is an error."""

    def reference_only(x: torch.Tensor) -> torch.Tensor:
        """An op with only a torch implementation."""

    op = Op(reference_only)
    op.register("torch")(lambda x: x)
    clean_selection.setitem(OPS, "reference_only", op)
    clean_selection.setenv("ATOM_KERNEL_BACKEND", "triton")
    reset_selection()
    assert op.select(DEVICE.type) == "torch"
    assert atom_kernels.rms_norm.select(DEVICE.type) == "triton"
    line = atom_kernels.backend_report_line(DEVICE.type)
    assert "reference_only=torch (no triton)" in line and "rms_norm=triton," in line
    clean_selection.setenv("ATOM_KERNEL_BACKEND_REFERENCE_ONLY", "triton")
    with pytest.raises(BackendUnavailableError, match="reference_only"):
        op.select(DEVICE.type)


def test_inductor_ops_are_checked_and_reported(clean_selection):
    """Unset, ATOM_INDUCTOR_OPS traces the eight norm / rope / activation / quant ops through their
    Triton implementations; ``none`` none; entries are ``name`` (its torch implementation traced) or
    ``name:triton``, anything else an error naming the entry. The report line lists the ops traced on
    the device: ``:triton`` ones on GPUs only, and only where Triton is the op's backend."""
    clean_selection.delenv("ATOM_INDUCTOR_OPS", raising=False)
    try:
        assert atom_kernels.set_inductor_ops() == {name: "triton" for name in DEFAULT_TRACED}
        clean_selection.setenv("ATOM_INDUCTOR_OPS", "none")
        assert atom_kernels.set_inductor_ops() == {}
        assert "traced" not in atom_kernels.backend_report_line(DEVICE.type)
        assert atom_kernels.set_inductor_ops("rms_norm,silu_and_mul:triton") == {"rms_norm": "torch",
                                                                                  "silu_and_mul": "triton"}
        traced = "; traced by torch.compile: rms_norm:torch"
        assert atom_kernels.backend_report_line(DEVICE.type).endswith(traced + (", silu_and_mul:triton" * ON_GPU))
        clean_selection.setenv("ATOM_KERNEL_BACKEND_SILU_AND_MUL", "torch")
        reset_selection()
        assert atom_kernels.backend_report_line(DEVICE.type).endswith(traced)
        for entry in ("no_such_op", "rms_norm:aiter", "fp8_block_scaled_mm:torchlib"):
            with pytest.raises(ValueError, match=f"ATOM_INDUCTOR_OPS: '{entry}'"):
                atom_kernels.set_inductor_ops(entry)
    finally:
        clean_selection.delenv("ATOM_INDUCTOR_OPS", raising=False)
        atom_kernels.set_inductor_ops()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU side (GPUs: test_kernels_traced_by_compile)")
@pytest.mark.parametrize("entry, dispatched", [("rms_norm", False), ("rms_norm:triton", True)])
def test_traced_triton_ops_stay_opaque_on_cpu(entry, dispatched):
    """Dynamo cannot follow Triton's interpreter, so on CPU an op marked ``:triton`` is called opaquely
    (one dispatch per call) while a torch-traced op runs inside the graph (none)."""
    x, weight = torch.randn(6, 64), torch.randn(64)
    torch._dynamo.reset()
    atom_kernels.set_inductor_ops(entry)
    try:
        compiled = torch.compile(lambda x: atom_kernels.rms_norm(x, weight, 1e-6), backend="aot_eager",
                                 fullgraph=True)
        calls = atom_kernels.rms_norm.calls
        torch.testing.assert_close(compiled(x), atom_kernels.rms_norm.impl("torch")(x, weight, 1e-6))
        assert (atom_kernels.rms_norm.calls > calls) == dispatched
    finally:
        atom_kernels.set_inductor_ops()
        torch._dynamo.reset()


def test_an_implementation_must_match_the_op_signature():
    def scale_rows(x: torch.Tensor, factor: float = 1.0, *, out: torch.Tensor | None = None):
        """The op's signature."""

    op = Op(scale_rows)
    op.register("torch")(lambda x, factor=1.0, *, out=None: x * factor)
    mismatches = [
        lambda x, scale=1.0, *, out=None: x,  # name
        lambda factor, x, *, out=None: x,  # order
        lambda x, factor=1.0, out=None: x,  # kind
        lambda x, factor=2.0, *, out=None: x,  # default
        lambda x, factor=1.0: x,  # missing parameter
    ]
    for fn in mismatches:
        with pytest.raises(TypeError, match="op scale_rows: the triton implementation"):
            op.register("triton")(fn)
    assert set(op.impls) == {"torch"}


def test_ops_carry_their_stub_signature_and_docs():
    for name, op in OPS.items():
        for backend, fn in op.impls.items():
            assert inspect.signature(fn).parameters.keys() == op.__signature__.parameters.keys()
        assert op.__doc__, name
    assert str(inspect.signature(atom_kernels.rms_norm)).startswith("(x: 'torch.Tensor'")


def test_custom_op_schemas_follow_the_stubs():
    schema = torch.ops.atom.fused_moe.default._schema
    assert [a.name for a in schema.arguments] == list(atom_kernels.fused_moe.__signature__.parameters)
    assert [a.kwarg_only for a in schema.arguments][5:] == [True] * 11


@pytest.mark.skipif(ON_GPU, reason="checks the CPU behaviour")
def test_warm_up_fused_moe_has_nothing_to_compile_off_cuda():
    assert atom_kernels.warm_up_fused_moe(rand(4, 64, 32), rand(4, 32, 32), 2) is None
