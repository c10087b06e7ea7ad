"""causal_conv1d / causal_conv1d_decode: the Triton kernels against the torch reference, the reference
against HF transformers' Qwen3-Next conv functions, and a state carried across calls."""

import inspect

import pytest
import torch
from kernel_testing import DEVICE, assert_close, compiled_variants, cu_seqlens, float_dtypes, impl, rand

CHANNELS, KERNEL_SIZE = 40, 4  # 40: not a power of two, so the channel mask matters
LENGTHS = [1, 2, 7, 33]
HAS_INITIAL = [True, False, True, False]


def conv_inputs(lengths, dtype, with_bias, kernel_size=KERNEL_SIZE, channels=CHANNELS):
    x = rand(sum(lengths), channels, dtype=dtype)
    weight = rand(channels, kernel_size, dtype=dtype, scale=0.5)
    bias = rand(channels, dtype=dtype) if with_bias else None
    return x, weight, bias


def initial_state(has_initial, dtype, kernel_size=KERNEL_SIZE, channels=CHANNELS):
    """Random history where a sequence has one; NaN where not, which the op must not read."""
    state = rand(len(has_initial), channels, kernel_size - 1, dtype=dtype)
    state[~torch.tensor(has_initial, device=DEVICE)] = float("nan")
    return state


def hf_conv_functions():
    """HF's own torch functions, unwrapped from the decorator that may swap in a hub kernel. Older
    transformers (5.12, SGLang 0.5.17's pin) have no torch form: their names are None there."""
    qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    functions = qwen3_next.causal_conv1d_fn, qwen3_next.causal_conv1d_update
    if None in functions:
        pytest.skip("this transformers has no torch causal_conv1d_fn / causal_conv1d_update")
    return tuple(inspect.unwrap(function) for function in functions)


@float_dtypes
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_causal_conv1d_triton_matches_torch(dtype, with_bias):
    x, weight, bias = conv_inputs(LENGTHS, dtype, with_bias)
    has_initial = torch.tensor(HAS_INITIAL, device=DEVICE)
    state = initial_state(HAS_INITIAL, dtype)
    expected_state = state.clone()
    args = (weight, bias, cu_seqlens(LENGTHS))
    expected = impl("causal_conv1d", "torch")(x, *args, expected_state, has_initial)
    out = impl("causal_conv1d", "triton")(x, *args, state, has_initial)
    assert_close(out, expected, dtype)
    assert_close(state, expected_state, dtype)


@pytest.mark.parametrize("kernel_size", [2, 3, 4, 5])
@pytest.mark.parametrize("channels", [CHANNELS, 1064], ids=["one_channel_block", "several_channel_blocks"])
def test_causal_conv1d_sequences_over_several_blocks(kernel_size, channels):
    """Sequences longer than one prefill program's block of tokens (PREFILL_BLOCK_T): their blocks run
    at once, the first reads the old state (or zeros: also for sequences shorter than the kernel),
    and the new state is written only after all of them; at each kernel width the prefill kernel
    carries (2-4) and at 5, which its kernel refuses to compile, through the torch reference."""
    from atom_kernels.short_conv import PREFILL_BLOCK_C, PREFILL_BLOCK_T

    lengths = [2 * PREFILL_BLOCK_T + 2, 3, PREFILL_BLOCK_T, PREFILL_BLOCK_T + 1, 1, 2]
    has_initial = [True, True, False, True, False, False]
    if channels > CHANNELS:  # channel blocks past the first, fewer tokens
        assert channels > PREFILL_BLOCK_C
        lengths, has_initial = lengths[1:], has_initial[1:]
    x, weight, bias = conv_inputs(lengths, torch.float32, True, kernel_size, channels)
    state = initial_state(has_initial, torch.float32, kernel_size, channels)
    expected_state = state.clone()
    args = (weight, bias, cu_seqlens(lengths))
    initial = torch.tensor(has_initial, device=DEVICE)
    expected = impl("causal_conv1d", "torch")(x, *args, expected_state, initial)
    out = impl("causal_conv1d", "triton")(x, *args, state, initial)
    assert_close(out, expected, torch.float32)
    assert_close(state, expected_state, torch.float32)


