"""gated_delta_rule / gated_delta_rule_decode: the Triton kernels against the torch reference, the
chunked Triton form against the recurrent one, and the reference against HF transformers' Qwen3-Next
torch functions."""

import inspect

import pytest
import torch
import torch.nn.functional as F
from kernel_testing import DEVICE, assert_close, compiled_variants, cu_seqlens, impl, rand

from atom_kernels import gated_delta

# Lengths around the 64-token chunk: one token, part of a chunk, exactly one, three chunks.
LENGTHS = [1, 17, 64, 130]
HAS_INITIAL = [True, False, True, False]


def gdn_inputs(lengths, num_k_heads, num_v_heads, head_k, head_v, dtype=torch.float32):
    """q, k, v, g, beta as Qwen3-Next makes them: g = log decay <= 0, beta = sigmoid in (0, 1);
    k at unit scale, so the recurrence stays bounded without the L2 norm too."""
    num_tokens = sum(lengths)
    q = rand(num_tokens, num_k_heads, head_k, dtype=dtype)
    k = rand(num_tokens, num_k_heads, head_k, dtype=dtype, scale=head_k**-0.5)
    v = rand(num_tokens, num_v_heads, head_v, dtype=dtype)
    g = F.logsigmoid(rand(num_tokens, num_v_heads, scale=2.0) + 2.0)
    beta = torch.sigmoid(rand(num_tokens, num_v_heads)).to(dtype)
    return q, k, v, g, beta


def initial_state(has_initial, num_v_heads, head_k, head_v):
    """Random states where a sequence has one; NaN where not, which the op must not read."""
    state = rand(len(has_initial), num_v_heads, head_k, head_v, scale=0.5)
    state[~torch.tensor(has_initial, device=DEVICE)] = float("nan")
    return state


# (num_k_heads, num_v_heads, head_k, head_v, dtype, use_qk_l2norm): GQA ratios 2 and 1, head dims
# that are not powers of two, two value-column blocks (80 = 64 + 16), bf16 inputs, no L2 norm.
CASES = [
    (2, 4, 32, 16, torch.float32, True),
    (1, 1, 24, 80, torch.float32, True),
    (1, 2, 32, 32, torch.bfloat16, True),
    (1, 1, 32, 64, torch.bfloat16, True),
    (2, 2, 16, 16, torch.float32, False),
]
cases = pytest.mark.parametrize(
    "num_k_heads, num_v_heads, head_k, head_v, dtype, use_qk_l2norm",
    CASES,
    ids=["gqa2-fp32", "heads1-fp32-two-vblocks", "gqa2-bf16", "bf16-vblock64", "no-l2norm"],
)


# The chunked form's options (module settings of atom_kernels.gated_delta), each on its own.
FORMS = {"default": {}, "fp32-wu": {"WU_16BIT": False}, "inverse-16": {"INVERSE_SUB": 16},
         "state-tf32": {"STATE_DOT_16BIT": False}, "prepare-tf32": {"PREPARE_DOT_16BIT": False}}


@cases
@pytest.mark.parametrize("form", FORMS)
def test_gated_delta_rule_triton_matches_torch(
    num_k_heads, num_v_heads, head_k, head_v, dtype, use_qk_l2norm, form, monkeypatch
):
    for name, value in FORMS[form].items():
        monkeypatch.setattr(gated_delta, name, value)
    inputs = gdn_inputs(LENGTHS, num_k_heads, num_v_heads, head_k, head_v, dtype)
    state = initial_state(HAS_INITIAL, num_v_heads, head_k, head_v)
    expected_state = state.clone()
    has_initial = torch.tensor(HAS_INITIAL, device=DEVICE)
    lengths = cu_seqlens(LENGTHS)
    expected = impl("gated_delta_rule", "torch")(
        *inputs, lengths, expected_state, has_initial, use_qk_l2norm
    )
    out = impl("gated_delta_rule", "triton")(*inputs, lengths, state, has_initial, use_qk_l2norm)
    assert out.dtype == dtype
    assert_close(out, expected, dtype, "accumulated")
    # The fp32 state of 16-bit inputs: on GPUs the kernel's 16-bit or TF32 dots round no more than
    # the inputs did.
    assert_close(state, expected_state, dtype, "accumulated")


@cases
def test_gated_delta_rule_decode_triton_matches_torch(
    num_k_heads, num_v_heads, head_k, head_v, dtype, use_qk_l2norm
):
    inputs = gdn_inputs([1] * 5, num_k_heads, num_v_heads, head_k, head_v, dtype)
    state = initial_state([True] * 5, num_v_heads, head_k, head_v)
    expected_state = state.clone()
    expected = impl("gated_delta_rule_decode", "torch")(*inputs, expected_state, use_qk_l2norm)
    out = impl("gated_delta_rule_decode", "triton")(*inputs, state, use_qk_l2norm)
    assert_close(out, expected, dtype, "accumulated")
    assert_close(state, expected_state, torch.float32, "accumulated")


