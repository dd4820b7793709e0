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
    """A batch of B questions after NER and encoding (the input of both backends; ``LinearRAG.encode_queries``
    makes it).

    Parameters
    ----------
    query_emb : torch.Tensor
        [B, D] float32, L2-normalised question embeddings.
    entity_emb : torch.Tensor
        [Q, D] float32, L2-normalised embeddings of the questions' entities (lower-cased).
    entity_owner : torch.Tensor
        [Q] int64, the question (0..B-1) each entity belongs to.
    entity_text : list of str
        The Q entities' texts, for diagnostics.
    entity_rows : torch.Tensor, optional
        [Q] int64: the index entity whose stored vector an entity took (-1: encoded), valid for the index
        ``rows_of`` only (the engine compares it by identity).
    rows_of : TriGraphIndex, optional
        The index ``entity_rows`` refers to.
    prior : PassagePrior, optional
        The dense prior of a chain's later round (chain.py), for the passages of the index (or shard) it was
        made for.
    rerank_tokens : rerank.scoring.QuestionTokens, optional
        The questions' token ids for the reranker (set by LinearRAG.encode_queries when its config has rerank).

    Examples
    --------
    >>> enc = rag.encode_queries(["Who directed Blue River?"])
    >>> enc.batch_size, enc.entity_text
    (1, ['blue river'])
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
        """B, the number of questions."""
        return int(self.query_emb.shape[0])

    def has_entities(self) -> torch.Tensor:
        """Which questions have at least one entity (the others are answered by dense retrieval).

        Returns
        -------
        torch.Tensor
            [B] bool, on entity_owner's device.
        """
        owner = self.entity_owner
        return torch.zeros(self.batch_size, dtype=torch.bool, device=owner.device).index_fill_(0, owner, True)

    def select(self, rows) -> "EncodedQueries":
        """The questions at some positions, with their entities in their order here and owners renumbered from
        0; the stored-vector rows (entity_rows) of those entities come along, so that a chunk of a large batch
        seeds from them as the whole batch would.

        Parameters
        ----------
        rows : iterable of int
            The positions (distinct), in the order the new batch takes them.

        Returns
        -------
        EncodedQueries
            The selected questions.
        """
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
        """Questions start .. stop - 1 (see select).

        Parameters
        ----------
        start, stop : int
            The first position and the one after the last.

        Returns
        -------
        EncodedQueries
            Those questions.
        """
        return self.select(range(start, stop))

    def to(self, device) -> "EncodedQueries":
        """The batch with its tensors on another device.

        Parameters
        ----------
        device : str or torch.device
            Where the tensors go.

        Returns
        -------
        EncodedQueries
            A new batch (tensors already there are shared).
        """
        return EncodedQueries(
            self.query_emb.to(device), self.entity_emb.to(device), self.entity_owner.to(device), self.entity_text,
            None if self.entity_rows is None else self.entity_rows.to(device), self.rows_of,
            None if self.prior is None else self.prior.to(device),
            None if self.rerank_tokens is None else self.rerank_tokens.to(device),
        )


class Retrieved(NamedTuple):
    """Top-k passages per question: row indices into the index's passages, best first, and scores.

    Attributes
    ----------
    indices : torch.Tensor
        [B, k] int64 passage rows, best first, with k = min(top_k, number of passages).
    scores : torch.Tensor
        [B, k] float32, their scores.

    Examples
    --------
    >>> import torch
    >>> from linearrag_torch import Retrieved
    >>> r = Retrieved(torch.tensor([[2, 0, 1]]), torch.tensor([[0.5, 0.3, 0.2]]))
    >>> r.head(2).indices.tolist()
    [[2, 0]]
    """

    indices: torch.Tensor
    scores: torch.Tensor

    def head(self, k: int) -> "Retrieved":
        """The first k passages of each question (all of them when there are fewer).

        Parameters
        ----------
        k : int
            How many.

        Returns
        -------
        Retrieved
            The first k of each row.
        """
        return Retrieved(self.indices[:, :k], self.scores[:, :k])
