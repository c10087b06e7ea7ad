"""ATOM's MLA backend for vLLM, engine not run: batch and capture metadata, cache layout, and
which backend ATOMPlatform picks for MLA layers."""

import re

import pytest
import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata
from vllm.v1.attention.selector import AttentionSelectorConfig
from vllm.v1.kv_cache_interface import MLAAttentionSpec

import atom_kernels
from atom_vllm.attention.mla import ATOMMLABackend, ATOMMLAMetadataBuilder
from atom_vllm.platform import ATOMPlatform
from atom_vllm.register import MHA_BACKEND, MLA_BACKEND


def common_metadata(query_lens: list[int], seq_lens: list[int]) -> CommonAttentionMetadata:
    query_start_loc = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=query_start_loc,
        query_start_loc_cpu=query_start_loc,
        seq_lens=seq_lens_t,
        num_reqs=len(query_lens),
        num_actual_tokens=sum(query_lens),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_table_tensor=torch.arange(len(query_lens) * 4, dtype=torch.int32).view(-1, 4),
        slot_mapping=torch.arange(sum(query_lens)),
        seq_lens_cpu_upper_bound=seq_lens_t,
    )


def builder() -> ATOMMLAMetadataBuilder:
    spec = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    return ATOMMLAMetadataBuilder(spec, ["layer"], VllmConfig(), torch.device("cpu"))


def test_mixed_batch_splits_decodes_from_prefills_and_lists_their_contexts():
    # [2 decodes | an extend of 3 tokens over 7 cached | a fresh 4-token prompt]
    m = builder().build(0, common_metadata([1, 1, 3, 4], [9, 2, 10, 4]))
    assert (m.num_decodes, m.num_decode_tokens, m.num_prefills) == (2, 2, 2)
    assert m.decode_query_start_loc.tolist() == [0, 1, 2]
    assert m.decode_seq_lens.tolist() == [9, 2]
    assert m.prefill_query_start_loc.tolist() == [0, 3, 7]
    assert m.prefill_context_start_loc.tolist() == [0, 10, 14]
    assert m.context_requests.tolist() == [2] * 10 + [3] * 4
    assert m.context_positions.tolist() == list(range(10)) + list(range(4))


def test_short_extends_run_as_decodes_under_a_higher_threshold():
    # Under FA3, extends up to SHORT_EXTEND_TOKENS run as decodes; longer ones stay prefills.
    b = builder()
    b.reorder_batch_threshold = 16
    m = b.build(0, common_metadata([1, 16, 600], [9, 1024, 600]))
    assert (m.num_decodes, m.num_decode_tokens, m.decode_max_query_len, m.num_prefills) == (2, 17, 16, 1)
    assert m.decode_query_start_loc.tolist() == [0, 1, 17]
    assert m.prefill_query_start_loc.tolist() == [0, 600]
    single = b.build(0, common_metadata([1, 1], [5, 3]))
    assert (single.num_decodes, single.decode_max_query_len) == (2, 1)


def test_prefill_context_rows_are_worked_out_once_a_step():
    m = builder().build(0, common_metadata([1, 3, 4], [9, 10, 4]))  # block table rows [4i .. 4i+3]
    blocks, rows = m.context_rows(4)
    assert blocks.tolist() == [4] * 4 + [5] * 4 + [6] * 2 + [8] * 4
    assert rows.tolist() == [0, 1, 2, 3] * 2 + [0, 1] + [0, 1, 2, 3]
    assert m.context_rows(4)[0] is blocks


def test_decode_only_batch_has_no_prefill_metadata():
    m = builder().build(0, common_metadata([1, 1, 1], [5, 17, 2]))
    assert (m.num_decodes, m.num_prefills) == (3, 0)
    assert m.context_requests is None


def test_decode_graphs_need_capture_safe_gpu_kernels(monkeypatch):
    support = lambda: ATOMMLAMetadataBuilder.get_cudagraph_support(VllmConfig(), None)  # noqa: E731
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert support() == AttentionCGSupport.NEVER
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("ATOM_KERNEL_BACKEND", "ATOM_KERNEL_BACKEND_MLA_DECODE"):
        monkeypatch.delenv(name, raising=False)
    atom_kernels.reset_selection()
    try:
        assert support() == AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE  # Triton on CUDA
        monkeypatch.setenv("ATOM_KERNEL_BACKEND_MLA_DECODE", "torch")
        atom_kernels.reset_selection()
        assert support() == AttentionCGSupport.NEVER
    finally:
        monkeypatch.delenv("ATOM_KERNEL_BACKEND_MLA_DECODE")
        atom_kernels.reset_selection()


