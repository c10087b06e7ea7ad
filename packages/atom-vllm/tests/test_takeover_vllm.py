"""Installing ATOM never breaks a vLLM server that runs without it (real vLLM, CPU, tiny models).

Configurations ATOM does not support are handed back: vLLM's own model and attention serve, one log
line says why, and the outcome is vLLM alone's — the same greedy tokens, or, where vLLM alone cannot
serve the configuration on this machine either (online FP8 on a CPU without AMX), the same error. The
configurations ATOM serves, it serves at parity with HF transformers: linear and YaRN rope (a prompt
past ``max_position_embeddings``), prompt embeddings, prompt logprobs, and a token id past the
vocabulary in one prompt (answered, and the engine serves the next ones unharmed).

The cells and their outcomes are printed as a table at the end of the module (docs/takeover.md
lists them).
"""

import gzip
import json
import math
from pathlib import Path

import pytest
import torch
from transformers import DeepseekV3Config
from vllm.engine.arg_utils import EngineArgs
from vllm_testing import (
    VllmRunFailed,
    assert_atom_served,
    error_line,
    hf_greedy,
    needs_torchvision,
    prompts,
    run_vllm,
    run_with_and_without_atom,
    tokens_of,
)

from atom_core.hosting.takeover import EXPERT_PARALLEL_NOTE, MXFP4_OPT_IN_REASON
from atom_core.models import SUPPORTED_ARCHITECTURES
from atom_core.testing.fp8_checkpoints import (
    TINY_FP8_OVERRIDES,
    write_block_fp8_checkpoint,
    write_fp8_checkpoint,
    write_tiny_fp8_checkpoint,
)
from atom_core.testing.hf_classes import hf_reference_model
from atom_core.testing.tiny_models import VOCAB_SIZE
from atom_vllm.config_translation import takeover_decision
from atom_vllm.version import vllm_release

pytestmark = pytest.mark.vllm

MAX_TOKENS = 12
BF16 = {"dtype": "bfloat16"}
TABLE: list[tuple[str, str, str]] = []  # (cell, who served, outcome)


@pytest.fixture(scope="module", autouse=True)
def print_table():
    yield
    width = max((len(cell) for cell, _, _ in TABLE), default=4)
    print("\n| cell | served by | outcome |\n|---|---|---|")
    for cell, served, outcome in TABLE:
        print(f"| {cell:<{width}} | {served} | {outcome} |")


def rope(rope_type: str) -> dict:
    return {"rope_type": rope_type, "factor": 2.0, "rope_theta": 10000.0}


