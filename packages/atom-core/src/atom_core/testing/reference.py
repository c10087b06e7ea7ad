"""Reference greedy decoding to compare engines with: HF transformers, and ATOM's model alone (no
host engine)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch


def hf_greedy(model_dir: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """HF transformers greedy decoding, ``max_tokens`` per prompt, never stopping early (no EOS)."""
    from atom_core.testing.hf_classes import hf_reference_model

    model = hf_reference_model(model_dir)
    outputs = []
    with torch.no_grad():
        for prompt in prompts:
            # An explicit mask: without one, generate masks out every prompt token equal to pad_token_id.
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                                 do_sample=False, eos_token_id=None, pad_token_id=0)
            if out.shape[1] != len(prompt) + max_tokens:
                raise AssertionError("HF generate stopped early")
            outputs.append(out[0, len(prompt):].tolist())
    return outputs


def hf_greedy_on_embeddings(model_dir: str, ids: list[int], placeholder: int, embeddings: list[torch.Tensor],
                            max_tokens: int) -> list[list[int]]:
    """HF transformers greedy decoding of ``ids`` once per image, its one ``placeholder`` token
    expanded to that image's embedding rows (``embeddings``: one [rows, hidden] tensor per image), as
    the hosts place image embeddings."""
    from atom_core.testing.hf_classes import hf_reference_model

    model = hf_reference_model(model_dir)
    at = ids.index(placeholder)
    outputs = []
    with torch.no_grad():
        for rows in embeddings:
            expanded = torch.tensor([ids[:at] + [placeholder] * len(rows) + ids[at + 1:]])
            inputs = model.get_input_embeddings()(expanded)
            inputs[0, at:at + len(rows)] = rows
            out = model.generate(inputs_embeds=inputs, attention_mask=torch.ones_like(expanded), do_sample=False,
                                 max_new_tokens=max_tokens, eos_token_id=None, pad_token_id=0)
            outputs.append(out[0].tolist())
    return outputs


def atom_logits(model_dir: str, dtype: torch.dtype = torch.float32):
    """ATOM's model alone (torch kernels, no host engine) in ``dtype``: a function from one
    sequence's token ids to its logits [len, vocab]. The reference for checkpoints HF transformers
    cannot run as ATOM does (FP8 experts). Of a vision-language checkpoint, its language model on
    text."""
    from transformers import AutoConfig

    from atom_core import Config
    from atom_core.hosting.build import build_atom_model
    from atom_core.hosting.hf_config import language_model_config
    from atom_core.layers.attention import standalone_batch
    from atom_core.loader import iter_safetensors

    hf_config = AutoConfig.from_pretrained(model_dir)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        text_config = language_model_config(hf_config, hf_config.get_text_config())
        config = Config(model=model_dir, hf_config=text_config, torch_dtype=dtype)
        model = build_atom_model(config, hf_config.architectures[0], "a reference run")
    finally:
        torch.set_default_dtype(default_dtype)
    model.load_weights(language_model_weights(iter_safetensors(model_dir)))

    def logits(tokens: list[int]) -> torch.Tensor:
        with torch.no_grad(), standalone_batch([len(tokens)]):
            return model.compute_logits(model(torch.tensor(tokens), torch.arange(len(tokens)))).float()

    return logits


def language_model_weights(weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """A checkpoint's tensors as a host hands them to ATOM's language model: a vision-language
    checkpoint's ``model.language_model.*`` as ``model.*``, its vision tower left out (a text
    checkpoint's unchanged)."""
    from atom_core.hosting.hf_config import language_model_name

    for name, tensor in weights:
        if not name.startswith("model.visual."):
            yield language_model_name(name), tensor


def atom_greedy(model_dir: str, prompts: list[list[int]], max_tokens: int,
                dtype: torch.dtype = torch.float32) -> list[list[int]]:
    """Greedy decoding with :func:`atom_logits`, re-running each whole sequence per token."""
    logits = atom_logits(model_dir, dtype)
    outputs = []
    for prompt in prompts:
        tokens = list(prompt)
        for _ in range(max_tokens):
            tokens.append(int(logits(tokens)[-1].argmax()))
        outputs.append(tokens[len(prompt):])
    return outputs


def prompt_logprobs(logits: torch.Tensor, prompt: list[int]) -> list[float]:
    """The log-probability of each prompt token after the first, from the prompt's logits."""
    logprobs = logits.float().log_softmax(-1)
    return logprobs[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0].tolist()


