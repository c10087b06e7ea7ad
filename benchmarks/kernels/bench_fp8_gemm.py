"""GPU benchmark: ATOM's FP8 GEMMs against vLLM 0.26.0's block-FP8 linear path, layer by layer.

    python benchmarks/kernels/bench_fp8_gemm.py --out fp8-gemm.json [--models qwen3-8b,deepseek-v3]
        [--m 1,16,64,256,1024,4096] [--rep 25]

For every FP8 linear layer of Qwen3-8B, Qwen3-30B-A3B and DeepSeek-V3 at TP 1 (LAYERS: weight [N, K]
fp8 e4m3 as vLLM fuses it, one fp32 scale per 128 x 128 block, as the published FP8 checkpoints store
it) and each M (tokens), one row:

- block FP8, ATOM: ``atom_kernels.per_group_quant_fp8(x, 128)`` + ``atom_kernels.fp8_block_scaled_mm``;
- block FP8, vLLM: ``Fp8LinearMethod.apply`` on a layer that vLLM's ``Fp8LinearMethod`` built
  (``create_weights``, the weights copied in, ``process_weights_after_loading``) under the VllmConfig
  of a block-FP8 model (models/qwen3-8b-fp8.json), so vLLM picks its kernel and its activation
  quantisation as when it serves one. On Hopper with FlashInfer's ``fp8_blockscale_gemm_sm90`` and
  DeepGEMM (``vllm_fp8`` in the JSON says whether they are there) that is
  ``FlashInferFp8DeepGEMMDynamicBlockScaledKernel``: FlashInfer's swapAB GEMM on the bf16 input below
  32 tokens, DeepGEMM (after ``per_token_group_quant_fp8``) from 32, with the weights requantised to
  power-of-two (UE8M0) block scales at load; without them CUTLASS (``cutlass_scaled_mm``) or Triton
  (``w8a8_triton_block_scaled_mm``). Each row names the class and, for the dynamic one, the branch;
- per-token x per-channel FP8 (the library kernel candidate): ATOM's ``per_token_quant_fp8``, then
  ATOM's ``fp8_scaled_mm`` or ``torch._scaled_mm`` (a_scale [M, 1], b_scale [1, N], bf16 out). Both
  quantise with ATOM's kernel, so their ratio is the GEMMs'.

Times (microseconds) are ``bench_kernels.time_kernel``'s medians, replayed from a CUDA graph (the
headline ``*_us``) and eager (``*_eager_us``). Each output is checked against a fp32 reference, the
unquantised bf16 x times the dequantised weight: ``*_err`` = max |out - ref| / max |ref| (activation
quantisation error included). Ratios are ATOM / vLLM and ATOM / torch (< 1: ATOM faster). A path that
fails records its error in the row and the run goes on. DeepGEMM and FlashInfer compile a kernel on
first sight of a shape, in the numerics call before the timing; the JSON is rewritten after every
layer, so an interrupted run keeps what it measured. Writes --out (JSON) and the same name with .md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from bench_kernels import max_rel_diff, rand, time_kernel

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "mla"))
from bench_mla_decode import init_single_rank_distributed  # noqa: E402

BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn
BLOCK = 128
M_VALUES = (1, 16, 64, 256, 1024, 4096)
# The block-FP8 model whose VllmConfig vLLM's linear method is built under. The kernel vLLM picks
# depends on the layer's shape, dtypes and the GPU, not on which model this is (except DeepGEMM's
# Blackwell exclusion of qwen3_5 models).
CONFIG_MODEL = "qwen3-8b-fp8"


@dataclass(frozen=True)
class Layer:
    model: str
    name: str
    partitions: tuple[int, ...]  # output sizes vLLM fuses into this weight; N is their sum
    k: int

    @property
    def n(self) -> int:
        return sum(self.partitions)


# From the published config.json files: Qwen3-8B and Qwen3-30B-A3B as in benchmarks/models/; DeepSeek-V3
# hidden 7168, 128 heads, q_lora_rank 1536, kv_lora_rank 512, qk_nope/qk_rope/v head dims 128/64/128,
# intermediate 18432 (first 3 dense layers), one shared expert of moe_intermediate 2048. Fused as vLLM's
# model files fuse them (qkv, gate_up; DeepSeek's fused_qkv_a_proj = q_a_proj + kv_a_proj_with_mqa, the
# one vLLM runs; the two parts are listed too).
LAYERS = [
    Layer("qwen3-8b", "qkv_proj", (32 * 128, 8 * 128, 8 * 128), 4096),
    Layer("qwen3-8b", "o_proj", (4096,), 32 * 128),
    Layer("qwen3-8b", "gate_up_proj", (12288, 12288), 4096),
    Layer("qwen3-8b", "down_proj", (4096,), 12288),
    Layer("qwen3-30b-a3b", "qkv_proj", (32 * 128, 4 * 128, 4 * 128), 2048),
    Layer("qwen3-30b-a3b", "o_proj", (2048,), 32 * 128),
    Layer("deepseek-v3", "fused_qkv_a_proj", (1536, 512 + 64), 7168),
    Layer("deepseek-v3", "q_a_proj", (1536,), 7168),
    Layer("deepseek-v3", "kv_a_proj_with_mqa", (512 + 64,), 7168),
    Layer("deepseek-v3", "q_b_proj", (128 * (128 + 64),), 1536),
    Layer("deepseek-v3", "o_proj", (7168,), 128 * 128),
    Layer("deepseek-v3", "shared_experts.gate_up_proj", (2048, 2048), 7168),
    Layer("deepseek-v3", "shared_experts.down_proj", (7168,), 2048),
    Layer("deepseek-v3", "dense mlp.gate_up_proj", (18432, 18432), 7168),
    Layer("deepseek-v3", "dense mlp.down_proj", (7168,), 18432),
]

# (key prefix in a row, reference the output is checked against)
PATHS = (("atom", "block"), ("vllm", "block"), ("atom_channel", "channel"), ("torch_channel", "channel"))


def block_fp8_vllm_config():
    """The VllmConfig vLLM builds for a block-FP8 checkpoint (no weights, no tokenizer): it enables the
    ``quant_fp8`` custom op, as for every block-quantised model, and DeepGEMM reads its model type."""
    from vllm.engine.arg_utils import EngineArgs

    model_dir = Path(tempfile.mkdtemp(prefix="bench-fp8-gemm-"))
    (model_dir / "config.json").write_text((HERE.parent / "models" / f"{CONFIG_MODEL}.json").read_text())
    return EngineArgs(model=str(model_dir), skip_tokenizer_init=True, load_format="dummy", dtype="bfloat16",
                      max_model_len=2048).create_engine_config()


def vllm_fp8_environment(vllm_config) -> dict:
    """What vLLM's block-FP8 kernel choice depends on, on this machine."""
    from vllm.model_executor.layers.quantization.utils.w8a8_utils import cutlass_block_fp8_supported
    from vllm.utils.deep_gemm import is_deep_gemm_e8m0_used, is_deep_gemm_supported
    from vllm.utils.flashinfer import is_flashinfer_fp8_blockscale_gemm_supported

    return {
        "deep_gemm_supported": is_deep_gemm_supported(),
        "deep_gemm_e8m0": is_deep_gemm_e8m0_used(),
        "flashinfer_fp8_blockscale_gemm": is_flashinfer_fp8_blockscale_gemm_supported(),
        "cutlass_block_fp8": cutlass_block_fp8_supported(),
        "custom_ops": list(vllm_config.compilation_config.custom_ops),
    }


