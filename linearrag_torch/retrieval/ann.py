"""The nearest-vector stage (``RetrievalConfig.ann``): an approximate nearest-neighbour index from FAISS
over the entity vectors (eq. 3's nearest entity per question entity) and the passage vectors (the top
``reset_passages`` passages of the sparse reset, eq. 7), opt-in; ``ann: exact`` (the default) keeps the one
product over every vector.

Three index kinds; the candidates they return are rescored exactly from the engine's own vectors (read only for
them: mapped from an index folder, the rest of the vectors stay on disk), so a score is never the quantised one:

- ``ivf``: an inverted file (k-means into ``ann_lists`` lists, about sqrt(rows) by default) of 8-bit scalar-quantised
  vectors (a quarter of float32's memory); a search reads the ``ann_probe`` lists whose centroids are nearest to the
  question.
- ``ivfpq``: the same inverted file of product-quantised codes (a byte for each PQ_DIMS_PER_CODE dimensions: 48
  bytes for a 384-d vector, 1/32 of float32's memory), whose coarser scores are made up for by more candidates rescored
  (PQ_CANDIDATES per question entity, PQ_PASSAGE_OVERSAMPLE): what ``ann: auto`` takes, so that a corpus of
  millions of passages holds its vectors' codes in memory and the vectors themselves on disk.
- ``hnsw``: a navigable small-world graph (32 links per vector) of 8-bit codes; a search keeps ``ann_probe``
  candidates.

An index is built on first use per engine graph and vector matrix, from a seeded sample (the same vectors give
the same index), and with ``ann_cache`` written to that folder by ``faiss.write_index`` (FAISS's own binary
format, not pickle) beside a JSON file of its settings and a fingerprint of the vectors; a later load whose
settings and fingerprint match reads it back instead of building. One search call per batch (every question,
or every question entity, at once); no loop over questions.

Devices: FAISS here runs on the CPU (the faiss-cpu wheel of the ``ann`` extra). A graph on another device keeps
the exact product (a search on the host would move every batch's vectors off the device and back), with a
warning once per graph.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import RetrievalConfig
from ..kernels import gather_sigma
from ..kernels.backends import faiss_available
from .activation import nearest_entities as exact_nearest

# candidates of the ANN per question entity rescored exactly for eq. 3's nearest entity (the quantised scores
# can swap near neighbours; the exact cosines of a few candidates cannot)
ENTITY_CANDIDATES = 8
# the passage search asks for m + m / this + ENTITY_CANDIDATES passages, and the exact cosines keep the top m
# (the quantised scores can swap passages across the m-th place)
PASSAGE_OVERSAMPLE = 4
# ivfpq: bytes of code a dimension (8-bit codes of 8-dimensional sub-vectors: 1/32 of float32), and, its scores
# being coarser than 8-bit ones, more candidates rescored (measured: docs/benchmarks/scaling.md)
PQ_DIMS_PER_CODE = 8
PQ_CANDIDATES = 32
PQ_PASSAGE_OVERSAMPLE = 2
# vectors a product quantiser trains its 256 centroids a sub-vector on (FAISS warns below 39 a centroid)
PQ_TRAIN = 256 * 40
HNSW_LINKS = 32
HNSW_EF_CONSTRUCTION = 40
# vectors the IVF's k-means trains on, per list (FAISS warns below 39)
TRAIN_PER_LIST = 40
ADD_ROWS = 1 << 20  # vectors converted to float32 and added per call while building

_stages: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # engine graph -> {key: AnnIndex}
_warned: "weakref.WeakSet" = weakref.WeakSet()
_warned_auto: "weakref.WeakSet" = weakref.WeakSet()  # graphs told that ann auto found no FAISS


def available() -> bool:
    """Whether FAISS can be imported (the ``ann`` extra)."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


def _faiss():
    try:
        import faiss
    except ImportError as err:
        raise ImportError("RetrievalConfig.ann 'ivf' / 'ivfpq' / 'hnsw' needs FAISS: pip install 'linearrag_torch[ann]' "
                          "(faiss-cpu), or set ann: exact") from err
    return faiss


