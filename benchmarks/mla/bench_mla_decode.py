"""GPU benchmark: one MLA decode step through ATOM's MLA backend against vLLM 0.26.0's own MLA backend.

    python benchmarks/mla/bench_mla_decode.py --out results.json [--vllm-backends auto,TRITON_MLA] [--quick]

Shapes: the attention of DeepSeek-V2-Lite, Moonlight-16B-A3B (16 heads) and DeepSeek-V3 (128 heads) at
TP 1 (kv_lora_rank 512, rope 64, nope 128, v 128; bf16; V2-Lite and V3 with their YaRN rope), read
from benchmarks/models, decode batches x context lengths. Every case starts from the same inputs --
the layer's q [B, H, 192] and the new token's latent kv_c [B, 512] and k_pe [B, 64], rope not yet
applied -- and ends with the attention output [B, H * 128] that o_proj takes:

- ATOM: ``ATOMMLAImpl.forward`` over ``ATOMMLAMetadataBuilder`` metadata (absorbed q through W_UK,
  fused q/k rope + latent-cache write, the attention core, W_UV). The core is what
  ``atom_vllm.attention.mla_fa3.mla_kernels`` picks: vLLM's FlashAttention-3 on Hopper, or
  ``atom_kernels.mla_decode`` in Triton with ``ATOM_VLLM_MLA_KERNELS=atom``;
- vLLM: rope as vLLM's DeepSeek model applies it (``get_rope``, in place on q's rope part and k_pe),
  then vLLM's ``MLAAttention`` layer with the named backend (``auto``: what vLLM's CUDA platform picks
  for this GPU, FlashMLA on Hopper): cache write, absorption, ``forward_mqa``, W_UV. Metadata comes
  from that backend's own builder.

Both share kv_b_proj's weights, the cache contents and the rope parameters; their outputs are compared
once per case (bf16 tolerance) so that no case times a wrong path. Each step is timed replayed from a
CUDA graph (``do_bench_cudagraph``: vLLM runs decode from full CUDA graphs) and eagerly (``do_bench``).
Prints a table and writes JSON: device name, versions, per case ATOM's and vLLM's times in
microseconds and ratio = ATOM / vLLM (< 1: ATOM faster).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import traceback
from pathlib import Path

import torch
from triton.testing import do_bench, do_bench_cudagraph

BF16 = torch.bfloat16

# Model shapes from benchmarks/models (published Hugging Face configs; deepseek-v3-7l is DeepSeek-V3's
# width at reduced depth: 128 heads at TP 1).
DEFAULT_MODELS = "deepseek-v2-lite,moonlight-16b-a3b,deepseek-v3-7l"
BATCHES = [1, 8, 32, 64, 128, 256]
CONTEXTS = [1024, 4096, 16384]
QUICK_BATCHES, QUICK_CONTEXTS = [1, 64], [4096]
MAX_CACHE_BYTES = 16 << 30  # skip batch x context combinations whose latent cache would exceed this


def load_config(models_dir: Path, name: str) -> dict:
    return json.loads((models_dir / f"{name}.json").read_text())


def vllm_config_for(model: str, config: dict, block_size: int, max_model_len: int):
    """A VllmConfig for the model's config.json (no weights, no tokenizer)."""
    from vllm.engine.arg_utils import EngineArgs

    model_dir = Path(tempfile.mkdtemp(prefix=f"bench-mla-{model}-"))
    (model_dir / "config.json").write_text(json.dumps(config))
    return EngineArgs(
        model=str(model_dir), skip_tokenizer_init=True, load_format="dummy", dtype="bfloat16",
        max_model_len=max_model_len, block_size=block_size, enforce_eager=True,
    ).create_engine_config()


def init_single_rank_distributed() -> None:
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.utils.network_utils import get_open_port

    init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                 distributed_init_method=f"tcp://127.0.0.1:{get_open_port()}")
    ensure_model_parallel_initialized(1, 1)


