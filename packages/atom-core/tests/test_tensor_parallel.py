"""Tensor parallelism: each family's model split over 2 and 4 CPU processes (gloo) gives TP=1's logits.

Every rank builds the model under a TP group backed by torch.distributed, loads the full checkpoint
(each layer keeps its own slice), and runs the same batch; rank 0 returns logits and every rank its
parameter count. TP=4 puts fewer KV heads (2) than ranks, so KV heads are replicated; the vocab (499)
splits unevenly; an MXFP4 gpt-oss of three 32-value blocks of intermediate size splits inside a block
at both sizes, so its ranks' shares are padded to whole blocks (atom_core.layers.moe). The vLLM-level
TP=2 run is in atom-vllm's test_families_vllm.py.
"""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_hf_parity import atom_model

from atom_core.distributed import SINGLE_RANK, TPGroup, set_tp_group
from atom_core.layers.attention import standalone_batch
from atom_core.testing.mxfp4_checkpoints import write_mxfp4_checkpoint

ARCHITECTURES = [
    "LlamaForCausalLM",
    "MixtralForCausalLM",
    "Glm4MoeForCausalLM",
    "GptOssForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
]
MXFP4 = "GptOssForCausalLM-mxfp4"
LENGTHS = [7, 1, 23, 12]


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    input_ids = torch.randint(4, 499, (sum(LENGTHS),), generator=generator)
    positions = torch.cat([torch.arange(n) for n in LENGTHS])
    return input_ids, positions


def logits_and_param_count(model_dir: str, build=atom_model) -> tuple[torch.Tensor, int]:
    """``build(model_dir)``'s logits on :func:`batch` and its parameter count on this rank."""
    model = build(model_dir)
    input_ids, positions = batch()
    with torch.no_grad(), standalone_batch(LENGTHS):
        logits = model.compute_logits(model(input_ids, positions))
    return logits, sum(p.numel() for p in model.parameters())


def gloo_all_reduce(x: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(x)
    return x


def gloo_all_gather(x: torch.Tensor, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=dim)


def tp_worker(rank: int, world_size: int, init_file: str, model_dirs: list[str], out_dir: str,
              build=atom_model) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    set_tp_group(TPGroup(rank, world_size, gloo_all_reduce, gloo_all_gather))
    results = {}
    for model_dir in model_dirs:
        logits, count = logits_and_param_count(model_dir, build)
        results[model_dir] = (logits if rank == 0 else None, count)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    # Every rank's result is on disk once all reach the barrier. Then leave without tearing gloo
    # down: its teardown can abort a rank ("terminate called without an active exception",
    # SIGABRT) when the ranks exit at different times, as seen on a loaded 2-core CI machine.
    dist.barrier()
    os._exit(0)


@pytest.fixture(scope="module")
def model_dirs(tiny_model_dir, tmp_path_factory):
    dirs = {arch: tiny_model_dir(arch) for arch in ARCHITECTURES}
    source = tiny_model_dir("GptOssForCausalLM", hidden_size=128, intermediate_size=96)
    dirs[MXFP4] = write_mxfp4_checkpoint(source, str(tmp_path_factory.mktemp("mxfp4")))
    return dirs


@pytest.fixture(scope="module", params=[2, 4])
def tp_run(request, model_dirs, tmp_path_factory):
    """Run all architectures once at this TP size; per rank: {model_dir: (logits | None, count)}."""
    world_size = request.param
    out_dir = tmp_path_factory.mktemp(f"tp{world_size}")
    return world_size, run_tp(world_size, list(model_dirs.values()), out_dir)


def run_tp(world_size: int, model_dirs: list[str], out_dir, build=atom_model) -> list[dict]:
    """Each rank's {model_dir: (logits | None, count)} of ``build``'s models at this TP size."""
    mp.spawn(tp_worker, args=(world_size, str(out_dir / "init"), model_dirs, str(out_dir), build),
             nprocs=world_size, join=True)
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(world_size)]


@pytest.mark.parametrize("architecture", [*ARCHITECTURES, MXFP4])
def test_tp_matches_single_rank(tp_run, model_dirs, architecture):
    world_size, ranks = tp_run
    assert_tp_matches_single_rank(world_size, ranks, model_dirs[architecture])


def assert_tp_matches_single_rank(world_size: int, ranks: list[dict], model_dir: str,
                                  build=atom_model) -> None:
    set_tp_group(SINGLE_RANK)
    expected, full_count = logits_and_param_count(model_dir, build)
    logits = ranks[0][model_dir][0]
    assert logits.shape == expected.shape
    rel = (logits - expected).norm() / expected.norm()
    assert rel < 1e-5, f"TP={world_size} vs TP=1: relative error {rel:.2e}"
    # Each rank really holds a slice: far fewer parameters than the whole model.
    for rank, result in enumerate(ranks):
        held = result[model_dir][1]
        assert held < 0.75 * full_count, f"rank {rank} holds {held} of {full_count} parameters"