def test_chunked_triton_equals_recurrent_triton():
    """The chunked prefill kernel against the decode kernel stepped token by token, from the same
    initial states: equal up to fp32 rounding, outputs and final states."""
    num_k_heads, num_v_heads, head_k, head_v = 2, 4, 32, 16
    lengths = [1, 70]
    q, k, v, g, beta = gdn_inputs(lengths, num_k_heads, num_v_heads, head_k, head_v)
    start_state = initial_state([True, True], num_v_heads, head_k, head_v)
    chunked_state = start_state.clone()
    chunked = impl("gated_delta_rule", "triton")(
        q, k, v, g, beta, cu_seqlens(lengths), chunked_state, torch.ones(2, dtype=torch.bool,
                                                                          device=DEVICE)
    )
    decode = impl("gated_delta_rule_decode", "triton")
    starts = cu_seqlens(lengths).tolist()
    for seq in range(len(lengths)):
        state = start_state[seq : seq + 1].clone()
        for t in range(starts[seq], starts[seq + 1]):
            step = decode(q[t : t + 1], k[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1],
                          state)
            assert_close(chunked[t : t + 1], step, torch.float32, "accumulated")
        assert_close(chunked_state[seq : seq + 1], state, torch.float32, "accumulated")


def state_cache_rows(num_rows, num_v_heads, head_k, head_v, dtype, value_major=False):
    """A host's state cache: rows [HV, K, V] in pages wider than one state (vLLM's pages also hold
    the conv state), in ``dtype``; ``value_major``: each head's state stored as [V, K] (SGLang's pool),
    the rows the transposed view of it."""
    state_size = num_v_heads * head_k * head_v
    pages = rand(num_rows, state_size + 40, scale=0.5).to(dtype)
    if value_major:
        return pages, pages[:, :state_size].unflatten(1, (num_v_heads, head_v, head_k)).transpose(-1, -2)
    return pages, pages[:, :state_size].unflatten(1, (num_v_heads, head_k, head_v))