def vllm_backend_class(name: str, num_heads: int):
    """vLLM's MLA backend: the CUDA platform's own choice for ``auto``, else the named one (validated)."""
    from vllm.platforms.cuda import CudaPlatform
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.selector import AttentionSelectorConfig

    selector = AttentionSelectorConfig(head_size=576, dtype=BF16, kv_cache_dtype="auto", block_size=None,
                                       use_mla=True)
    selected = None if name == "auto" else AttentionBackendEnum[name]
    # CudaPlatform's method directly: ATOMPlatform (active when atom-vllm is installed) would route a
    # DeepSeek model's MLA to ATOM's backend.
    return resolve_obj_by_qualname(CudaPlatform.get_attn_backend_cls(selected, selector, num_heads))


def block_size_for(backend) -> int:
    sizes = [s for s in backend.get_supported_kernel_block_sizes() if isinstance(s, int)]
    return sizes[0] if sizes else 64


def vllm_deepseek_rope_parameters(hf) -> dict:
    """The rope parameters vLLM's DeepSeek attention builds its rope from: YaRN becomes vLLM's
    ``deepseek_yarn`` (cos/sin scaled by mscale / mscale_all_dim, as DeepSeek's reference does)."""
    params = dict(hf.rope_parameters)
    if params["rope_type"] != "default":
        params["rope_type"] = "deepseek_yarn" if params.get("apply_yarn_scaling", True) else "deepseek_llama_scaling"
    return params


class Layers:
    """One model's attention layer built twice on shared weights: ATOM's impl and vLLM's MLAAttention."""

    def __init__(self, model: str, vllm_config, backend, prefix: str):
        from vllm.model_executor.layers.attention import MLAAttention
        from vllm.model_executor.layers.linear import ColumnParallelLinear as VllmColumnParallelLinear
        from vllm.model_executor.layers.rotary_embedding import get_rope
        from vllm.utils.torch_utils import set_default_torch_dtype
        from vllm.v1.kv_cache_interface import MLAAttentionSpec

        from atom_core.layers.linear import ColumnParallelLinear
        from atom_core.layers.mla import LatentAttentionSpec, mla_softmax_scale
        from atom_core.layers.rotary import RotaryEmbedding, hf_rope_parameters
        from atom_vllm.attention.mla import ATOMMLAImpl, ATOMMLAMetadataBuilder
        from atom_vllm.attention.mla_fa3 import mla_kernels, mla_widths

        hf = vllm_config.model_config.hf_config
        self.heads, self.nope, self.rope = hf.num_attention_heads, hf.qk_nope_head_dim, hf.qk_rope_head_dim
        self.rank, self.v = hf.kv_lora_rank, hf.v_head_dim
        rope = hf_rope_parameters(hf)
        scale = mla_softmax_scale(self.nope + self.rope, rope)
        device = torch.device("cuda")
        kv_b_weight = torch.randn(self.heads * (self.nope + self.v), self.rank, device=device) * self.rank**-0.5

        with torch.device(device), set_default_torch_dtype(BF16):
            kv_b_proj = VllmColumnParallelLinear(self.rank, kv_b_weight.shape[0], bias=False,
                                                 prefix=f"{prefix}.kv_b_proj")
            kv_b_proj.weight.data.copy_(kv_b_weight)
            self.vllm_rope = get_rope(self.rope, max_position=hf.max_position_embeddings,
                                      rope_parameters=vllm_deepseek_rope_parameters(hf), is_neox_style=False)
            self.vllm_layer = MLAAttention(
                num_heads=self.heads, scale=scale, qk_nope_head_dim=self.nope, qk_rope_head_dim=self.rope,
                v_head_dim=self.v, q_lora_rank=None, kv_lora_rank=self.rank, kv_b_proj=kv_b_proj,
                cache_config=vllm_config.cache_config, prefix=f"{prefix}.attn", attn_backend=backend,
            )
        self.vllm_layer.process_weights_after_loading(BF16)
        self.layer_name = f"{prefix}.attn"
        self.block_size = vllm_config.cache_config.block_size
        spec = MLAAttentionSpec(block_size=self.block_size, num_kv_heads=1, head_size=self.rank + self.rope,
                                dtype=BF16, cache_dtype_str="auto")
        self.vllm_builder = backend.get_builder_cls()(spec, [self.layer_name], vllm_config, device)

        atom_kv_b_proj = ColumnParallelLinear(self.rank, kv_b_weight.shape[0]).to(device=device, dtype=BF16)
        atom_kv_b_proj.weight.data.copy_(kv_b_weight)
        # is_neox False: DeepSeek's interleaved rope pairs, as vLLM's is_neox_style=False.
        rotary = RotaryEmbedding(self.rope, self.rope, hf.max_position_embeddings, rope, is_neox=False).to(device)
        self.atom_impl = ATOMMLAImpl(
            LatentAttentionSpec(
                num_heads=self.heads, qk_nope_head_dim=self.nope, qk_rope_head_dim=self.rope,
                v_head_dim=self.v, kv_lora_rank=self.rank, scale=scale, prefix=f"{prefix}.atom",
                layer_id=0, kv_b_proj=atom_kv_b_proj, rotary_emb=rotary,
            ),
            mla_kernels(False, mla_widths(hf)),
        )
        self.atom_builder = ATOMMLAMetadataBuilder(spec, [f"{prefix}.atom"], vllm_config, device)