def test_causal_conv1d_inf_stays_within_the_kernel_width():
    """An infinite input reaches only the outputs within the kernel's width after it (the reference's
    NaN and inf pattern): narrower kernels must not multiply the inputs they do not use by zero."""
    lengths = [12]
    for kernel_size in (2, 3):
        x, weight, bias = conv_inputs(lengths, torch.float32, False, kernel_size)
        x[2, :] = float("inf")
        args = (weight, bias, cu_seqlens(lengths), initial_state([True], torch.float32, kernel_size))
        expected = impl("causal_conv1d", "torch")(x, *args[:3], args[3].clone(), torch.tensor([True], device=DEVICE))
        out = impl("causal_conv1d", "triton")(x, *args, torch.tensor([True], device=DEVICE))
        assert torch.equal(out.isnan(), expected.isnan()) and torch.equal(out.isinf(), expected.isinf())
        assert out.isfinite()[2 + kernel_size:].all()


@float_dtypes
def test_causal_conv1d_decode_triton_matches_torch(dtype):
    x, weight, bias = conv_inputs([1] * 5, dtype, with_bias=True)
    state = initial_state([True] * 5, dtype)
    expected_state = state.clone()
    expected = impl("causal_conv1d_decode", "torch")(x, weight, bias, expected_state)
    out = impl("causal_conv1d_decode", "triton")(x, weight, bias, state)
    assert_close(out, expected, dtype)
    assert_close(state, expected_state, dtype)


@pytest.mark.parametrize("op", ["causal_conv1d", "causal_conv1d_decode"])
def test_state_slots_read_and_write_rows_of_a_cache(op):
    """With ``state_slots`` each sequence's conv state is a row of a host's cache whose rows lie
    further apart than one state (vLLM's pages also hold the recurrent state): the Triton kernel
    equals the reference, and rows of no sequence keep their bytes (the page tails too)."""
    prefill = op == "causal_conv1d"
    lengths = LENGTHS if prefill else [1] * 4
    x, weight, bias = conv_inputs(lengths, torch.float32, with_bias=False)
    slots = torch.tensor([5, 0, 3, 6], dtype=torch.int32, device=DEVICE)
    state_size = CHANNELS * (KERNEL_SIZE - 1)
    pages = rand(8, state_size + 13)
    expected_pages = pages.clone()

    def rows(p):
        return p[:, :state_size].unflatten(1, (CHANNELS, KERNEL_SIZE - 1))

    lengths_args = (cu_seqlens(lengths),) if prefill else ()
    initial_args = (torch.tensor(HAS_INITIAL, device=DEVICE),) if prefill else ()
    expected = impl(op, "torch")(x, weight, bias, *lengths_args, rows(expected_pages), *initial_args,
                                 "silu", slots)
    out = impl(op, "triton")(x, weight, bias, *lengths_args, rows(pages), *initial_args, "silu", slots)
    assert_close(out, expected, torch.float32)
    assert_close(pages, expected_pages, torch.float32)
    untouched = torch.ones(8, dtype=torch.bool, device=DEVICE)
    untouched[slots.long()] = False
    assert torch.equal(pages[untouched], expected_pages[untouched])
    assert torch.equal(pages[:, state_size:], expected_pages[:, state_size:])


@pytest.mark.gpu
def test_prefill_reuses_one_compiled_variant_across_batches():
    """The sequence count and the offset of a batch's slots and flags in the host's tensors (vLLM
    slices the decodes off the front) change every step; neither may compile another variant of the
    prefill's kernels mid-serving."""
    from atom_kernels import short_conv

    state = rand(64, CHANNELS, KERNEL_SIZE - 1, dtype=torch.bfloat16)
    slots = torch.arange(64, dtype=torch.int32, device=DEVICE)
    has_initial = torch.ones(64, dtype=torch.bool, device=DEVICE)

    def prefill(first: int, lengths: list[int]) -> None:
        rows = slice(first, first + len(lengths))
        x, weight, bias = conv_inputs(lengths, torch.bfloat16, with_bias=False)
        impl("causal_conv1d", "triton")(x, weight, bias, cu_seqlens(lengths), state, has_initial[rows], "silu",
                                        slots[rows])

    def variants() -> int:
        return compiled_variants(short_conv._causal_conv1d_prefill_kernel, short_conv._conv_state_kernel)

    prefill(0, [16])
    compiled = variants()
    for first, lengths in [(1, [16]), (3, [1, 2, 64]), (5, [1] * 16), (0, [100] * 17), (7, [130])]:
        prefill(first, lengths)
    assert variants() == compiled


