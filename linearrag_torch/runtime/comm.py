"""The collectives of the graph round (torch.distributed), counted per phase; in one process every collective is
the identity (ONE_PROCESS), which is how the single-process engine runs the same round as a shard
(retrieval/round.py)."""
from __future__ import annotations

import time

import torch


class Comm:
    """The collectives the sharded engine uses, on the default process group (``group=None``) or, with
    ``dist=False``, a single process (every collective is the identity). Counts the bytes each rank
    contributes and the seconds spent inside collectives, per phase (``stats``)."""

    def __init__(self, dist: bool = True):
        self.dist = dist
        if dist:
            import torch.distributed as td

            self.td = td
            self.rank, self.world = td.get_rank(), td.get_world_size()
        else:
            self.td, self.rank, self.world = None, 0, 1
        self.phase = "other"
        self.stats: dict = {}

    def _count(self, nbytes: int, seconds: float, calls: int = 1) -> None:
        s = self.stats.setdefault(self.phase, {"calls": 0, "bytes": 0, "seconds": 0.0})
        s["calls"] += calls
        s["bytes"] += int(nbytes)
        s["seconds"] += seconds

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """In place; returns x."""
        if self.world == 1:
            return x
        t0 = time.perf_counter()
        ops = {"sum": self.td.ReduceOp.SUM, "max": self.td.ReduceOp.MAX}
        self.td.all_reduce(x, op=ops[op])
        self._count(x.numel() * x.element_size(), time.perf_counter() - t0)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[world, *x.shape]: every rank's x (same shape on every rank)."""
        if self.world == 1:
            return x[None]
        t0 = time.perf_counter()
        out = torch.empty((self.world, *x.shape), dtype=x.dtype, device=x.device)
        self.td.all_gather_into_tensor(out, x.contiguous()) if x.is_cuda else \
            self.td.all_gather(list(out.unbind(0)), x.contiguous())
        self._count(x.numel() * x.element_size(), time.perf_counter() - t0)
        return out

    def all_gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The rows of every rank's x [n_rank, ...] concatenated in rank order (n_rank may differ)."""
        if self.world == 1:
            return x
        n = self.all_gather(torch.tensor([x.shape[0]], dtype=torch.int64, device=x.device)).view(-1)
        most = int(n.max())
        pad = torch.zeros((most, *x.shape[1:]), dtype=x.dtype, device=x.device)
        pad[:x.shape[0]] = x
        out = self.all_gather(pad)
        return torch.cat([out[r, :int(n[r])] for r in range(self.world)])

    def merge_topk(self, vals: torch.Tensor, ids: torch.Tensor):
        """The best k of every rank's best k per row: ``vals``, ``ids`` [n, k] float64 (each row best first, ties
        to the lower id; -inf and inf where a rank has fewer) -> the same [n, k] over every rank's rows: values
        descending, ties to the lower id. The identity in one process (its rows are in that order already)."""
        if self.world == 1:
            return vals, ids
        n, k = vals.shape
        both = self.all_gather(torch.stack([vals, ids]))  # [world, 2, n, k]
        v = both[:, 0].permute(1, 0, 2).reshape(n, -1)
        i = both[:, 1].permute(1, 0, 2).reshape(n, -1)
        o = torch.argsort(i, dim=1, stable=True)
        o = o.gather(1, torch.argsort(-v.gather(1, o), dim=1, stable=True))[:, :k]
        return v.gather(1, o), i.gather(1, o)

    def top_k(self, idx: torch.Tensor, vals: torch.Tensor, k: int):
        """The best ``k`` per row of every rank's ranked lists: ``idx`` [B, k_r] global rows and ``vals`` [B, k_r]
        (each row best first, ties to the lower row; k_r <= k) -> (indices int64 [B, k], values [B, k]), values
        descending, ties to the lower row. The identity in one process (where k_r is k)."""
        if self.world == 1:
            return idx, vals
        B, kl = idx.shape
        pad_i = torch.full((B, k), float("inf"), dtype=torch.float64, device=idx.device)
        pad_v = torch.full((B, k), float("-inf"), dtype=torch.float64, device=idx.device)
        pad_i[:, :kl], pad_v[:, :kl] = idx.double(), vals.double()
        v, i = self.merge_topk(pad_v, pad_i)
        return i.to(torch.int64), v.to(vals.dtype)

    def best_of(self, best: torch.Tensor, arg: torch.Tensor):
        """The largest ``best`` of every rank per row, and the lowest ``arg`` among the ranks reaching it (``best``
        [n] the rank's own maximum, -inf where it has none; ``arg`` [n] int64 the global index reaching it). The
        identity in one process."""
        if self.world == 1:
            return best, arg
        both = self.all_gather(torch.stack([best.double(), arg.double()]))  # [world, 2, n]
        vals, args = both[:, 0], both[:, 1]
        top = vals.max(0).values
        args = torch.where(vals == top, args, torch.full_like(args, float("inf")))
        return top.to(best.dtype), args.min(0).values.to(torch.int64)

    def all_gather_object(self, obj) -> list:
        if self.world == 1:
            return [obj]
        t0 = time.perf_counter()
        out = [None] * self.world
        self.td.all_gather_object(out, obj)
        self._count(0, time.perf_counter() - t0)
        return out

    def broadcast_object(self, obj, src: int = 0):
        if self.world == 1:
            return obj
        box = [obj]
        self.td.broadcast_object_list(box, src=src)
        return box[0]


ONE_PROCESS = Comm(dist=False)  # the identity communicator of a single process