def run_case(layers: Layers, vllm_config, batch: int, context: int) -> dict:
    from vllm.forward_context import set_forward_context
    from vllm.v1.attention.backend import CommonAttentionMetadata

    device = torch.device("cuda")
    bs = layers.block_size
    blocks_per_seq = math.ceil(context / bs)
    num_blocks = batch * blocks_per_seq + 1
    block_table = (torch.randperm(num_blocks - 1, device=device)[: batch * blocks_per_seq] + 1)
    block_table = block_table.view(batch, blocks_per_seq).to(torch.int32)
    last = context - 1  # the new token's position; the cache holds the other context - 1 tokens
    positions = torch.full((batch,), last, dtype=torch.int64, device=device)
    slot_mapping = (block_table[:, last // bs].long() * bs + last % bs).contiguous()
    query_start_loc = torch.arange(batch + 1, dtype=torch.int32, device=device)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    common = CommonAttentionMetadata(
        query_start_loc=query_start_loc, query_start_loc_cpu=query_start_loc.cpu(), seq_lens=seq_lens,
        num_reqs=batch, num_actual_tokens=batch, max_query_len=1, max_seq_len=context,
        block_table_tensor=block_table, slot_mapping=slot_mapping, seq_lens_cpu_upper_bound=seq_lens.cpu(),
    )
    atom_metadata = layers.atom_builder.build_for_cudagraph_capture(common)
    vllm_metadata = layers.vllm_builder.build_for_cudagraph_capture(common)

    latent = layers.rank + layers.rope
    cache_atom = torch.randn(num_blocks, bs, latent, dtype=BF16, device=device)
    cache_vllm = cache_atom.clone()
    layers.vllm_layer.kv_cache = cache_vllm
    q = torch.randn(batch, layers.heads, layers.nope + layers.rope, dtype=BF16, device=device)
    kv_c = torch.randn(batch, layers.rank, dtype=BF16, device=device)
    k_pe = torch.randn(batch, layers.rope, dtype=BF16, device=device)
    out_atom = torch.empty(batch, layers.heads * layers.v, dtype=BF16, device=device)
    q_vllm, k_pe_vllm = q.clone(), k_pe.clone().unsqueeze(1)

    def atom_step():
        layers.atom_impl.forward(positions, q, kv_c, k_pe, cache_atom, atom_metadata, out_atom)

    def vllm_step():
        # As vLLM's MLA wrapper (vllm/model_executor/layers/mla.py) does; the rotation is in place, so
        # replays rotate again: that changes the values, not the cost.
        q_vllm[..., layers.nope :], k_rot = layers.vllm_rope(positions, q_vllm[..., layers.nope :], k_pe_vllm)
        return layers.vllm_layer(q_vllm, kv_c, k_rot, output_shape=(batch, layers.heads * layers.v))

    with set_forward_context({layers.layer_name: vllm_metadata}, vllm_config,
                             slot_mapping={layers.layer_name: slot_mapping}):
        atom_step()
        out_vllm = vllm_step()
        torch.cuda.synchronize()
        error = ((out_atom.float() - out_vllm.float()).norm() / out_vllm.float().norm()).item()
        if not error < 2e-2:
            raise AssertionError(f"outputs differ: relative error {error:.3e}")
        times = {
            "atom_graph_us": do_bench_cudagraph(atom_step) * 1e3,
            "vllm_graph_us": do_bench_cudagraph(vllm_step) * 1e3,
            "atom_eager_us": do_bench(atom_step) * 1e3,
            "vllm_eager_us": do_bench(vllm_step) * 1e3,
        }
    return {
        **times,
        "ratio_graph": times["atom_graph_us"] / times["vllm_graph_us"],
        "ratio_eager": times["atom_eager_us"] / times["vllm_eager_us"],
        "relative_error": error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON results file")
    parser.add_argument("--models", default=DEFAULT_MODELS, help="names of benchmarks/models/*.json")
    parser.add_argument("--vllm-backends", default="auto,TRITON_MLA",
                        help="vLLM MLA backends to compare with: auto (the platform's choice) or enum names")
    parser.add_argument("--quick", action="store_true", help=f"batches {QUICK_BATCHES}, contexts {QUICK_CONTEXTS}")
    parser.add_argument("--models-dir", default=str(Path(__file__).resolve().parents[1] / "models"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_mla_decode needs a CUDA GPU")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    import vllm
    from vllm.config import set_current_vllm_config

    import atom_kernels
    from atom_vllm.attention.mla_fa3 import FA3_WIDTHS, mla_kernels

    batches, contexts = (QUICK_BATCHES, QUICK_CONTEXTS) if args.quick else (BATCHES, CONTEXTS)
    results = {
        "device": torch.cuda.get_device_name(),
        "versions": {"torch": torch.__version__, "vllm": vllm.__version__},
        "atom_kernels": atom_kernels.backend_report_line("cuda"),
        "atom_mla_kernels": mla_kernels(False, FA3_WIDTHS),  # every model here has DeepSeek's MLA widths
        "cases": [],
    }
    distributed_ready = False
    for model in args.models.split(","):
        config = load_config(Path(args.models_dir), model)
        heads = config["num_attention_heads"]
        model_contexts = [c for c in contexts if c <= config["max_position_embeddings"]]
        for backend_name in args.vllm_backends.split(","):
            # vLLM's backend validation reads the current config; the block size is the backend's.
            with set_current_vllm_config(vllm_config_for(model, config, 64, max(model_contexts))):
                backend = vllm_backend_class(backend_name, heads)
            block_size = block_size_for(backend)
            vllm_config = vllm_config_for(model, config, block_size, max(model_contexts))
            with set_current_vllm_config(vllm_config):
                if not distributed_ready:
                    init_single_rank_distributed()
                    distributed_ready = True
                layers = Layers(model, vllm_config, backend, prefix=f"{model}.{backend_name}")
                for context in model_contexts:
                    for batch in batches:
                        if batch * context * 576 * 2 > MAX_CACHE_BYTES:
                            continue
                        case = {"model": model, "vllm_backend": backend.get_name(), "block_size": block_size,
                                "batch": batch, "context": context}
                        try:
                            case.update(run_case(layers, vllm_config, batch, context))
                        except Exception as exc:  # noqa: BLE001 - record the failure, keep benchmarking
                            case["error"] = f"{type(exc).__name__}: {exc}"
                            traceback.print_exc()
                        results["cases"].append(case)
                        print_case(case)
                        torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


def print_case(case: dict) -> None:
    head = f"{case['model']:<18} {case['vllm_backend']:<12} B={case['batch']:<4} ctx={case['context']:<6}"
    if "error" in case:
        print(f"{head} ERROR {case['error']}", flush=True)
        return
    print(
        f"{head} graph: atom {case['atom_graph_us']:8.1f} us  vllm {case['vllm_graph_us']:8.1f} us  "
        f"ratio {case['ratio_graph']:.2f} | eager: atom {case['atom_eager_us']:8.1f} us  "
        f"vllm {case['vllm_eager_us']:8.1f} us  ratio {case['ratio_eager']:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
