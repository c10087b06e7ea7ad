"""Vocabulary-parallel input embedding and LM head: each TP rank holds a contiguous vocab slice."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from atom_core.distributed import get_tp_group
from atom_core.layers.linear import copy_checked, make_param


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, prefix: str = ""):
        super().__init__()
        self.tp = get_tp_group()
        self.vocab_size = vocab_size
        self.shard_size = -(-vocab_size // self.tp.world_size)
        self.vocab_start = self.tp.rank * self.shard_size
        self.rows_held = max(0, min(self.shard_size, vocab_size - self.vocab_start))
        self.weight = make_param((self.shard_size, hidden_size), self.weight_loader)

    @property
    def num_embeddings(self) -> int:
        """``nn.Embedding``'s name of the vocabulary size, which hosts read (SGLang's placement of image
        embeddings clamps the ids to it)."""
        return self.vocab_size

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if loaded.shape[0] != self.vocab_size:
            raise ValueError(f"vocab size mismatch: checkpoint {loaded.shape[0]} vs config {self.vocab_size}")
        rows = loaded[self.vocab_start : self.vocab_start + self.shard_size]
        param.data.zero_()
        copy_checked(param.data[: rows.shape[0]], rows)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embeddings of ``input_ids``; an id past the vocabulary (which the hosts' validation lets
        through when the tokenizer is larger than the config's ``vocab_size``) reads zeros, as the
        zero padding rows of the hosts' own embeddings do, instead of indexing out of bounds."""
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.rows_held)
        y = F.embedding(local.masked_fill(outside, 0), self.weight)
        y = y.masked_fill(outside.unsqueeze(-1), 0)
        return y if self.tp.world_size == 1 else self.tp.all_reduce(y)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over the full vocabulary: local slice GEMM, then gather across ranks."""

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden_states, self.weight)
        if self.tp.world_size > 1:
            logits = self.tp.all_gather(logits, -1)
        return logits[..., : self.vocab_size]