def write_quark_fp8_checkpoint(model: str, out_dir: str) -> str:
    """A Quark W8A8 FP8 checkpoint (per-tensor, static inputs): a Quark variant ATOM does not serve."""
    import json
    import os

    fp8 = write_fp8_checkpoint(model, out_dir, "fp8-tensor-static")
    spec = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False, "symmetric": True}
    with open(os.path.join(fp8, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {
        "quant_method": "quark", "export": {"kv_cache_group": [], "pack_method": "reorder"},
        "global_quant_config": {"weight": spec, "input_tensors": spec, "output_tensors": None, "bias": None},
        "layer_quant_config": {}, "layer_type_quant_config": {}, "exclude": ["lm_head"],
    }
    with open(os.path.join(fp8, "config.json"), "w") as f:
        json.dump(config, f)
    return fp8


HAND_BACK_CELLS = {
    # cell: (architecture, tiny-model overrides, LLM kwargs, checkpoint writer, reason in the log line)
    "dynamic rope": ("LlamaForCausalLM", {"rope_parameters": rope("dynamic")},
                     {}, None, "rope type 'dynamic' is not supported"),
    "online quantization fp8": ("Qwen3ForCausalLM", {}, {"quantization": "fp8", **BF16}, None,
                                "online quantization 'fp8' of an unquantized checkpoint is not supported"),
    "model impl transformers": ("Qwen3ForCausalLM", {}, {"model_impl": "transformers"}, None,
                                "--model-impl transformers asks for vLLM's transformers implementation"),
    "Quark FP8": ("Qwen3ForCausalLM", TINY_FP8_OVERRIDES["Qwen3ForCausalLM"], BF16, write_quark_fp8_checkpoint,
                  "quark global_quant_config.weight.dtype 'fp8_e4m3' is not supported (ATOM serves MXFP4: fp4 "
                  "per_group of 32 with e8m0 scales, static weights and dynamic activations)"),
}


@pytest.mark.parametrize("cell", HAND_BACK_CELLS)
def test_handed_back_cells_end_as_vllm_alone(cell, tiny_model_dir, tmp_path):
    architecture, overrides, llm_kwargs, write, reason = HAND_BACK_CELLS[cell]
    model = tiny_model_dir(architecture, **overrides)
    if write is not None:
        model = write(model, str(tmp_path / "checkpoint"))
    with_atom, alone = run_with_and_without_atom(model, [prompts(5, 19)], MAX_TOKENS, llm_kwargs)
    line = f"INFO atom: ATOM hands {architecture} back to vLLM: {reason}"
    if isinstance(alone, VllmRunFailed):
        # vLLM alone cannot serve it here: ATOM handed back, and vLLM stopped on the same error.
        assert isinstance(with_atom, VllmRunFailed), "ATOM served what vLLM alone could not"
        assert line in with_atom.log
        assert error_line(with_atom) == error_line(alone)
        TABLE.append((cell, "vLLM (handed back)", f"both stop: {error_line(alone)[:80]}"))
        return
    assert not isinstance(with_atom, VllmRunFailed), f"vLLM alone serves, with ATOM:\n{with_atom}"
    assert line in with_atom["log"]
    # vLLM's attention too (ATOMPlatform logs this line where it picks ATOM's backend).
    assert "INFO atom: Use atom attention backend" not in with_atom["log"]
    assert with_atom["served_by"]["model_class"].startswith("vllm.model_executor.models.")
    assert tokens_of(with_atom) == tokens_of(alone)
    TABLE.append((cell, "vLLM (handed back)", "tokens equal vLLM alone's"))


def test_lora_is_handed_back_and_serves_as_hf(tiny_model_dir):
    model = tiny_model_dir("Qwen3ForCausalLM")
    phase = prompts(5, 19)
    result = run_vllm(model, [phase], MAX_TOKENS, llm_kwargs={"enable_lora": True, "max_lora_rank": 8})
    assert "INFO atom: ATOM hands Qwen3ForCausalLM back to vLLM: LoRA is not supported" in result["log"]
    assert result["served_by"]["model_class"] == "vllm.model_executor.models.qwen3.Qwen3ForCausalLM"
    assert result["served_by"]["attention_impls"] == [
        "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackendImpl"]
    assert tokens_of(result) == hf_greedy(model, phase, MAX_TOKENS)
    TABLE.append(("LoRA enabled", "vLLM (handed back)", "tokens equal HF's"))


def test_strict_takeover_refuses_at_start_naming_the_reason(tiny_model_dir):
    with pytest.raises(VllmRunFailed) as failed:
        run_vllm(tiny_model_dir("Qwen3ForCausalLM"), [prompts(5)], MAX_TOKENS,
                 env={"ATOM_STRICT_TAKEOVER": "1"}, llm_kwargs={"enable_lora": True, "max_lora_rank": 8})
    assert ("TakeoverRefused: ATOM hands Qwen3ForCausalLM back to vLLM: LoRA is not supported. "
            "ATOM_STRICT_TAKEOVER=1 forbids handing back") in failed.value.log
    TABLE.append(("LoRA enabled, ATOM_STRICT_TAKEOVER=1", "nobody", "start-up error naming the reason"))


def hf_prompt_logprobs(model_dir: str, prompt: list[int]) -> list[float]:
    hf = hf_reference_model(model_dir)
    with torch.no_grad():
        logprobs = hf(torch.tensor([prompt])).logits[0].log_softmax(-1)
    return logprobs[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0].tolist()


def test_linear_rope_with_prompt_logprobs_matches_hf(tiny_model_dir):
    model = tiny_model_dir("LlamaForCausalLM", rope_parameters=rope("linear"))
    phase = prompts(5, 19)
    result = run_vllm(model, [phase], MAX_TOKENS, prompt_logprobs=True)
    assert_atom_served(result)
    assert tokens_of(result) == hf_greedy(model, phase, MAX_TOKENS)
    for output, prompt in zip(result["phases"][0], phase):
        expected = hf_prompt_logprobs(model, prompt)
        assert all(math.isclose(a, b, abs_tol=1e-3) for a, b in zip(output["prompt_logprobs"], expected))
    TABLE.append(("linear rope, prompt logprobs", "ATOM", "tokens and prompt logprobs equal HF's"))


def test_yarn_long_prompt_and_an_id_past_the_vocabulary(tiny_model_dir):
    """A 150-token prompt under YaRN with max_position_embeddings 64 (vLLM allows 64 x 4); first, a
    prompt holding id 499 of a 499-row vocabulary, which vLLM lets through: answered, and the next
    requests are served as HF serves them."""
    model = tiny_model_dir("Qwen3ForCausalLM", max_position_embeddings=64, rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0})
    # vLLM 0.26 lets the id through to the model; 0.32 refuses such a request itself.
    out_of_vocabulary = [[7, VOCAB_SIZE, 9]] if vllm_release() < (0, 32) else []
    phase = prompts(150, 6)
    phases = [out_of_vocabulary, phase] if out_of_vocabulary else [phase]
    result = run_vllm(model, phases, MAX_TOKENS, llm_kwargs={"max_model_len": 256})
    assert_atom_served(result)
    assert all(len(o["tokens"]) == MAX_TOKENS for o in result["phases"][0])
    assert tokens_of(result)[len(out_of_vocabulary):] == hf_greedy(model, phase, MAX_TOKENS)
    TABLE.append(("YaRN, 150-token prompt past max_position_embeddings 64", "ATOM", "tokens equal HF's"))
    TABLE.append((f"token id {VOCAB_SIZE} of a {VOCAB_SIZE}-row vocabulary", "ATOM",
                  "answered; later requests equal HF's"))


def test_prompt_embeds_match_hf(tiny_model_dir):
    model = tiny_model_dir("Qwen3ForCausalLM")
    phase = prompts(5, 19)
    result = run_vllm(model, [phase], MAX_TOKENS, llm_kwargs={"enable_prompt_embeds": True},
                      prompt_embeds=True)
    assert_atom_served(result)
    assert tokens_of(result) == hf_greedy(model, phase, MAX_TOKENS)
    TABLE.append(("prompt embeds", "ATOM", "tokens equal HF's for the same ids"))


GRID = {
    # column: (checkpoint writer or None, EngineArgs settings, the reason ATOM hands back for, or None)
    "bf16": (None, BF16, None),
    "block-FP8 checkpoint": (lambda src, out: write_block_fp8_checkpoint(src, out), BF16, None),
    "quantization=fp8": (None, {"quantization": "fp8", **BF16},
                         "online quantization 'fp8' of an unquantized checkpoint is not supported"),
    "LoRA": (None, {"enable_lora": True, **BF16}, "LoRA is not supported"),
}


@pytest.mark.parametrize("architecture", sorted(a for a, entry in SUPPORTED_ARCHITECTURES.items()
                                                 if not entry.vision_language))
def test_decision_for_each_family_from_vllm_config(architecture, tiny_model_dir, tmp_path):
    """What the glue reads from vLLM's own config for every family: the checkpoint's quantization,
    the requested one, LoRA (no engine start: the cells above run the engine)."""
    source = tiny_model_dir(architecture)
    for column, (write, settings, reason) in GRID.items():
        model = source if write is None else write(source, str(tmp_path / column))
        decision = takeover_decision(EngineArgs(model=model, max_model_len=256, **settings).create_engine_config())
        assert decision.reasons == (() if reason is None else (reason,)), column


# Hub checkpoints' config files as published (atom-core's test data; sources beside it), what vLLM
# resolves their quantization to, and why ATOM hands back those it does not serve.
PUBLISHED = json.loads(gzip.decompress(
    (Path(__file__).parents[2] / "atom-core/tests/data/published_checkpoints.json.gz").read_bytes()))
PUBLISHED_QUANTIZATION = {"qwen3-30b-a3b-fp8": "fp8", "deepseek-v3": "fp8", "gpt-oss-20b": "gpt_oss_mxfp4",
                          "gpt-oss-120b": "gpt_oss_mxfp4", "qwen3-32b-fp8": "fp8", "qwen3-235b-a22b-fp8": "fp8",
                          "kimi-k2-instruct": "fp8", "deepseek-v3.2": "fp8",
                          "llama-3.1-70b-instruct-fp8": "modelopt", "deepseek-v3.1-nvfp4": "modelopt_fp4"}
PUBLISHED_HANDED_BACK = {
    "gpt-oss-20b": MXFP4_OPT_IN_REASON, "gpt-oss-120b": MXFP4_OPT_IN_REASON,
    "deepseek-v3.2": "ATOM has no implementation of DeepseekV32ForCausalLM",
    "qwen3-vl-8b-instruct": "ATOM has no implementation of Qwen3VLForConditionalGeneration",
    "llama-3.1-70b-instruct-fp8": "quantization 'modelopt' is not supported",
    "deepseek-v3.1-nvfp4": "quantization 'modelopt_fp4' is not supported"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=needs_torchvision)
                                  if "vision_config" in files["config.json"] else name
                                  for name, files in sorted(PUBLISHED.items())])