def test_cuda_graph_capture_is_for_single_token_decode_batches():
    # Capture dummies' one-token sequences: still decodes.
    m = builder().build_for_cudagraph_capture(common_metadata([1, 1, 1, 1], [1, 1, 1, 1]))
    assert (m.num_decodes, m.num_decode_tokens, m.num_prefills) == (4, 4, 0)
    with pytest.raises(ValueError, match="single-token decode"):
        builder().build_for_cudagraph_capture(common_metadata([1, 3], [5, 3]))


def test_cascade_attention_is_refused():
    with pytest.raises(NotImplementedError):
        builder().build(16, common_metadata([1], [20]))


def test_latent_cache_layout():
    assert ATOMMLABackend.is_mla()
    assert ATOMMLABackend.get_kv_cache_shape(10, 16, 1, 576) == (10, 16, 576)


def mla_selector(**overrides) -> AttentionSelectorConfig:
    # Blocks of 64: a size every vLLM MLA backend on CUDA takes (FlashMLA and its sparse variant
    # take only 64), so on a GPU the layers ATOM leaves to vLLM find a backend there.
    settings = dict(head_size=576, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=64, use_mla=True)
    return AttentionSelectorConfig(**{**settings, **overrides})


@pytest.fixture
def serving(monkeypatch, tiny_model_dir):
    """serving(architecture): the current vLLM config becomes a tiny DeepSeek checkpoint's, named
    ``architecture`` (the platform reads the name only)."""
    monkeypatch.delenv("ATOM_DISABLE_VLLM_PLUGIN_ATTENTION", raising=False)
    contexts = []

    def set_architecture(architecture: str) -> None:
        built = architecture if architecture.startswith("Deepseek") else "DeepseekV3ForCausalLM"
        args = EngineArgs(model=tiny_model_dir(built), dtype="float32", max_model_len=256)
        vllm_config = args.create_engine_config()
        vllm_config.model_config.model_arch_config.architectures = [architecture]
        contexts.append(set_current_vllm_config(vllm_config))
        contexts[-1].__enter__()

    yield set_architecture
    for context in reversed(contexts):
        context.__exit__(None, None, None)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8", "fp8_e4m3"])
@pytest.mark.parametrize("architecture", ["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"])
def test_platform_picks_atom_mla_for_atom_models(serving, architecture, kv_cache_dtype):
    serving(architecture)
    assert ATOMPlatform.get_attn_backend_cls(None, mla_selector(kv_cache_dtype=kv_cache_dtype)) == MLA_BACKEND


def assert_left_to_vllm(selector: AttentionSelectorConfig, cpu_error: str) -> None:
    """vLLM's platform picks an MLA backend of its own or, on a CPU without one, refuses."""
    try:
        chosen = ATOMPlatform.get_attn_backend_cls(None, selector)
    except NotImplementedError as refusal:
        assert not torch.cuda.is_available() and re.search(cpu_error, str(refusal)), refusal
    else:
        assert chosen not in (MLA_BACKEND, MHA_BACKEND)


@pytest.mark.parametrize("overrides", [{"kv_cache_dtype": "fp8_e5m2"}, {"use_sparse": True}],
                         ids=["fp8-e5m2-cache", "sparse"])
def test_platform_leaves_unsupported_mla_to_vllm(serving, overrides):
    serving("DeepseekV3ForCausalLM")
    assert_left_to_vllm(mla_selector(**overrides), "not supported on CPU")


def test_platform_leaves_mla_of_models_atom_does_not_implement_to_vllm(serving):
    # vLLM's own MLAAttention cannot run ATOM's impl.
    serving("KimiLinearForCausalLM")
    assert_left_to_vllm(mla_selector(), "MLA is not supported on CPU")


def test_platform_leaves_mla_to_vllm_when_atom_attention_is_disabled(serving, monkeypatch):
    serving("DeepseekV2ForCausalLM")
    monkeypatch.setenv("ATOM_DISABLE_VLLM_PLUGIN_ATTENTION", "1")
    assert_left_to_vllm(mla_selector(), "MLA is not supported on CPU")