def vllm_block_fp8_linear(quant_config, layer: Layer, weight: torch.Tensor, weight_scale: torch.Tensor):
    """``(Fp8LinearMethod, module)`` for ``layer`` holding ``weight`` / ``weight_scale``, built as vLLM
    builds a linear layer of a block-FP8 model: under the model's default dtype (the kernel's output
    dtype) and on the GPU, then post-processed for the chosen kernel."""
    from vllm.model_executor.layers.quantization.fp8 import Fp8LinearMethod
    from vllm.utils.torch_utils import set_default_torch_dtype

    module = torch.nn.Module()
    with set_default_torch_dtype(BF16), weight.device:
        method = Fp8LinearMethod(quant_config)
        method.create_weights(module, layer.k, list(layer.partitions), layer.k, layer.n, BF16,
                              weight_loader=None)
    module.weight.data.copy_(weight)
    module.weight_scale_inv.data.copy_(weight_scale)
    method.process_weights_after_loading(module)
    return method, module


def vllm_kernel_name(method, m: int) -> str:
    name = type(method.fp8_linear).__name__
    if name == "FlashInferFp8DeepGEMMDynamicBlockScaledKernel":
        # vLLM's _dynamic_flashinfer_deepgemm_blockscale_gemm_impl branches on the token count.
        return f"{name} ({'FlashInfer swapAB' if m < 32 else 'DeepGEMM'})"
    return name


def describe(tensor: torch.Tensor) -> dict:
    return {"shape": list(tensor.shape), "stride": list(tensor.stride()), "dtype": str(tensor.dtype)}


def dequantize_blocks(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    n, k = weight.shape
    expanded = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:n, :k]
    return weight.float() * expanded