def test_published_configs_decided_from_vllm_config(name, tmp_path, monkeypatch):
    """Each published checkpoint's config files through vLLM's own config reading (no weights, no
    tokenizer): ATOM serves it, or hands it back with its reason (gpt-oss's MXFP4 experts are
    opt-in), as atom-core's test_takeover.py decides. ModelOpt checkpoints keep their quantization
    in hf_quant_config.json, which vLLM reads."""
    monkeypatch.delenv("ATOM_SERVE_MXFP4", raising=False)
    # vLLM reads kimi_k2 (and, where transformers lacks it, deepseek_v32) as DeepseekV3Config and sets
    # that class's model_type to it, for the whole process: later tiny DeepSeek-V3 checkpoints of this
    # test process would then be saved without HF's expert renaming. Restored at teardown.
    monkeypatch.setattr(DeepseekV3Config, "model_type", DeepseekV3Config.model_type)
    for file_name, content in PUBLISHED[name].items():
        (tmp_path / file_name).write_text(json.dumps(content))
    config = EngineArgs(model=str(tmp_path), max_model_len=256, skip_tokenizer_init=True,
                        **BF16).create_engine_config()
    assert config.model_config.quantization == PUBLISHED_QUANTIZATION.get(name)
    reason = PUBLISHED_HANDED_BACK.get(name)
    assert takeover_decision(config).reasons == (() if reason is None else (reason,))