def prompt_logprob_gaps(model_dir: str, prompts: list[list[int]],
                        served: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """How far a served 16-bit run's prompt log-probabilities (``served``, per prompt) lie from ATOM
    alone's in float32 on the checkpoint at ``model_dir``, token by token, and how far ATOM alone's
    own bfloat16 ones lie from them: the yardstick where the served path rounds otherwise than ATOM
    alone (MLA absorbed vs expanded, tensor-parallel sums) and an FP8 or MXFP4 activation
    rounding after it makes those ulps whole steps. See :func:`within_bfloat16_noise`."""
    fp32, bf16 = atom_logits(model_dir, torch.float32), atom_logits(model_dir, torch.bfloat16)

    def gaps(logprobs_of) -> torch.Tensor:
        return torch.tensor([abs(a - b) for prompt, theirs in zip(prompts, logprobs_of, strict=True)
                             for a, b in zip(prompt_logprobs(fp32(prompt), prompt), theirs, strict=True)])

    return gaps(served), gaps([prompt_logprobs(bf16(prompt), prompt) for prompt in prompts])


def within_bfloat16_noise(served: torch.Tensor, alone_bf16: torch.Tensor) -> bool:
    """The served gaps of :func:`prompt_logprob_gaps` no larger than ATOM alone's bfloat16 noise:
    1.5 times its mean, twice its worst."""
    return bool(served.mean() <= 1.5 * alone_bf16.mean() and served.max() <= 2 * alone_bf16.max())


def _through_e4m3(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``x`` as an FP8 cache holds it: divided by ``scale``, saturated, rounded to e4m3, and
    multiplied back."""
    fp8 = torch.float8_e4m3fn
    fp8_max = torch.finfo(fp8).max
    return ((x.float() / scale).clamp(-fp8_max, fp8_max).to(fp8).float() * scale).to(x.dtype)


@contextlib.contextmanager
def fp8_kv_cache_semantics(fresh_tokens: int,
                           kv_scales: Sequence[tuple[float, float]] | None = None) -> Iterator[None]:
    """ATOM models built inside this block attend as ATOM's host attention does over an FP8 e4m3
    KV cache with, for MHA layer i, K and V scales ``kv_scales[i]`` (a checkpoint's), else 1.0 (the
    hosts' default).

    MHA: in each sequence, the first ``fresh_tokens`` query rows (a first prefill chunk, which
    attends over the fresh K/V) over plain K/V, every later row (a later prefill chunk, a decode
    step: both read the cache) over all K/V rounded through e4m3 at their scales. MLA: every row
    over the latent entries ``[kv_c | rope(k_pe)]`` rounded through e4m3 (its prefill reads the
    cache too).
    """
    from atom_core.layers import attention, mla
    from atom_kernels.attention import attend_one_sequence

    class Fp8CacheAttention(attention.StandaloneAttention):
        def forward(self, q, k, v, out=None):
            s = self.spec
            q = q.view(-1, s.num_heads, s.head_size)
            k = k.view(-1, s.num_kv_heads, s.head_size)
            v = v.view(-1, s.num_kv_heads, s.head_size)
            k_scale, v_scale = (1.0, 1.0) if kv_scales is None else kv_scales[s.layer_id]
            fresh = attend_one_sequence(q[:fresh_tokens], k[:fresh_tokens], v[:fresh_tokens], s.scale,
                                        True, s.sliding_window, s.sinks)
            cached = attend_one_sequence(q[fresh_tokens:], _through_e4m3(k, k_scale), _through_e4m3(v, v_scale),
                                         s.scale, True, s.sliding_window, s.sinks)
            result = torch.cat([fresh, cached]).reshape(q.shape[0], -1)
            return result if out is None else out.copy_(result)

    class Fp8LatentCacheAttention(mla.StandaloneLatentAttention):
        def forward(self, positions, q, kv_c, k_pe):
            s = self.spec
            p = s.qk_nope_head_dim
            q_pe, k_pe = s.rotary_emb(positions, q[..., p:], k_pe)
            cu = attention.standalone_cu_seqlens(q.device)
            latent = _through_e4m3(torch.cat([kv_c, k_pe.reshape(k_pe.shape[0], -1)], dim=-1))
            return mla.mla_prefill(s, torch.cat([q[..., :p], q_pe], dim=-1), latent, cu, cu)

    previous = attention.get_attention_factory(), mla.get_latent_attention_factory()
    attention.set_attention_factory(Fp8CacheAttention)
    mla.set_latent_attention_factory(Fp8LatentCacheAttention)
    try:
        yield
    finally:
        attention.set_attention_factory(previous[0])
        mla.set_latent_attention_factory(previous[1])
