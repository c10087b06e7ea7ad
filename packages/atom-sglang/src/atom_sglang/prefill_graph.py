"""Run prefill eagerly where ATOM serves the model: SGLang's prefill CUDA graph is not for ATOM models.

On a GPU, SGLang 0.5.17 captures prefill by default with its "breakable" CUDA-graph backend: it finds
the transformer body (the first ``.model`` with ``layers``, here ATOM's decoder), calls it with
SGLang's body signature ``(input_ids, positions, forward_batch, input_embeds)`` and captures
everything between attention layers at one request per graph. ATOM's decoder has atom-core's
signature and reads the batch from the model wrapper's context (atom_sglang.host_hooks), so the
capture fails at start-up, and code between attention layers that looked at the batch would replay
as captured. Until ATOM's wrapper gives SGLang a body it can capture, prefill runs eagerly (as with
``--cuda-graph-backend-prefill disabled``); decode keeps SGLang's CUDA graphs.
"""

from __future__ import annotations

from atom_core.log import logger


def keep_prefill_eager(server_args) -> None:
    """Set the prefill phase of SGLang's resolved CUDA-graph config to disabled, in ``server_args`` and
    in the runtime's published copy where that is another object (each is read at graph capture)."""
    from sglang.srt.model_executor.cuda_graph_config import Backend
    from sglang.srt.runtime_context import get_exec

    configs = [server_args.cuda_graph_config]
    try:
        published = get_exec().graph.cuda_graph_config
    except ValueError:  # not published in this process
        published = None
    if published is not None and published is not configs[0]:
        configs.append(published)
    if all(config.prefill.backend == Backend.DISABLED for config in configs):
        return
    for config in configs:
        config.prefill.backend = Backend.DISABLED
    logger.info("SGLang's prefill CUDA graph is off for ATOM models (prefill runs eagerly; decode "
                "keeps its CUDA graphs)")