@needs_torchvision
def test_vision_language_decision_reads_the_text_config(tiny_model_dir, tmp_path):
    """A vision-language model: ATOM decides on its language model's config (vLLM's hf_text_config)
    with the checkpoint's quantization_config, which sits beside it: a block-FP8 checkpoint is
    served, online quantization handed back as for text models."""
    model = tiny_model_dir("Qwen3_5ForConditionalGeneration")
    for checkpoint, settings, reasons in [
        (model, {}, ()),
        (write_block_fp8_checkpoint(model, str(tmp_path / "fp8")), {}, ()),
        (model, {"quantization": "fp8"}, ("online quantization 'fp8' of an unquantized checkpoint is not supported",)),
    ]:
        config = EngineArgs(model=checkpoint, max_model_len=256, **settings, **BF16).create_engine_config()
        assert takeover_decision(config).reasons == reasons


def test_parallel_layouts_read_from_vllm_config(tiny_model_dir):
    """vLLM's parallel settings as the glue reads them: data-parallel replicas of a MoE model (vLLM
    shards its experts across them) and context parallelism are handed back, a dense model's replicas
    served; expert parallelism in one replica is served with its note. (EPLB: vLLM's config refuses
    it without CUDA; the decision itself is in atom-core's test_takeover.py.)"""
    moe, dense = tiny_model_dir("Qwen3MoeForCausalLM"), tiny_model_dir("Qwen3ForCausalLM")

    def decision(model, **settings):
        return takeover_decision(EngineArgs(model=model, max_model_len=256, **settings).create_engine_config())

    assert decision(moe, data_parallel_size=2).reasons == (
        "experts sharded across 2 data-parallel replicas are not supported "
        "(ATOM shards experts across the tensor-parallel ranks of one replica)",)
    assert decision(dense, data_parallel_size=2).atom_serves
    expert_parallel = decision(moe, tensor_parallel_size=2, enable_expert_parallel=True)
    assert expert_parallel.atom_serves and expert_parallel.notes == (EXPERT_PARALLEL_NOTE,)
    # Context parallelism: vLLM would refuse to start with ATOM's attention (its DCP needs the softmax
    # LSE from the backend, its PCP the backend's support), so the host serves. (From vLLM 0.27 the CPU
    # config refuses prefill context parallelism itself.)
    if vllm_release() < (0, 27):
        assert decision(dense, tensor_parallel_size=2, prefill_context_parallel_size=2).reasons == (
            "context parallelism (size 2) is not supported",)
    assert decision(dense, tensor_parallel_size=4, decode_context_parallel_size=2).reasons == (
        "context parallelism (size 2) is not supported",)


def test_block_fp8_experts_split_in_part_blocks_are_handed_back(tiny_model_dir, tmp_path):
    """A block-FP8 MoE whose experts would split across the TP ranks in part blocks (64 rows of
    32-row blocks, 16 a rank at TP 4): vLLM with --enable-expert-parallel keeps experts whole and
    serves it, so ATOM hands it back rather than fail at load; at TP 2 (one block a rank) it serves."""
    fp8 = write_tiny_fp8_checkpoint(tiny_model_dir, "Qwen3MoeForCausalLM", str(tmp_path / "fp8"), "fp8-block")

    def decision(tp: int):
        config = EngineArgs(model=fp8, max_model_len=256, tensor_parallel_size=tp, enable_expert_parallel=True,
                            **BF16).create_engine_config()
        return takeover_decision(config)

    assert decision(4).reasons == ("experts of 64 intermediate rows do not split across 4 tensor-parallel ranks "
                                   "in whole 32-row blocks of the checkpoint's scales",)
    assert decision(2).atom_serves