def error_text(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"[:500]


def measure(row: dict, who: str, fn, reference: torch.Tensor, rep: int) -> None:
    """Adds ``who``'s error against ``reference`` and its times to ``row``, or the error it raised."""
    try:
        # The first call also compiles (DeepGEMM, FlashInfer, Triton) outside the timing.
        row[f"{who}_err"] = max_rel_diff(fn(), reference)
        times = time_kernel(fn, rep)
    except Exception as error:  # noqa: BLE001  (a failing path is a row entry; the others go on)
        row[f"{who}_error"] = error_text(error)
        traceback.print_exc()
        return
    row[f"{who}_us"] = times["graph_us"]
    row[f"{who}_eager_us"] = times["eager_us"]
    row[f"{who}_tflops"] = 2 * row["m"] * row["n"] * row["k"] / (times["graph_us"] * 1e-6) / 1e12


def build_vllm_layer(quant_config, layer: Layer, weight: torch.Tensor, block_scale: torch.Tensor, info: dict):
    """vLLM's ``(method, module)``, or None with the reason in ``info``; ``info`` also records the kernel
    vLLM chose and the weight and scale layouts its post-processing left."""
    try:
        method, module = vllm_block_fp8_linear(quant_config, layer, weight, block_scale)
    except Exception as error:  # noqa: BLE001  (a vLLM path that cannot be built is a row, not the end of the run)
        info["vllm_error"] = error_text(error)
        traceback.print_exc()
        return None
    rewritten = module.weight.shape != weight.shape or not torch.equal(module.weight.view(torch.uint8),
                                                                       weight.view(torch.uint8))
    info["vllm_kernel"] = type(method.fp8_linear).__name__
    info["vllm_after_loading"] = {"weight": describe(module.weight),
                                  "weight_scale_inv": describe(module.weight_scale_inv),
                                  "weight_rewritten": rewritten}
    return method, module


def bench_layer(ak, quant_config, layer: Layer, m_values: list[int], rep: int) -> tuple[dict, list[dict]]:
    n, k = layer.n, layer.k
    weight = rand(n, k, dtype=FP8)
    block_scale = torch.rand(triton.cdiv(n, BLOCK), triton.cdiv(k, BLOCK), device="cuda") / 100 + 1e-3
    channel_scale = torch.rand(n, 1, device="cuda") / 100 + 1e-3
    dequantized = {"block": dequantize_blocks(weight, block_scale), "channel": weight.float() * channel_scale}
    info: dict = {"model": layer.model, "layer": layer.name, "partitions": list(layer.partitions), "k": k,
                  "weight": describe(weight), "weight_scale_inv": describe(block_scale)}
    vllm_layer = build_vllm_layer(quant_config, layer, weight, block_scale, info)

    rows = []
    for m in m_values:
        x = rand(m, k)
        references = {name: x.float() @ w.t() for name, w in dequantized.items()}

        def atom_block(x=x):
            xq, xs = ak.per_group_quant_fp8(x, BLOCK)
            return ak.fp8_block_scaled_mm(xq, weight, xs, block_scale, BF16, BLOCK)

        def vllm_block(x=x):
            method, module = vllm_layer
            return method.apply(module, x)

        def atom_channel(x=x):
            xq, xs = ak.per_token_quant_fp8(x)
            return ak.fp8_scaled_mm(xq, weight, xs, channel_scale, BF16)

        def torch_channel(x=x):
            xq, xs = ak.per_token_quant_fp8(x)
            return torch._scaled_mm(xq, weight.t(), scale_a=xs, scale_b=channel_scale.view(1, -1), out_dtype=BF16)

        functions = {"atom": atom_block, "vllm": vllm_block, "atom_channel": atom_channel,
                     "torch_channel": torch_channel}
        row = {"model": layer.model, "layer": layer.name, "n": n, "k": k, "m": m}
        if vllm_layer is None:
            row["vllm_error"] = info["vllm_error"]
            del functions["vllm"]
        else:
            row["vllm_kernel"] = vllm_kernel_name(vllm_layer[0], m)
        for who, reference in PATHS:
            if who in functions:
                measure(row, who, functions[who], references[reference], rep)
        if "atom_us" in row and "vllm_us" in row:
            row["ratio_atom_over_vllm"] = row["atom_us"] / row["vllm_us"]
        if "atom_channel_us" in row and "torch_channel_us" in row:
            row["ratio_atom_over_torch_channel"] = row["atom_channel_us"] / row["torch_channel_us"]
        rows.append(row)
        print(format_row(row), flush=True)
    return info, rows


def cell(row: dict, key: str, spec: str) -> str:
    if key in row:
        return format(row[key], spec)
    return "error" if f"{key.rsplit('_', 1)[0]}_error" in row else ""


def format_row(row: dict) -> str:
    return (f"| {row['model']} | {row['layer']} | {row['n']} | {row['k']} | {row['m']} | "
            f"{cell(row, 'atom_us', '.1f')} | {cell(row, 'vllm_us', '.1f')} | "
            f"{cell(row, 'ratio_atom_over_vllm', '.2f')} | {cell(row, 'atom_err', '.1e')} | "
            f"{cell(row, 'vllm_err', '.1e')} | {row.get('vllm_kernel', 'n/a')} | "
            f"{cell(row, 'atom_channel_us', '.1f')} | {cell(row, 'torch_channel_us', '.1f')} | "
            f"{cell(row, 'ratio_atom_over_torch_channel', '.2f')} | {cell(row, 'atom_channel_err', '.1e')} | "
            f"{cell(row, 'torch_channel_err', '.1e')} |")


TABLE_HEADER = (
    "| model | layer | N | K | M | ATOM block us | vLLM block us | ATOM / vLLM | ATOM err | vLLM err | vLLM kernel "
    "| ATOM channel us | torch._scaled_mm us | ATOM / torch | ATOM channel err | torch err |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def markdown(report: dict) -> str:
    versions = report["versions"]
    lines = [f"# FP8 GEMMs on {report['device']} (vLLM {versions['vllm']}, torch {versions['torch']}, "
             f"triton {versions['triton']})", "",
             "Block FP8: ATOM per_group_quant_fp8 + fp8_block_scaled_mm against vLLM's Fp8LinearMethod.apply "
             "(its own activation quantisation). Per-channel: ATOM per_token_quant_fp8, then ATOM "
             "fp8_scaled_mm or torch._scaled_mm. Medians of CUDA-graph replays; err = max |out - ref| / "
             "max |ref| against the fp32 product of the bf16 input and the dequantised weight.", "",
             f"vLLM's FP8 environment: `{json.dumps(report['vllm_fp8'])}`", "", TABLE_HEADER]
    lines += [format_row(row) for row in report["results"]]
    summary = {key: "n/a" if value is None else f"{value:.2f}" for key, value in report["geomean"].items()}
    lines += ["", f"Geometric means: ATOM / vLLM (block) {summary['atom_over_vllm']}, "
                  f"ATOM / torch (per channel) {summary['atom_over_torch_channel']}."]
    return "\n".join(lines) + "\n"


def write(report: dict, out: Path) -> None:
    results = report["results"]
    report["geomean"] = {
        "atom_over_vllm": geomean([r["ratio_atom_over_vllm"] for r in results if "ratio_atom_over_vllm" in r]),
        "atom_over_torch_channel": geomean([r["ratio_atom_over_torch_channel"] for r in results
                                            if "ratio_atom_over_torch_channel" in r]),
    }
    out.write_text(json.dumps(report, indent=1, default=str))
    out.with_suffix(".md").write_text(markdown(report))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("fp8-gemm.json"))
    parser.add_argument("--models", default=",".join(dict.fromkeys(layer.model for layer in LAYERS)),
                        help="comma-separated models of LAYERS")
    parser.add_argument("--m", default=",".join(map(str, M_VALUES)), help="comma-separated token counts")
    parser.add_argument("--rep", type=int, default=25, help="milliseconds of timed repetitions per kernel")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_fp8_gemm needs a CUDA GPU")
    # vLLM's own platform and kernel choice: the ATOM plugin stays out (this script calls atom_kernels
    # directly). Set before vLLM resolves its platform.
    os.environ["ATOM_DISABLE_VLLM_PLUGIN"] = "1"
    import vllm
    from vllm.config import set_current_vllm_config

    import atom_kernels as ak

    models = args.models.split(",")
    m_values = [int(m) for m in args.m.split(",")]
    vllm_config = block_fp8_vllm_config()
    torch.manual_seed(0)
    report = {
        "device": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
                     "vllm": vllm.__version__},
        "config_model": CONFIG_MODEL,
        "rep_ms": args.rep,
        "atom_backends": {name: backend for name, backend in ak.backend_report("cuda").items()
                          if "fp8" in name},
        "layers": [],
        "results": [],
    }
    print(TABLE_HEADER, flush=True)
    with set_current_vllm_config(vllm_config):
        init_single_rank_distributed()  # vLLM's weight parameters read the TP rank
        report["vllm_fp8"] = vllm_fp8_environment(vllm_config)
        for layer in LAYERS:
            if layer.model not in models:
                continue
            info, rows = bench_layer(ak, vllm_config.quant_config, layer, m_values, args.rep)
            report["layers"].append(info)
            report["results"] += rows
            write(report, args.out)
            torch.cuda.empty_cache()
    write(report, args.out)
    print(f"vLLM FP8 environment: {report['vllm_fp8']}")
    print(f"geometric means: {report['geomean']}")
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
