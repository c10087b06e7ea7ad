"""The tuned tile tables: lookup rules, and the tables shipped in the package."""

import json

import torch
from kernel_testing import DEVICE, rand

from atom_kernels import moe, tuned
from atom_kernels.attention import attention_shape_key
from atom_kernels.moe import moe_shape_key

MOE_TILE_FIELDS = {"BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages"}
# Optional tile keys: split K, swapped operands, the plain gate/up form.
OPTIONAL_TILE_FIELDS = {"SPLIT_K", "SWAP_AB", "PLAIN"}
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
                assert set(config[gemm]) - OPTIONAL_TILE_FIELDS == MOE_TILE_FIELDS, (size, gemm)


def test_packaged_h100_moe_table_holds_the_block_fp8_qwen3_and_gpt_oss_moe_shapes():
    """The H100 runs (benchmarks/kernels/tune-report-h100.json): block-FP8 Qwen3-30B-A3B and
    DeepSeek-V3 experts, bf16 Qwen3-30B-A3B and gpt-oss-20b; tiled configs whose K step fits the FP8
    scale block."""
    table = packaged("fused_moe")["NVIDIA H100 80GB HBM3"]
    shapes = [((128, 2048, 768, 8), torch.float8_e4m3fn), ((256, 7168, 2048, 8), torch.float8_e4m3fn),
              ((128, 2048, 768, 8), torch.bfloat16), ((32, 2880, 2880, 4), torch.bfloat16)]
    assert set(table) == {moe_shape_key(*dims, dtype) for dims, dtype in shapes}
    for key, by_size in table.items():
        assert {int(size) for size in by_size} >= {1, 4096}, key
        for size, config in by_size.items():
            assert config["BLOCK_M"] in (16, 32, 64, 128), (key, size)
            for gemm in ("gate_up", "down"):
                assert set(config[gemm]) - OPTIONAL_TILE_FIELDS == MOE_TILE_FIELDS, (key, size, gemm)
                if "float8" in key:
                    assert 128 % config[gemm]["BLOCK_K"] == 0, (key, size, gemm)


def test_packaged_mxfp4_moe_tables_hold_tiled_or_matrix_vector_configs():
    """gpt-oss's MXFP4 experts: a tiled config (BLOCK_M, tiles, an optional SPLIT_K) or, at a few
    tokens, the matrix-vector path's ({"GEMV": true}, BLOCK_N / BLOCK_K / num_warps per GEMM)."""
    table = packaged("fused_moe")["NVIDIA H200"]
    for experts in (32, 128):  # gpt-oss-20b, gpt-oss-120b
        by_size = table[moe_shape_key(experts, 2880, 2880, 4, torch.uint8)]
        assert {int(size) for size in by_size} >= {1, 16, 16384}
        for size, config in by_size.items():
            if config.get("GEMV"):
                assert int(size) <= 16, size
                for gemm in ("gate_up", "down"):
                    assert set(config[gemm]) == {"BLOCK_N", "BLOCK_K", "num_warps"}, (size, gemm)
                    assert config[gemm]["BLOCK_K"] % 32 == 0
                continue
            assert config["BLOCK_M"] in (16, 32, 64, 128), size
            for gemm in ("gate_up", "down"):  # MXFP4 tiles have no swapped form (launch_moe_gemm)
                assert set(config[gemm]) - {"SPLIT_K"} == MOE_TILE_FIELDS, (size, gemm)


def test_packaged_attention_tables_are_complete_for_the_benchmark_shapes():
    table = packaged("attention")["NVIDIA H200"]
    for group in (4, 8):  # Qwen3-8B, Qwen3-30B-A3B
        config = table[attention_shape_key(False, 128, 0, group, torch.bfloat16)]["0"]
        assert set(config) == ATTENTION_FIELDS
        assert config["BLOCK_M"] % config["HEADS"] == 0 and config["HEADS"] <= group
        # Extend keeps the built-in tiles: the tuned ones slow down extends with short queries
        # (see tuned/README.md).
        assert attention_shape_key(True, 128, 0, group, torch.bfloat16) not in table