@pytest.mark.parametrize("op", ["gated_delta_rule", "gated_delta_rule_decode"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("value_major", [False, True], ids=["k-by-v", "v-by-k"])
def test_state_slots_read_and_write_rows_of_a_cache(op, state_dtype, value_major):
    """With ``state_slots`` each sequence's state is a row of a host's cache, read and written in
    place in the cache's dtype and layout: the Triton kernels equal the reference, rows of no
    sequence keep their bytes (the page tails too)."""
    num_k_heads, num_v_heads, head_k, head_v = 2, 4, 32, 16
    prefill = op == "gated_delta_rule"
    lengths = LENGTHS if prefill else [1] * 4
    slots = torch.tensor([5, 0, 3, 6], dtype=torch.int32, device=DEVICE)
    inputs = gdn_inputs(lengths, num_k_heads, num_v_heads, head_k, head_v)
    pages, cache = state_cache_rows(8, num_v_heads, head_k, head_v, state_dtype, value_major)
    expected_pages = pages.clone()
    expected_cache = expected_pages.as_strided(cache.shape, cache.stride())
    extra = (cu_seqlens(lengths), torch.tensor(HAS_INITIAL, device=DEVICE)) if prefill else ()
    expected = impl(op, "torch")(*inputs, *extra[:1], expected_cache, *extra[1:], True, slots)
    out = impl(op, "triton")(*inputs, *extra[:1], cache, *extra[1:], True, slots)
    assert_close(out, expected, torch.float32, "accumulated")
    assert_close(cache[slots.long()], expected_cache[slots.long()], state_dtype, "accumulated")
    untouched = torch.ones(8, dtype=torch.bool, device=DEVICE)
    untouched[slots.long()] = False
    assert torch.equal(pages[untouched], expected_pages[untouched])
    assert torch.equal(pages[:, cache[0].numel():], expected_pages[:, cache[0].numel():])
    assert cache[0].is_contiguous() != value_major


@pytest.mark.gpu
def test_chunked_rule_reuses_one_compiled_variant_across_batches():
    """The sequence count and the offset of a batch's slots and flags in the host's tensors (vLLM
    slices the decodes off the front) change every step; neither may compile another variant of the
    chunked form's kernels mid-serving."""
    num_k_heads, num_v_heads, head_k, head_v = 2, 4, 32, 16
    _, cache = state_cache_rows(64, num_v_heads, head_k, head_v, torch.float32)
    slots = torch.arange(64, dtype=torch.int32, device=DEVICE)
    has_initial = torch.ones(64, dtype=torch.bool, device=DEVICE)

    def prefill(first: int, lengths: list[int]) -> None:
        rows = slice(first, first + len(lengths))
        inputs = gdn_inputs(lengths, num_k_heads, num_v_heads, head_k, head_v, torch.bfloat16)
        impl("gated_delta_rule", "triton")(*inputs, cu_seqlens(lengths), cache, has_initial[rows], True,
                                           slots[rows])

    def variants() -> int:
        return compiled_variants(gated_delta._gated_delta_chunk_prepare_kernel,
                                 gated_delta._gated_delta_chunk_state_kernel)

    prefill(0, [16])
    compiled = variants()
    for first, lengths in [(1, [16]), (3, [1, 17, 64]), (5, [1] * 16), (0, [100] * 17), (7, [130])]:
        prefill(first, lengths)
    assert variants() == compiled


def hf_delta_rule_functions():
    """HF's own torch functions, unwrapped from the decorator that may swap in FLA's kernels, called
    with q and k repeated to the value heads as Qwen3-Next's layer does before transformers 5.23
    (5.17's functions take equal head counts only; 5.23's also take them repeated)."""
    qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

    def with_heads_repeated(function):
        def call(q, k, v, **kwargs):
            repeat = v.shape[-2] // q.shape[-2]
            return function(q.repeat_interleave(repeat, dim=-2), k.repeat_interleave(repeat, dim=-2), v, **kwargs)
        return call

    return (
        with_heads_repeated(inspect.unwrap(qwen3_next.torch_recurrent_gated_delta_rule)),
        with_heads_repeated(inspect.unwrap(qwen3_next.torch_chunk_gated_delta_rule)),
    )


@pytest.mark.parametrize("hf_form", ["recurrent", "chunk"])
def test_gated_delta_rule_torch_matches_hf(hf_form):
    """Per sequence against HF's function of that form ([batch, L, H, D], initial_state,
    use_qk_l2norm_in_kernel=True as Qwen3-Next calls it), outputs and final states."""
    hf_function = dict(zip(["recurrent", "chunk"], hf_delta_rule_functions()))[hf_form]
    num_k_heads, num_v_heads, head_k, head_v = 2, 4, 32, 16
    q, k, v, g, beta = gdn_inputs(LENGTHS, num_k_heads, num_v_heads, head_k, head_v)
    state = initial_state(HAS_INITIAL, num_v_heads, head_k, head_v)
    start_state = state.clone()
    out = impl("gated_delta_rule", "torch")(
        q, k, v, g, beta, cu_seqlens(LENGTHS), state, torch.tensor(HAS_INITIAL, device=DEVICE)
    )
    starts = cu_seqlens(LENGTHS).tolist()
    for seq, initial in enumerate(HAS_INITIAL):
        tokens = slice(starts[seq], starts[seq + 1])
        expected, expected_state = hf_function(
            q[None, tokens], k[None, tokens], v[None, tokens], g=g[None, tokens],
            beta=beta[None, tokens], initial_state=start_state[seq : seq + 1] if initial else None,
            output_final_state=True, use_qk_l2norm_in_kernel=True,
        )
        assert_close(out[tokens], expected[0], torch.float32, "accumulated")
        assert_close(state[seq], expected_state[0], torch.float32, "accumulated")


def test_gated_delta_rule_decode_torch_matches_hf():
    hf_recurrent, _ = hf_delta_rule_functions()
    q, k, v, g, beta = gdn_inputs([1] * 3, 2, 4, 32, 16)
    state = initial_state([True] * 3, 4, 32, 16)
    expected, expected_state = hf_recurrent(
        q[:, None], k[:, None], v[:, None], g=g[:, None], beta=beta[:, None],
        initial_state=state.clone(), output_final_state=True, use_qk_l2norm_in_kernel=True,
    )
    out = impl("gated_delta_rule_decode", "torch")(q, k, v, g, beta, state)
    assert_close(out, expected[:, 0], torch.float32, "accumulated")
    assert_close(state, expected_state, torch.float32, "accumulated")


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_gated_delta_rule_rejects_bad_arguments(backend):
    prefill, decode = impl("gated_delta_rule", backend), impl("gated_delta_rule_decode", backend)
    q, k, v, g, beta = gdn_inputs([2, 1], 2, 4, 16, 16)
    state = initial_state([True, True], 4, 16, 16)
    lengths, has_initial = cu_seqlens([2, 1]), torch.tensor([True, False], device=DEVICE)
    with pytest.raises(ValueError, match="state has shape"):
        prefill(q, k, v, g, beta, lengths, state[:1], has_initial)
    with pytest.raises(ValueError, match="has_initial_state has shape"):
        prefill(q, k, v, g, beta, lengths, state, has_initial[:1])
    with pytest.raises(ValueError, match="beta has shape"):
        prefill(q, k, v, g, beta[:, :2], lengths, state, has_initial)
    with pytest.raises(ValueError, match="k has shape"):
        decode(q[:2], k[:2, :1], v[:2], g[:2], beta[:2], state)
    with pytest.raises(ValueError, match="3 value heads not a multiple of 2 key heads"):
        decode(q[:2], k[:2], v[:2, :3], g[:2, :3], beta[:2, :3], state[:, :3])