def fingerprint(vectors: torch.Tensor) -> str:
    """A short hash of a matrix's shape, dtype and 64 of its rows (evenly spaced): what a cached index is
    checked against (a changed index, e.g. after ``add``, has other rows or other vectors)."""
    n = vectors.shape[0]
    rows = torch.linspace(0, max(n - 1, 0), min(n, 64)).long() if n else torch.zeros(0, dtype=torch.long)
    sample = vectors.index_select(0, rows.to(vectors.device)).to("cpu", torch.float32).contiguous()
    h = hashlib.sha1(f"{tuple(vectors.shape)} {vectors.dtype}".encode())
    h.update(sample.numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass
class AnnIndex:
    """One FAISS index over a matrix's rows (inner product: the vectors are unit length, so it ranks by cosine).

    Parameters
    ----------
    kind : str
        "ivf", "ivfpq" or "hnsw".
    index : faiss.Index
        The index.
    rows, dim : int
        The matrix it was built on.
    lists : int
        Inverted lists (ivf; 0 for hnsw).
    build_s : float
        Seconds its build (or its read from the cache) took.
    from_cache : bool
        Whether it was read from ``ann_cache``.
    """

    kind: str
    index: object
    rows: int
    dim: int
    lists: int = 0
    build_s: float = 0.0
    from_cache: bool = False
    searches: list = field(default_factory=list, repr=False)  # (rows, k, seconds) of each search

    @staticmethod
    def build(vectors: torch.Tensor, kind: str, lists: int = 0, seed: int = 0) -> "AnnIndex":
        """A new index over ``vectors`` [N, D] (any float dtype; added as float32 in blocks).

        Parameters
        ----------
        vectors : torch.Tensor
            The rows to index (unit length).
        kind : {"ivf", "ivfpq", "hnsw"}
            The index kind (module docstring).
        lists : int
            ivf, ivfpq: inverted lists (0: round(sqrt(N)), at most N / TRAIN_PER_LIST; at least 1, at most N).
        seed : int
            Seed of the training sample.

        Returns
        -------
        AnnIndex
        """
        faiss = _faiss()
        t0 = time.perf_counter()
        N, D = vectors.shape
        faiss.omp_set_num_threads(torch.get_num_threads())
        qt, ip = faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
        if kind in ("ivf", "ivfpq"):
            # automatic: about sqrt(N), and at least TRAIN_PER_LIST vectors a list for the k-means
            lists = min(lists, N) if lists else min(round(math.sqrt(N)), N // TRAIN_PER_LIST)
            lists = max(lists, 1)
            n_train = min(N, max(TRAIN_PER_LIST * lists, 1024))
            if kind == "ivf":
                index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(D), D, lists, qt, ip)
            else:
                # 8-bit codes need 256 centroids a sub-vector: fewer bits where fewer vectors train them
                bits = max(1, min(8, int(math.log2(max(N, 2) / 40)))) if N < PQ_TRAIN else 8
                index = faiss.IndexIVFPQ(faiss.IndexFlatIP(D), D, lists, pq_codes(D), bits, ip)
                n_train = min(N, max(n_train, PQ_TRAIN))
                index.pq.cp.seed = seed
            index.cp.seed = seed
        elif kind == "hnsw":
            lists = 0
            index = faiss.IndexHNSWSQ(D, qt, HNSW_LINKS, ip)
            index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
            n_train = min(N, 1 << 16)
        else:
            raise ValueError(f"ann kind must be 'ivf', 'ivfpq' or 'hnsw', got {kind!r}")
        gen = torch.Generator().manual_seed(seed)
        sample = torch.randperm(N, generator=gen)[:n_train].sort().values
        index.train(_host32(vectors.index_select(0, sample.to(vectors.device))))
        for i in range(0, N, ADD_ROWS):
            index.add(_host32(vectors[i:i + ADD_ROWS]))
        return AnnIndex(kind, index, N, D, lists, time.perf_counter() - t0)

    def search(self, queries: torch.Tensor, k: int, probe: int) -> tuple:
        """The ``k`` rows of largest inner product with each query, by the index.

        Parameters
        ----------
        queries : torch.Tensor
            [Q, D] (any float dtype, on the CPU).
        k : int
            Rows per query.
        probe : int
            ivf: lists searched (nprobe); hnsw: candidates kept (efSearch, raised to ``k``).

        Returns
        -------
        scores : torch.Tensor
            float32 [Q, k], the quantised inner products (-inf past the rows found).
        ids : torch.Tensor
            int64 [Q, k]: the rows, best first; -1 past the rows found (an ivf search of few lists can find
            fewer than ``k``).
        """
        faiss = _faiss()
        faiss.omp_set_num_threads(torch.get_num_threads())
        t0 = time.perf_counter()
        # the probe goes with the call (SearchParameters), not into the shared index: concurrent searches with
        # different probes (two requests' settings) cannot see each other's
        if self.kind in ("ivf", "ivfpq"):
            params = faiss.SearchParametersIVF(nprobe=min(probe, self.index.nlist))
        else:
            params = faiss.SearchParametersHNSW(efSearch=max(probe, k))
        q = _host32(queries)
        if q.shape[0] == 0 or k == 0:
            dist = torch.zeros((q.shape[0], k), dtype=torch.float32)
            return dist, torch.full((q.shape[0], k), -1, dtype=torch.int64)
        dist, ids = self.index.search(q, k, params=params)
        self.searches.append((q.shape[0], k, time.perf_counter() - t0))
        ids = torch.from_numpy(ids).to(torch.int64)
        dist = torch.from_numpy(dist)
        return dist.masked_fill_(ids < 0, float("-inf")), ids

    def nbytes(self) -> int:
        """Bytes of the index (its codes, lists or links), as FAISS serialises it."""
        faiss = _faiss()
        return int(faiss.serialize_index(self.index).nbytes)

    def save(self, path: Path, meta: dict) -> None:
        """Write the index to ``path`` (faiss.write_index) and ``meta`` to path + ".json"."""
        faiss = _faiss()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        faiss.write_index(self.index, str(tmp))
        os.replace(tmp, path)
        side = path.with_name(path.name + ".json")
        side.write_text(json.dumps(meta, indent=1, sort_keys=True))

    @staticmethod
    def load(path: Path, meta: dict) -> "AnnIndex | None":
        """The index at ``path`` when its JSON file holds ``meta`` (else None: a stale or foreign file)."""
        faiss = _faiss()
        path = Path(path)
        side = path.with_name(path.name + ".json")
        if not (path.is_file() and side.is_file()):
            return None
        try:
            stored = json.loads(side.read_text())
        except (OSError, ValueError):
            return None
        if stored != meta:
            return None
        t0 = time.perf_counter()
        index = faiss.read_index(str(path))
        if index.ntotal != meta["rows"] or index.d != meta["dim"]:
            raise ValueError(f"{path}: the FAISS index holds {index.ntotal} x {index.d} vectors, its JSON file says "
                             f"{meta['rows']} x {meta['dim']}")
        lists = int(index.nlist) if meta["kind"] in ("ivf", "ivfpq") else 0
        return AnnIndex(meta["kind"], index, meta["rows"], meta["dim"], lists, time.perf_counter() - t0, True)


def pq_codes(dim: int) -> int:
    """Sub-vectors of an ivfpq code for ``dim``-dimensional vectors: dim / PQ_DIMS_PER_CODE, or the largest divisor
    of dim below it (FAISS's product quantiser splits a vector into equal parts)."""
    m = max(1, dim // PQ_DIMS_PER_CODE)
    while dim % m:
        m -= 1
    return m


def entity_candidates(cfg: RetrievalConfig) -> int:
    """Candidates of the ANN rescored exactly per question entity (eq. 3's nearest entity)."""
    return PQ_CANDIDATES if cfg.ann == "ivfpq" else ENTITY_CANDIDATES


def passage_search(m: int, cfg: RetrievalConfig) -> int:
    """Passages the ANN is asked for per question, of which the exact cosines keep the top ``m``."""
    if cfg.ann == "ivfpq":
        return m + m // PQ_PASSAGE_OVERSAMPLE + PQ_CANDIDATES
    return m + m // PASSAGE_OVERSAMPLE + ENTITY_CANDIDATES


def _host32(x: torch.Tensor):
    """A contiguous float32 numpy view (or copy) of ``x`` on the CPU, for FAISS."""
    return x.detach().to("cpu", torch.float32).contiguous().numpy()


def ready(device) -> bool:
    """Whether ``ann: auto`` may take the ANN stage on ``device``: the CPU, with FAISS installed (the cached check of
    kernels.backends: this is asked once a batch)."""
    return torch.device(device).type == "cpu" and faiss_available()


def gathers_only(index, device) -> bool:
    """Whether the index's own settings (``index.retrieval_config``, what LinearRAG queries with by default) take the
    ANN stage at its size on ``device``: its vectors are then read row by row (the candidates rescored, eq. 4's
    sigma), never multiplied whole, and need no float32 copy."""
    return ready(device) and index.retrieval_config.for_corpus(index.num_passages, ann_ready=True).ann != "exact"


def for_graph(cfg: RetrievalConfig, graph) -> RetrievalConfig:
    """``cfg.for_corpus`` for ``graph``'s index, its ``ann: auto`` taking the ANN stage where ``ready``. Where auto
    would take it but FAISS is missing, a warning once per graph: every question then scans every vector."""
    passages = graph.index.num_passages
    got = cfg.for_corpus(passages, ann_ready=cfg.ann == "auto" and ready(graph.device))
    if (cfg.ann == "auto" and got.ann == "exact" and graph.device.type == "cpu" and graph not in _warned_auto
            and cfg.for_corpus(passages, ann_ready=True).ann != "exact"):
        _warned_auto.add(graph)
        warnings.warn(f"ann 'auto' at {passages:,} passages takes FAISS's ANN stage, and FAISS is not installed: every "
                      "question scans every entity and passage vector instead (slower as the corpus grows); "
                      "pip install 'linearrag_torch[ann]', or set ann 'exact' to choose this", RuntimeWarning,
                      stacklevel=3)
    return got


def stage(graph, which: str, cfg: RetrievalConfig) -> AnnIndex | None:
    """The ANN index of ``graph``'s ``which`` vectors ("entity" or "passage") for ``cfg``, built (or read from
    cfg.ann_cache) on first use; None when cfg.ann is "exact" or the graph is not on the CPU (then with a
    warning once: the exact product runs).

    Parameters
    ----------
    graph : engine.DeviceGraph
        The engine's graph (its ``entity_emb`` / ``passage_emb`` and ``device``).
    which : {"entity", "passage"}
        The vectors.
    cfg : RetrievalConfig
        ``ann``, ``ann_lists``, ``ann_cache``.

    Returns
    -------
    AnnIndex or None
    """
    if cfg.ann in ("exact", "auto"):  # auto: not made concrete (RetrievalConfig.for_corpus), the exact product
        return None
    _faiss()  # asked for: a missing FAISS is an error, not a silent exact run
    if graph.device.type != "cpu":
        if graph not in _warned:
            _warned.add(graph)
            warnings.warn(f"ann={cfg.ann!r}: FAISS runs on the CPU here and the engine on {graph.device}; the "
                          "exact product runs instead (a search on the host would move each batch off the device)",
                          RuntimeWarning, stacklevel=3)
        return None
    vectors = graph.entity_emb if which == "entity" else graph.passage_emb
    if vectors.shape[0] == 0:
        return None
    lists = cfg.ann_lists if cfg.ann in ("ivf", "ivfpq") else 0
    key = (which, cfg.ann, lists, cfg.ann_cache)
    built = _stages.setdefault(graph, {})
    got = built.get(key)
    if got is not None and got.rows == vectors.shape[0]:
        return got
    meta = {"kind": cfg.ann, "which": which, "lists": lists, "rows": int(vectors.shape[0]), "dim": int(vectors.shape[1]),
            "fingerprint": fingerprint(vectors), "hnsw_links": HNSW_LINKS if cfg.ann == "hnsw" else 0,
            "storage": f"PQ{pq_codes(vectors.shape[1])}" if cfg.ann == "ivfpq" else "SQ8"}
    path = None
    if cfg.ann_cache:
        path = Path(cfg.ann_cache) / f"{which}-{cfg.ann}-{lists}-{meta['rows']}x{meta['dim']}-{meta['fingerprint']}.faiss"
        got = AnnIndex.load(path, meta)
    if got is None:
        got = AnnIndex.build(vectors, cfg.ann, lists)
        if path is not None:
            got.save(path, meta)
    built[key] = got
    return got


def built(graph) -> dict:
    """The ANN indexes built for ``graph`` so far: {(which, kind, lists, cache): AnnIndex}."""
    return dict(_stages.get(graph, {}))


def nearest_entities(graph, query_entity_emb: torch.Tensor, known: torch.Tensor | None, cfg: RetrievalConfig):
    """Eq. 3's nearest graph entity of each question entity by the ANN (activation.nearest_entities' answer,
    approximate): (largest cosine [Q] in the entity vectors' dtype, entity index [Q]); None when
    ``stage`` is None (the caller runs the exact scan).

    The index proposes ENTITY_CANDIDATES entities per question entity (one search for the batch); their exact
    cosines (float32 sums rounded to the vectors' dtype, as the product rounds) choose, equal ones by the lower
    index. ``known``: as for activation.nearest_entities (those rows are their own answer, not searched). A row
    for which the index finds nothing (an ivf search whose lists are empty) takes the exact scan.
    """
    st = stage(graph, "entity", cfg)
    if st is None:
        return None
    emb = graph.entity_emb
    q = query_entity_emb.to(emb.dtype)
    Q, E = q.shape[0], emb.shape[0]
    arg = torch.full((Q,), -1, dtype=torch.int64, device=emb.device)
    if known is not None and known.numel() == Q:
        known = known.to(emb.device)
        arg = torch.where(known >= 0, known, arg)
    ask = torch.nonzero(arg < 0).flatten()
    best = torch.empty(Q, dtype=emb.dtype, device=emb.device)
    hit = torch.nonzero(arg >= 0).flatten()
    best[hit] = _dots(emb, arg[hit], q[hit])
    if ask.numel():
        k = min(entity_candidates(cfg), E)
        _, ids = st.search(q[ask], k, cfg.ann_probe)
        ids = ids.to(emb.device)
        found = ids >= 0
        # sorted by index, so that the first largest cosine is the lowest index (-1 sorts last as E)
        ids = torch.where(found, ids, torch.full_like(ids, E)).sort(dim=1).values
        found = ids < E
        cos = _dots(emb, ids.clamp(max=E - 1).reshape(-1), q[ask].repeat_interleave(k, 0)).view(-1, k)
        cos = torch.where(found, cos, torch.full_like(cos, float("-inf")))
        b, j = cos.max(dim=1)
        best[ask], arg[ask] = b, ids.gather(1, j[:, None]).squeeze(1)
        lost = ask[~found.any(dim=1)]
        if lost.numel():  # nothing found: the exact scan for those rows
            best[lost], arg[lost] = exact_nearest(emb, q[lost])
    return best, arg


def _dots(emb: torch.Tensor, rows: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """<emb[rows[i]], q[i]> summed in float32 and rounded to emb's dtype (what the product over ``emb`` gives
    up to the order of its sums)."""
    if rows.numel() == 0:
        return torch.zeros(0, dtype=emb.dtype, device=emb.device)
    return (emb.index_select(0, rows).float() * q.float()).sum(1).to(emb.dtype)


@dataclass
class PassageCandidates:
    """Each question's top passages by the ANN with their cosines, as index lists sorted by (question, rank).

    ``passage``, ``question``: int64 [n]; ``cos``: float32 [n] the exact cosines (the engine's vectors);
    ``prior``: float32 [n] eq. 7's dense value there (``cos``, or a chain round's prior applied to it);
    ``rank``: int64 [n], 0 = the question's best by ``prior``; ``low``: float32 [B], the global min-max's low end
    (the smallest prior value over all passages, by the ANN: the best match of the negated question).
    """

    passage: torch.Tensor
    question: torch.Tensor
    cos: torch.Tensor
    prior: torch.Tensor
    rank: torch.Tensor
    low: torch.Tensor


def passage_candidates(graph, query_emb: torch.Tensor, m: int, cfg: RetrievalConfig, prior=None,
                       low: bool = True) -> PassageCandidates | None:
    """The top ``m`` passages of each question by the ANN (one search for the batch, of a few more than ``m``:
    PASSAGE_OVERSAMPLE), rescored exactly, and
    (with ``low``) the low end of the global min-max (a second search, of the negated questions, for one
    passage each). ``prior``: a chain round's queries.PassagePrior: its floor and entries applied to the
    cosines, its entries' passages added to the candidates (they may rise into the top m). None when ``stage``
    is None.
    """
    st = stage(graph, "passage", cfg)
    if st is None:
        return None
    emb = graph.passage_emb
    P, dev = emb.shape[0], emb.device
    B = query_emb.shape[0]
    q = query_emb.float()
    m = min(m, P)
    _, ids = st.search(q, min(passage_search(m, cfg), P), cfg.ann_probe)
    ids = ids.to(dev)
    col = torch.arange(B, device=dev)[:, None].expand_as(ids)
    ok = ids >= 0
    keys = col[ok] * P + ids[ok]
    if prior is not None and prior.row.numel():
        keys = torch.cat([keys, prior.col.to(dev) * P + prior.row.to(dev)])
    keys = torch.unique(keys)  # sorted: by question, then passage
    qb, p = torch.div(keys, P, rounding_mode="floor"), keys % P
    cos = _cosines(emb, p, q, qb)
    val = cos
    if prior is not None:
        val = cos.clamp(min=prior.floor)
        if prior.row.numel():
            pk = prior.col.to(dev) * P + prior.row.to(dev)
            at = torch.searchsorted(keys, pk)
            val = val.clone()
            val[at] = torch.maximum(val[at], prior.val.to(dev, val.dtype))
    order, rank = rank_within(qb, val, B)
    keep = order[rank < m]
    p, qb, cos, val, rank = p[keep], qb[keep], cos[keep], val[keep], rank[rank < m]
    if low:
        # the negated questions' best matches, rescored: one for 8-bit codes, PQ_CANDIDATES for ivfpq's coarser ones
        k_far = min(PQ_CANDIDATES if cfg.ann == "ivfpq" else 1, P)
        _, far = st.search(-q, k_far, cfg.ann_probe)
        far = far.to(dev)
        cols = torch.arange(B, device=dev).repeat_interleave(k_far)
        lo = _cosines(emb, far.clamp(min=0).flatten(), q, cols).view(B, k_far)
        lo = torch.where(far >= 0, lo, torch.full_like(lo, float("inf"))).amin(dim=1)
        if prior is not None:
            lo = lo.clamp(min=prior.floor)
    else:
        lo = torch.full((B,), float("inf"), dtype=torch.float32, device=dev)
    # never above a candidate's value: the min-max keeps every value in [0, 1]
    lo = torch.minimum(lo, torch.full((B,), float("inf"), device=dev).scatter_reduce_(0, qb, val, "amin"))
    return PassageCandidates(p, qb, cos, val, rank, lo)


def _cosines(emb: torch.Tensor, rows: torch.Tensor, q: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """engine.cosines at the (passage rows[i], question cols[i]) pairs, float32: with half ``emb`` the question
    rounded to its dtype and the sum rounded to it, as the product there. The pairs' rows are gathered in chunks
    (kernels.gather_sigma): a batch's thousands of candidates a question never stand as one [pairs, D] copy."""
    if emb.dtype == torch.float32:
        return gather_sigma((emb, q), rows, cols)
    qh = q.to(emb.dtype).float()
    return gather_sigma((emb, qh), rows, cols).to(emb.dtype).float()


def rank_within(col: torch.Tensor, val: torch.Tensor, batch: int):
    """For entries sorted by (col, row): (order, rank): ``order`` lists them by column, then by descending
    ``val``, equal values keeping their order (the lower row first); rank[i] is the place of order[i] within
    its column (0 = best)."""
    order = torch.argsort(val, descending=True, stable=True)
    order = order.index_select(0, torch.argsort(col.index_select(0, order), stable=True))
    c = col.index_select(0, order)
    count = torch.bincount(c, minlength=batch)
    rank = torch.arange(c.numel(), device=col.device) - (torch.cumsum(count, 0) - count).index_select(0, c)
    return order, rank
