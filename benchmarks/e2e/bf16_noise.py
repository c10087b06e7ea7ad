"""How far bf16 alone moves a checkpoint's first-step logprobs: HF transformers' model in fp32 against
the same model in bf16, on the correctness prompts of the offline workload, scored as bench_offline.py
scores native against ATOM.

    python benchmarks/e2e/bf16_noise.py --checkpoint DIR --out noise.json [--prompts 16]

Two bf16 engines agree no better than this floor. Random checkpoints can sit near ties: at
Qwen3-Next-80B-A3B's widths with 16 layers, N(0, 0.02) weights give logits whose greedy token bf16
rounding alone flips, so a greedy-agreement number between engines means nothing there (read it
against this one).
"""

import argparse
import json

import torch
from bench_offline import agreement
from offline_workload import correctness_prompts
from transformers import AutoConfig, AutoModelForCausalLM

TOP = 20


def first_step(model, prompts: list[list[int]]) -> dict:
    """Greedy first token and top-20 logprobs per prompt, in bench_offline's correctness layout."""
    device = next(model.parameters()).device
    tokens, logprobs = [], []
    with torch.no_grad():
        for prompt in prompts:
            last = model(torch.tensor([prompt], device=device)).logits[0, -1].float().log_softmax(-1)
            top = last.topk(TOP)
            tokens.append([int(top.indices[0])])
            logprobs.append({str(int(t)): float(v) for t, v in zip(top.indices, top.values)})
    return {"tokens": tokens, "first_logprobs": logprobs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts", type=int, default=16)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    vocab = AutoConfig.from_pretrained(args.checkpoint).vocab_size
    prompts = correctness_prompts(args.prompts, vocab)
    # Loaded once in bf16 (the checkpoint's type), then widened in place: the fp32 model holds the same
    # values as one loaded in fp32, and host memory never holds fp32 weights (100 GB at 512 experts).
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.bfloat16).to(device).eval()
    bf16 = first_step(model, prompts)
    fp32 = first_step(model.float(), prompts)
    floor = agreement({"correctness": fp32}, {"correctness": bf16})
    report = {"checkpoint_config": json.load(open(f"{args.checkpoint}/config.json")), "device": device,
              "fp32_vs_bf16": {key: floor[key] for key in ("prompts", "first_token_agreement",
                                                           "first_step_top20_logprob_max_abs_diff",
                                                           "first_step_top20_logprob_mean_abs_diff")}}
    print(report["fp32_vs_bf16"])
    with open(args.out, "w") as f:
        json.dump(report, f, separators=(",", ":"))


if __name__ == "__main__":
    main()
