"""What the retrieval backends consume and return."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass
class EncodedQueries:
    """A batch of B questions after NER and encoding (the input of both backends).

    query_emb     [B, D] float32, L2-normalised question embeddings
    entity_emb    [Q, D] float32, L2-normalised embeddings of the questions' entities (lower-cased)
    entity_owner  [Q]    int64, the question (0..B-1) each entity belongs to
    entity_text   Q strings, for diagnostics
    """

    query_emb: torch.Tensor
    entity_emb: torch.Tensor
    entity_owner: torch.Tensor
    entity_text: list

    @property
    def batch_size(self) -> int:
        return int(self.query_emb.shape[0])

    def to(self, device) -> "EncodedQueries":
        return EncodedQueries(
            self.query_emb.to(device), self.entity_emb.to(device), self.entity_owner.to(device), self.entity_text
        )


class Retrieved(NamedTuple):
    """Top-k passages per question: row indices into the index's passages, best first, and scores.

    indices [B, k] int64, scores [B, k] float32, with k = min(top_k, number of passages).
    """

    indices: torch.Tensor
    scores: torch.Tensor
