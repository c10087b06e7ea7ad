"""MXFP4 fused MoE at the gpt-oss-20b shape: the MXFP4 GEMMs through Triton's microscaled dot
(``tl.dot_scaled``, what atom_kernels.moe runs on a GPU with bf16 activations) against the same
kernel decoding each weight tile itself (the interpreter's path), and ATOM's bf16 MoE on the
dequantized weights. Default tiles for all three. Writes $OUT/mxfp4-dot.json."""

import json
import math
import os

import torch
from triton.testing import do_bench_cudagraph

import atom_kernels as ak
from atom_kernels import moe

torch.manual_seed(0)
E, TOP_K, D, INTER = 32, 4, 2880, 2880


def mxfp4(rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    blocks = torch.randint(0, 256, (E, rows, cols // 2), dtype=torch.uint8, device="cuda")
    center = 127 - round(math.log2(2 * cols**0.5))
    return blocks, torch.randint(center - 1, center + 2, (E, rows, cols // 32), dtype=torch.uint8,
                                 device="cuda")


def us(fn) -> float:
    fn()
    return do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3


(w13, s13), (w2, s2) = mxfp4(2 * INTER, D), mxfp4(D, INTER)
w13_bf16 = ak.dequantize_mxfp4(w13, s13, torch.bfloat16)
w2_bf16 = ak.dequantize_mxfp4(w2, s2, torch.bfloat16)
gpt_oss = {"activation": "clamped_swiglu", "interleaved": True}
scales = {"w13_scale": s13, "w2_scale": s2, "weight_format": "mxfp4"}
native_format = moe.mx_dot_format
rows = []
for tokens in (1, 16, 64, 256, 1024, 4096, 16384):
    x = torch.randn(tokens, D, device="cuda", dtype=torch.bfloat16)
    weights, ids = torch.topk(torch.randn(tokens, E, device="cuda").softmax(-1), TOP_K)
    ids = ids.to(torch.int32)
    args = (x, w13, w2, weights, ids)
    moe.mx_dot_format = native_format
    dot_out = ak.fused_moe(*args, **scales, **gpt_oss)
    dot_us = us(lambda: ak.fused_moe(*args, **scales, **gpt_oss))
    moe.mx_dot_format = lambda a: None
    decode_out = ak.fused_moe(*args, **scales, **gpt_oss)
    decode_us = us(lambda: ak.fused_moe(*args, **scales, **gpt_oss))
    moe.mx_dot_format = native_format
    bf16_args = (x, w13_bf16, w2_bf16, weights, ids)
    bf16_out = ak.fused_moe(*bf16_args, **gpt_oss)
    bf16_us = us(lambda: ak.fused_moe(*bf16_args, **gpt_oss))
    scale = bf16_out.float().abs().max().item()
    row = {
        "tokens": tokens, "dot_scaled_us": dot_us, "decode_us": decode_us, "bf16_weights_us": bf16_us,
        "dot_vs_bf16_max_rel": (dot_out.float() - bf16_out.float()).abs().max().item() / scale,
        "decode_vs_bf16_max_rel": (decode_out.float() - bf16_out.float()).abs().max().item() / scale,
    }
    rows.append(row)
    print(f"tokens {tokens:6d}: dot_scaled {dot_us:9.1f} us  decode {decode_us:9.1f} us  "
          f"bf16 weights {bf16_us:9.1f} us  diff {row['dot_vs_bf16_max_rel']:.1e} / "
          f"{row['decode_vs_bf16_max_rel']:.1e}", flush=True)
out = {"device": torch.cuda.get_device_name(), "shape": {"E": E, "top_k": TOP_K, "D": D, "I": INTER},
       "rows": rows}
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "mxfp4-dot.json"), "w"), indent=1)