def test_causal_conv1d_torch_matches_hf():
    """Fresh sequences against HF's causal_conv1d_fn, continued ones against causal_conv1d_update
    (channels-first [batch, C, L], the state updated in place)."""
    hf_conv1d_fn, hf_conv1d_update = hf_conv_functions()
    x, weight, bias = conv_inputs(LENGTHS, torch.float32, with_bias=True)
    state = initial_state(HAS_INITIAL, torch.float32)
    hf_state = state.clone()
    out = impl("causal_conv1d", "torch")(
        x, weight, bias, cu_seqlens(LENGTHS), state, torch.tensor(HAS_INITIAL, device=DEVICE)
    )
    starts = cu_seqlens(LENGTHS).tolist()
    for seq, initial in enumerate(HAS_INITIAL):
        tokens = x[starts[seq] : starts[seq + 1]].T[None]
        if initial:
            expected = hf_conv1d_update(tokens, hf_state[seq : seq + 1], weight, bias, "silu")
            assert_close(state[seq], hf_state[seq], torch.float32)
        else:
            expected = hf_conv1d_fn(tokens, weight, bias, activation="silu")
        assert_close(out[starts[seq] : starts[seq + 1]], expected[0].T, torch.float32)


def test_causal_conv1d_decode_torch_matches_hf():
    _, hf_conv1d_update = hf_conv_functions()
    x, weight, bias = conv_inputs([1] * 3, torch.float32, with_bias=False)
    state = initial_state([True] * 3, torch.float32)
    hf_state = state.clone()
    out = impl("causal_conv1d_decode", "torch")(x, weight, bias, state)
    expected = hf_conv1d_update(x[:, :, None], hf_state, weight, bias, "silu")
    assert_close(out, expected[:, :, 0], torch.float32)
    assert_close(state, hf_state, torch.float32)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_causal_conv1d_state_carries_across_calls(backend):
    """Prefill in two pieces, then decode, equals one prefill of the whole sequence."""
    conv, decode = impl("causal_conv1d", backend), impl("causal_conv1d_decode", backend)
    x, weight, bias = conv_inputs([12], torch.float32, with_bias=True)
    fresh, continued = torch.tensor([False], device=DEVICE), torch.tensor([True], device=DEVICE)
    whole_state = initial_state([False], torch.float32)
    whole = conv(x, weight, bias, cu_seqlens([12]), whole_state, fresh)
    state = initial_state([False], torch.float32)
    pieces = [
        conv(x[:2], weight, bias, cu_seqlens([2]), state, fresh),
        conv(x[2:11], weight, bias, cu_seqlens([9]), state, continued),
        decode(x[11:], weight, bias, state),
    ]
    assert_close(torch.cat(pieces), whole, torch.float32)
    assert_close(state, whole_state, torch.float32)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_causal_conv1d_rejects_bad_arguments(backend):
    conv, decode = impl("causal_conv1d", backend), impl("causal_conv1d_decode", backend)
    x, weight, bias = conv_inputs([3, 2], torch.float32, with_bias=True)
    lengths, has_initial = cu_seqlens([3, 2]), torch.tensor([True, False], device=DEVICE)
    state = initial_state([True, True], torch.float32)
    with pytest.raises(ValueError, match="conv_state has shape"):
        conv(x, weight, bias, lengths, state[:1], has_initial)
    with pytest.raises(ValueError, match="has_initial_state has shape"):
        conv(x, weight, bias, lengths, state, has_initial[:1])
    with pytest.raises(ValueError, match="bias has shape"):
        conv(x, weight, bias[:3], lengths, state, has_initial)
    with pytest.raises(ValueError, match="activation 'gelu'"):
        decode(x[:2], weight, bias, state, "gelu")
    with pytest.raises(ValueError, match="x has shape"):
        decode(x[:2, :8], weight, bias, state)
