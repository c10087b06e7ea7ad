"""vLLM's own Kimi-K2.5 image path outside its engine: its image processor, vision tower (MoonViT)
and projector on a checkpoint's tower tensors, giving each image's embeddings, the rows vLLM puts in
place of the image's placeholder tokens. A fresh process (vLLM's parallel layers need its process
group): ``python kimi_k25_vision_reference.py MODEL_DIR OUT_FILE IMAGE...`` saves the list.
"""

import json
import os
import sys

import torch
from PIL import Image
from safetensors.torch import load_file
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.models.kimi_k25_vit import (
    KimiK25MultiModalProjector,
    MoonViT3dPretrainedModel,
    vision_tower_forward,
)
from vllm.transformers_utils.configs.kimi_k25 import KimiK25Config
from vllm.transformers_utils.processors.kimi_k25_vision_fused import KimiK25FusedVisionProcessor
from vllm_testing import free_port

# The published projector names, as vLLM's KimiK25ForConditionalGeneration maps them.
PROJECTOR_NAMES = {"proj.0.": "linear_1.", "proj.2.": "linear_2."}


def module_tensors(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in tensors.items():
        if name.startswith(prefix):
            name = name[len(prefix):]
            for published, ours in PROJECTOR_NAMES.items():
                name = name.replace(published, ours)
            out[name] = tensor
    return out


def main(model_dir: str, out_file: str, images: list[str]) -> None:
    with open(os.path.join(model_dir, "config.json")) as f:
        config = KimiK25Config(**{k: v for k, v in json.load(f).items() if k not in ("architectures", "model_type")})
    with open(os.path.join(model_dir, "preprocessor_config.json")) as f:
        processor = KimiK25FusedVisionProcessor(json.load(f)["media_proc_cfg"])
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
        initialize_model_parallel(1, 1)
        tower = MoonViT3dPretrainedModel(config.vision_config, prefix="vision_tower")
        projector = KimiK25MultiModalProjector(config.vision_config, prefix="mm_projector")
        tower.load_state_dict(module_tensors(tensors, "vision_tower."))
        projector.load_state_dict(module_tensors(tensors, "mm_projector."))
        for module in [*tower.modules(), *projector.modules()]:  # as vLLM's loader does after loading
            if getattr(module, "quant_method", None) is not None:
                module.quant_method.process_weights_after_loading(module)
        inputs = processor.preprocess([{"type": "image", "image": Image.open(path).convert("RGB")}
                                       for path in images], return_tensors="pt")
        with torch.no_grad():
            embeddings = vision_tower_forward(tower, inputs["pixel_values"], inputs["grid_thws"], projector,
                                              use_data_parallel=False)
    torch.save([e.reshape(-1, e.shape[-1]) for e in embeddings], out_file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
