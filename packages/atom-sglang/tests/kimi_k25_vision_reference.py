"""SGLang's own Kimi-K2.5 image path outside its engine: the checkpoint's processor, and SGLang's
vision tower (MoonViT) and projector loaded by its own class (built encoder-only, as SGLang builds
the vision half), giving each image's embeddings, the rows SGLang puts in place of the image's
placeholder tokens. A fresh process (SGLang's layers read its server arguments and process group):
``python kimi_k25_vision_reference.py MODEL_DIR OUT_FILE IMAGE...`` saves the list.
"""

import sys

import torch
from PIL import Image
from safetensors.torch import load_file
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
from sglang_testing import free_port
from transformers import AutoProcessor


def publish_as_scheduler(server_args: ServerArgs) -> None:
    """SGLang 0.5.23's layers read this process's ranks in the parallel groups from the runtime
    context its scheduler publishes with them (``SpawnRanks``) before it builds the model. 0.5.17's
    context carries no ranks (no ``SpawnRanks``): its layers read the groups, nothing to publish."""
    try:
        from sglang.srt.runtime_context import SpawnRanks, publish
    except ImportError:
        return
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0))


def main(model_dir: str, out_file: str, images: list[str]) -> None:
    server_args = ServerArgs(model_path=model_dir, device="cpu", trust_remote_code=True)
    set_global_server_args_for_scheduler(server_args)
    publish_as_scheduler(server_args)
    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{free_port()}")
    initialize_model_parallel()
    from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration, mm_projection_auto

    config = ModelConfig.from_server_args(server_args).hf_config
    config.encoder_only = True
    model = KimiK25ForConditionalGeneration(config)
    model.load_weights(load_file(f"{model_dir}/model.safetensors").items())
    processor = AutoProcessor.from_pretrained(model_dir, trust_remote_code=True).media_processor
    embeddings = []
    with torch.no_grad():
        for path in images:
            pixel_values, grid = processor.patches(Image.open(path))
            tower_out = model.vision_tower(pixel_values, torch.tensor([grid]))
            embeddings.append(mm_projection_auto(model.mm_projector, tower_out))
    torch.save(embeddings, out_file)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
