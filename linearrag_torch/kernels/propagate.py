"""Eq. 5 (mode ``paper``), one propagation step, on the entries it touches.

Written as matrices the step is SpMM, sigma product, SpMM, threshold mask, element-wise max: dense
[S, B] sigma (a GEMM of S x D x B) and [S, B] / [E, B] intermediates, most of them zeros since only
the sentences of active entities carry mass. Here the step walks the CSR rows of the active entities
and of the sentences they reach, computes sigma only for those (sentence, question) pairs and
updates only the entities it reaches: O(touched entries), no [S, B] tensor at all.
"""
from __future__ import annotations

import torch

from .segment_topk import gather_sigma, segment_positions


def propagate_step(M: torch.Tensor, MT: torch.Tensor, a: torch.Tensor, sigma, delta: float, where=None) -> torch.Tensor:
    """One step of eq. 5 with pruning, for a [E, B] (M [S, E] and MT = Mᵀ [E, S] torch CSR):

        x  = M (a ⊙ [a >= delta])            [S, B]
        y  = Mᵀ (sigma ⊙ x)                   [E, B]
        a' = max(y ⊙ [y >= delta], a)         (element-wise; an entity y does not reach has y = 0)

    Parameters
    ----------
    M : torch.Tensor
        [S, E] torch CSR: M[s, e] = 1 if sentence s mentions entity e.
    MT : torch.Tensor
        Mᵀ [E, S], torch CSR.
    a : torch.Tensor
        The activations [E, B] (an entity per row, a question per column).
    sigma : tuple of torch.Tensor
        (sentence_emb [S, D], query_emb [B, D]): sigma[s, b] is their dot product, computed for the
        (sentence, question) pairs reached only (see ``gather_sigma``).
    delta : float
        The activation threshold.
    where : optional
        None for a whole index. On a shard of the sharded engine (distributed/engine.py), where its rows live: M
        and MT are then the shard's (sentence rows it owns, local entity columns), ``where.held(e, b, av)`` keeps
        the active entries of the entities it holds as local rows, ``where.global_entities`` maps local entity
        columns to global ids and ``where.gather_rows`` gathers every rank's part of y before it is summed.

    Returns
    -------
    torch.Tensor
        a' [E, B], a new tensor.

    Examples
    --------
    Sentence 0 mentions entities 0 and 1, sentence 1 entity 1; entity 0 is active:

    >>> import torch
    >>> from linearrag_torch.kernels import propagate_step
    >>> M = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    >>> sigma = (torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([[0.8, 0.6]]))
    >>> a = torch.tensor([[1.0], [0.0]])
    >>> propagate_step(M.to_sparse_csr(), M.T.contiguous().to_sparse_csr(), a, sigma, 0.4).flatten()
    tensor([1.0000, 0.8000])
    """
    E, B = a.shape
    a_new = a.clamp(min=0)  # untouched entries: max(0 ⊙ [0 >= delta], a) = max(0, a)
    e, b = ((a >= delta) & (a != 0)).nonzero(as_tuple=True)
    if e.numel() == 0:
        return a_new
    av = a[e, b]
    if where is not None:
        e, b, av = where.held(e, b, av)
    # x = M (a ⊙ [a >= delta]) on the sentences of the active entities: rows e of Mᵀ
    owner, pos, _ = segment_positions(MT.crow_indices(), e)
    key = MT.col_indices()[pos].to(torch.int64) * B + b[owner]
    key, inv = torch.unique(key, sorted=True, return_inverse=True)
    x = torch.zeros(key.numel(), dtype=a.dtype, device=a.device).index_add_(0, inv, MT.values()[pos] * av[owner])
    s, sb = key // B, key % B
    z = x * gather_sigma(sigma, s, sb)
    # y = Mᵀ z on the entities of those sentences: rows s of M
    owner2, pos2, _ = segment_positions(M.crow_indices(), s)
    flat = M.col_indices()[pos2].to(torch.int64)
    parts = M.values()[pos2] * z[owner2]
    if where is not None:
        flat = where.global_entities(flat)
    flat = flat * B + sb[owner2]
    if where is not None:
        flat, parts = where.gather_rows(flat), where.gather_rows(parts)
    flat, inv2 = torch.unique(flat, sorted=True, return_inverse=True)
    y = torch.zeros(flat.numel(), dtype=a.dtype, device=a.device).index_add_(0, inv2, parts)
    y = y * (y >= delta)
    a_new.view(-1)[flat] = torch.maximum(y, a.reshape(-1)[flat])
    return a_new
