import subprocess
import sys
import types

import pytest
import torch
from kernel_testing import DEVICE, ON_GPU, assert_close, cu_seqlens, impl, paged_layout, rand

import atom_kernels
from atom_kernels import BackendUnavailableError, reset_selection
from atom_kernels.registry import OPS


def test_every_op_has_all_three_backends():
    assert len(OPS) >= 19
    for name, op in OPS.items():
        assert set(op.impls) == {"torch", "triton", "aiter"}, name


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


def test_all_reduce_hook():
    x = rand(4)
    assert atom_kernels.all_reduce(x) is x
    atom_kernels.set_all_reduce(lambda t: t * 2)
    try:
        assert torch.equal(atom_kernels.all_reduce(x), x * 2)
    finally:
        atom_kernels.set_all_reduce(None)
    assert atom_kernels.get_all_reduce() is None and atom_kernels.all_reduce(x) is x


# --- aiter adapters against a stand-in ------------------------------------------------------------
# No AMD GPU is reachable, so these check only the adapters' own wiring (argument order, layouts, the
# MLA page lists) against a stand-in that implements AITER's documented semantics with our torch
# references. They say nothing about AITER itself.


def _fake_mla_decode_fwd(
    q,
    kv_buffer,
    o,
    qo_indptr,
    kv_indptr,
    kv_indices,
    kv_last_page_lens,
    max_seqlen_q,
    page_size,
    nhead_kv,
    sm_scale,
):
    from atom_kernels.attention import attend_one_sequence

    rank = o.shape[-1]
    for i in range(qo_indptr.shape[0] - 1):
        pages = kv_indices[kv_indptr[i] : kv_indptr[i + 1]].long()
        length = (pages.numel() - 1) * page_size + int(kv_last_page_lens[i])
        latent = kv_buffer[pages].flatten(0, 1)[:length].squeeze(1).unsqueeze(1)
        qs, qe = int(qo_indptr[i]), int(qo_indptr[i + 1])
        o[qs:qe] = attend_one_sequence(
            q[qs:qe], latent, latent[..., :rank], sm_scale, True, None, None
        )


@pytest.fixture
def fake_aiter(monkeypatch):
    from atom_kernels import moe, norm

    aiter = types.ModuleType("aiter")
    aiter.rmsnorm2d_fwd = norm.rms_norm_torch

    def rmsnorm2d_fwd_with_add(out, x, residual_in, residual_out, weight, eps):
        y, summed = norm.fused_add_rms_norm_torch(x, residual_in, weight, eps)
        out.copy_(y)
        residual_out.copy_(summed)

    def topk_softmax(weights, ids, token_expert_indices, logits, renormalize):
        w, i = moe.topk_softmax_torch(logits, weights.shape[1], renormalize)
        weights.copy_(w)
        ids.copy_(i)

    aiter.rmsnorm2d_fwd_with_add = rmsnorm2d_fwd_with_add
    aiter.silu_and_mul = lambda out, x: out.copy_(impl("silu_and_mul", "torch")(x))
    aiter.topk_softmax = topk_softmax
    mla = types.ModuleType("aiter.mla")
    mla.mla_decode_fwd = _fake_mla_decode_fwd
    aiter.mla = mla
    monkeypatch.setitem(sys.modules, "aiter", aiter)
    monkeypatch.setitem(sys.modules, "aiter.mla", mla)
    return aiter


def test_aiter_adapters_wiring(fake_aiter):
    x, residual, weight = rand(3, 5, 64), rand(3, 5, 64), rand(64)
    assert_close(
        impl("rms_norm", "aiter")(x, weight, 1e-6),
        impl("rms_norm", "torch")(x, weight, 1e-6),
        torch.float32,
    )
    for got, want in zip(
        impl("fused_add_rms_norm", "aiter")(x, residual, weight, 1e-6),
        impl("fused_add_rms_norm", "torch")(x, residual, weight, 1e-6),
        strict=True,
    ):
        assert_close(got, want, torch.float32)
    gate_up = rand(4, 64)
    assert_close(
        impl("silu_and_mul", "aiter")(gate_up),
        impl("silu_and_mul", "torch")(gate_up),
        torch.float32,
    )
    logits = rand(6, 16)
    for got, want in zip(
        impl("topk_softmax", "aiter")(logits, 3, True),
        impl("topk_softmax", "torch")(logits, 3, True),
        strict=True,
    ):
        assert torch.equal(got, want)


def test_aiter_mla_adapter_builds_page_lists(fake_aiter):
    seq_lens = [50, 3, 17]
    block_table, num_blocks = paged_layout(seq_lens, 16)
    kv_cache, q = rand(num_blocks, 16, 80), rand(3, 4, 80)
    args = (
        q,
        kv_cache,
        cu_seqlens([1, 1, 1]),
        torch.tensor(seq_lens, device=DEVICE),
        block_table,
        0.1,
        64,
    )
    assert_close(
        impl("mla_decode", "aiter")(*args), impl("mla_decode", "torch")(*args), torch.float32
    )