FP8 = torch.float8_e4m3fn
# The key benchmarks/kernels/tune_kernels.py writes Qwen3-30B-A3B-FP8's experts under.
QWEN3_30B_FP8_KEY = "E=128,D=2048,I=768,top_k=8,dtype=float8_e4m3fn"


def test_fp8_moe_entries_sit_beside_the_packaged_bf16_ones(tmp_path, monkeypatch):
    """A tuning run's FP8 entries (in ATOM_TUNED_CONFIG_DIR) are found under their own key, and the
    packaged bf16 entries of the same GPU and shape stay found."""
    assert moe_shape_key(128, 2048, 768, 8, FP8) == QWEN3_30B_FP8_KEY
    tiles = {"BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 4}
    config = {"BLOCK_M": 16, "gate_up": tiles, "down": tiles}
    table = {"NVIDIA H200": {QWEN3_30B_FP8_KEY: {"16": config}}}
    (tmp_path / "fused_moe.json").write_text(json.dumps(table))
    monkeypatch.setenv("ATOM_TUNED_CONFIG_DIR", str(tmp_path))
    tuned.clear_cache()
    try:
        assert tuned.lookup("fused_moe", "NVIDIA H200", QWEN3_30B_FP8_KEY, 1) == config
        bf16_key = moe_shape_key(128, 2048, 768, 8, torch.bfloat16)
        bf16_entry = packaged("fused_moe")["NVIDIA H200"][bf16_key]["1"]
        assert tuned.lookup("fused_moe", "NVIDIA H200", bf16_key, 1) == bf16_entry
    finally:
        monkeypatch.delenv("ATOM_TUNED_CONFIG_DIR")
        tuned.clear_cache()


def test_fused_moe_looks_fp8_experts_up_under_the_fp8_key(monkeypatch):
    """The Triton fused MoE asks the tables for block-FP8 experts under moe_shape_key with the
    weights' dtype, the key the tuner writes them under."""
    asked = []
    monkeypatch.setattr(moe, "tuned_config", lambda op, key, size, device: asked.append(key))
    experts, hidden, inter, top_k, block = 4, 64, 32, 2, 32
    w13 = rand(experts, 2 * inter, hidden).to(FP8)
    w2 = rand(experts, hidden, inter).to(FP8)
    scales = {
        "w13_scale": torch.full((experts, 2 * inter // block, hidden // block), 0.1, device=DEVICE),
        "w2_scale": torch.full((experts, hidden // block, inter // block), 0.1, device=DEVICE),
    }
    weights, ids = torch.topk(rand(3, experts).softmax(-1), top_k)
    x = rand(3, hidden, dtype=torch.bfloat16)
    moe.fused_moe_triton(x, w13, w2, weights, ids.to(torch.int32), **scales, block_size=block)
    assert asked == [moe_shape_key(experts, hidden, inter, top_k, FP8)]
    assert asked[0].endswith(",dtype=float8_e4m3fn")


def test_a_plain_entry_serves_other_layers_gated(monkeypatch):
    """A PLAIN entry looked up for a GELU layer with interleaved rows and biases."""
    tiles = {"BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4, "num_stages": 2}
    entry = {"BLOCK_M": 16, "gate_up": {**tiles, "PLAIN": 1}, "down": tiles}
    monkeypatch.setattr(moe, "tuned_config", lambda *_: entry)
    shapes = (4, 64, 64), (4, 64, 32), (3, 64), (4, 64), (4, 64)
    w13, w2, x, b13, b2 = (rand(*s, dtype=torch.bfloat16, scale=0.1) for s in shapes)
    weights, ids = torch.topk(rand(3, 4).softmax(-1), 2)
    args = x, w13, w2, weights, ids.int()
    options = {"activation": "gelu", "interleaved": True, "w13_bias": b13, "w2_bias": b2}
    got, want = moe.fused_moe_triton(*args, **options), moe.fused_moe_torch(*args, **options)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
