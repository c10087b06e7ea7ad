"""The tuned tile tables: lookup rules, and the tables shipped in the package."""

import json

import torch

from atom_kernels import tuned
from atom_kernels.attention import attention_shape_key
from atom_kernels.moe import moe_shape_key

MOE_TILE_FIELDS = {"BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"}
ATTENTION_FIELDS = {"HEADS", "BLOCK_M", "BLOCK_N", "num_warps", "num_stages"}


def test_tuned_tables_pick_the_next_size_up_and_prefer_the_env_dir(tmp_path, monkeypatch):
    table = {"GPU X": {"shape": {"16": {"tile": 1}, "256": {"tile": 2}}}}
    (tmp_path / "fused_moe.json").write_text(json.dumps(table))
    monkeypatch.setenv("ATOM_TUNED_CONFIG_DIR", str(tmp_path))
    tuned.clear_cache()
    try:
        picks = [tuned.lookup("fused_moe", "GPU X", "shape", n) for n in (1, 16, 17, 256, 9999)]
        assert [p["tile"] for p in picks] == [1, 1, 2, 2, 2]
        assert tuned.lookup("fused_moe", "GPU X", "other shape", 16) is None
        assert tuned.lookup("fused_moe", "GPU Y", "shape", 16) is None
        assert tuned.tuned_config("fused_moe", "shape", 16, torch.device("cpu")) is None
    finally:
        monkeypatch.delenv("ATOM_TUNED_CONFIG_DIR")
        tuned.clear_cache()


def packaged(op: str) -> dict:
    return json.loads((tuned.PACKAGED_DIR / f"{op}.json").read_text())


def test_packaged_moe_tables_are_complete_for_the_benchmark_shapes():
    table = packaged("fused_moe")["NVIDIA H200"]
    for experts, hidden, inter, top_k in ((128, 2048, 768, 8), (64, 2048, 1408, 6)):
        by_size = table[moe_shape_key(experts, hidden, inter, top_k, torch.bfloat16)]
        assert {int(size) for size in by_size} >= {1, 256, 16384}
        for size, config in by_size.items():
            assert config["BLOCK_M"] in (16, 32, 64, 128), size
            for gemm in ("gate_up", "down"):
                assert set(config[gemm]) == MOE_TILE_FIELDS, (size, gemm)


def test_packaged_attention_tables_are_complete_for_the_benchmark_shapes():
    table = packaged("attention")["NVIDIA H200"]
    for group in (4, 8):  # Qwen3-8B, Qwen3-30B-A3B
        config = table[attention_shape_key(False, 128, 0, group, torch.bfloat16)]["0"]
        assert set(config) == ATTENTION_FIELDS
        assert config["BLOCK_M"] % config["HEADS"] == 0 and config["HEADS"] <= group
        # Extend keeps the built-in tiles: the tuned ones slow down extends with short queries
        # (see tuned/README.md).
        assert attention_shape_key(True, 128, 0, group, torch.bfloat16) not in table
