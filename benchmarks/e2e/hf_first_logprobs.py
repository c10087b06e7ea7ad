"""Engines against HF transformers on a checkpoint on disk: the first generated position's top-20
log-probabilities of engine_run.py's correctness prompts.

    python hf_first_logprobs.py --checkpoint DIR --runs RUN.json [RUN.json ...] --out RESULT.json
        [--dtype float32]

HF runs the checkpoint in bf16 on the GPU (an MXFP4 one dequantized by HF itself, as its CPU path
does), eager attention; with ``--dtype float32`` loaded in bf16 and widened in place (for engine runs
in fp32: 100 GB of Qwen3-Next-16l weights, whose bf16 checkpoint host memory holds once). For each
engine run: how often its first token is HF's, and the largest and mean difference of the
log-probabilities both put in their top 20.
"""

import argparse
import json

import torch
from offline_workload import correctness_prompts


def hf_first_logprobs(checkpoint: str, prompts: list[list[int]], fp32: bool) -> list[dict[int, float]]:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(checkpoint)
    kwargs = {}
    if (getattr(config, "quantization_config", None) or {}).get("quant_method") == "mxfp4":
        from transformers import Mxfp4Config

        kwargs["quantization_config"] = Mxfp4Config(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.bfloat16, device_map="cuda",
                                                 attn_implementation="eager", **kwargs).eval()
    if fp32:
        model.float()
    result = []
    with torch.no_grad():
        for prompt in prompts:
            logits = model(torch.tensor([prompt], device="cuda")).logits[0, -1].float()
            top = logits.log_softmax(-1).topk(20)
            result.append(dict(zip(top.indices.tolist(), top.values.tolist())))
    return result


def compare(engine: list[dict[str, float]], hf: list[dict[int, float]]) -> dict:
    first_equal, diffs = 0, []
    for ours, theirs in zip(engine, hf):
        ours = {int(t): v for t, v in ours.items()}
        first_equal += max(ours, key=ours.get) == max(theirs, key=theirs.get)
        diffs += [abs(ours[t] - theirs[t]) for t in set(ours) & set(theirs)]
    return {"prompts": len(hf), "first_token_equal_hf": first_equal,
            "top20_logprob_max_abs_diff": max(diffs), "top20_logprob_mean_abs_diff": sum(diffs) / len(diffs)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--runs", nargs="+", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    args = parser.parse_args()
    runs = {path: json.load(open(path)) for path in args.runs}
    count = len(next(iter(runs.values()))["correctness"]["first_logprobs"])
    vocab = json.load(open(f"{args.checkpoint}/config.json"))["vocab_size"]
    hf = hf_first_logprobs(args.checkpoint, correctness_prompts(count, vocab), args.dtype == "float32")
    report = {path: {"atom_disabled": run["atom_disabled"], "hf_dtype": args.dtype,
                     **compare(run["correctness"]["first_logprobs"], hf)}
              for path, run in runs.items()}
    json.dump(report, open(args.out, "w"), indent=1)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
