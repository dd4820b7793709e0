"""What the retrieval backends consume and return."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import torch


@dataclass
class PassagePrior:
    """Eq. 7's dense prior in a chain's later rounds (chain.passage_prior): every passage cosine at least
    ``floor``, and at the (passage ``row``, question ``col``) entries at least ``val`` (unique pairs)."""

    floor: float
    row: torch.Tensor  # int64 [n]
    col: torch.Tensor  # int64 [n]
    val: torch.Tensor  # float32 [n]

    def apply(self, sim: torch.Tensor) -> torch.Tensor:
        """A new [P, B] tensor: ``sim`` raised to the floor and to the entries."""
        out = sim.clamp(min=self.floor)
        if self.row.numel():
            r, c = self.row.to(sim.device), self.col.to(sim.device)
            out[r, c] = torch.maximum(out[r, c], self.val.to(sim.device, sim.dtype))
        return out

    def select(self, new_col: torch.Tensor) -> "PassagePrior":
        """The entries of the kept questions, renumbered: new_col[b] = the new column of question b, or -1."""
        nc = new_col.to(self.col.device)[self.col]
        keep = nc >= 0
        return PassagePrior(self.floor, self.row[keep], nc[keep], self.val[keep])

    def to(self, device) -> "PassagePrior":
        return PassagePrior(self.floor, self.row.to(device), self.col.to(device), self.val.to(device))


@dataclass
class EncodedQueries:
    """A batch of B questions after NER and encoding (the input of both backends).

    query_emb     [B, D] float32, L2-normalised question embeddings
    entity_emb    [Q, D] float32, L2-normalised embeddings of the questions' entities (lower-cased)
    entity_owner  [Q]    int64, the question (0..B-1) each entity belongs to
    entity_text   Q strings, for diagnostics
    entity_rows   [Q] int64 or None: the index entity whose stored vector an entity took (-1: encoded),
                  valid for the index ``rows_of`` only (the engine compares it by identity)
    prior         PassagePrior or None: the dense prior of a chain's later round (chain.py), for the
                  passages of the index (or shard) it was made for
    rerank_tokens rerank.scoring.QuestionTokens or None: the questions' token ids for the reranker
                  (set by LinearRAG.encode_queries when its config has rerank)
    """

    query_emb: torch.Tensor
    entity_emb: torch.Tensor
    entity_owner: torch.Tensor
    entity_text: list
    entity_rows: Optional[torch.Tensor] = None
    rows_of: object = field(default=None, repr=False, compare=False)
    prior: Optional[PassagePrior] = field(default=None, repr=False, compare=False)
    rerank_tokens: object = field(default=None, repr=False, compare=False)

    @property
    def batch_size(self) -> int:
        return int(self.query_emb.shape[0])

    def has_entities(self) -> torch.Tensor:
        """[B] bool on entity_owner's device: the questions with at least one entity (the others are answered by
        dense retrieval)."""
        owner = self.entity_owner
        return torch.zeros(self.batch_size, dtype=torch.bool, device=owner.device).index_fill_(0, owner, True)

    def select(self, rows) -> "EncodedQueries":
        """The questions at positions ``rows`` (distinct, in that order), with their entities in their
        order here and owners renumbered from 0; the stored-vector rows (entity_rows) of those entities come
        along, so that a chunk of a large batch seeds from them as the whole batch would."""
        rows = [int(r) for r in rows]
        new = torch.full((self.batch_size,), -1, dtype=torch.int64, device=self.entity_owner.device)
        new[torch.tensor(rows, dtype=torch.int64, device=new.device)] = torch.arange(len(rows), device=new.device)
        owner = new[self.entity_owner]
        keep = torch.nonzero(owner >= 0).flatten()
        return EncodedQueries(
            self.query_emb.index_select(0, torch.tensor(rows, dtype=torch.int64, device=self.query_emb.device)),
            self.entity_emb.index_select(0, keep.to(self.entity_emb.device)), owner[keep],
            [self.entity_text[i] for i in keep.tolist()] if self.entity_text else [],
            None if self.entity_rows is None else self.entity_rows.index_select(0, keep.to(self.entity_rows.device)),
            self.rows_of,
            prior=None if self.prior is None else self.prior.select(new),
            rerank_tokens=None if self.rerank_tokens is None else self.rerank_tokens.select(
                torch.tensor(rows, dtype=torch.int64)),
        )

    def slice(self, start: int, stop: int) -> "EncodedQueries":
        """Questions start .. stop - 1 (see select)."""
        return self.select(range(start, stop))

    def to(self, device) -> "EncodedQueries":
        return EncodedQueries(
            self.query_emb.to(device), self.entity_emb.to(device), self.entity_owner.to(device), self.entity_text,
            None if self.entity_rows is None else self.entity_rows.to(device), self.rows_of,
            None if self.prior is None else self.prior.to(device),
            None if self.rerank_tokens is None else self.rerank_tokens.to(device),
        )


class Retrieved(NamedTuple):
    """Top-k passages per question: row indices into the index's passages, best first, and scores.

    indices [B, k] int64, scores [B, k] float32, with k = min(top_k, number of passages).
    """

    indices: torch.Tensor
    scores: torch.Tensor

    def head(self, k: int) -> "Retrieved":
        """The first k passages of each question (all of them when there are fewer)."""
        return Retrieved(self.indices[:, :k], self.scores[:, :k])
