"""The query path of retrieval.engine on one shard (ShardedEngine; the exchanges are listed in __init__.py),
and the question side of a sharded index (QuestionIndex, encode_questions: rank 0 encodes, then broadcasts)."""
from __future__ import annotations

import dataclasses

import torch

from .. import kernels, models
from ..config import RetrievalConfig
from ..corpus import Hit
from ..index.graph import passage_text
from ..queries import EncodedQueries, Retrieved
from ..rerank import load_reranker
from ..rerank.scoring import PassageTokens
from ..retrieval import chain, engine, pairs, rerank_stage, stages
from ..retrieval.activation import ColumnEntries, WholeIndex, nearest_entities
from ..retrieval.engine import cosines
from ..retrieval.explain import explanations, named_rows
from ..retrieval.pipeline import QuestionPipeline
from ..retrieval.round import graph_round
from .comm import Comm
from .shard import Shard
from .walk import ShardWalk


class ShardedEngine(stages.PartChain):
    """The query path of engine.retrieve on one shard; every rank calls ``retrieve`` with the same
    queries and config and gets the same Retrieved (global passage rows). ``entity_names``: the whole index's
    entity names, for a trace's chain seeds (a shard holds none; without them a trace names entity e "entity e").

    The graph round is retrieval/round.py's, run with this engine as its round.Part: the shard's passages,
    sentences and entity rows, its part of the walk (walk.ShardWalk) and the process group's collectives."""

    def __init__(self, shard: Shard, comm: Comm, entity_names=None):
        if comm.world != shard.world or comm.rank != shard.rank:
            raise ValueError(f"shard {shard.rank}/{shard.world} in process group rank {comm.rank}/{comm.world}")
        self.shard = shard
        self.comm = comm
        self._names = entity_names
        self._tables = None  # chain.ChainTables of this rank's rows (_chain_tables)
        self._rows = _ShardRows(shard, comm)  # where the activation's rows live (activation.WholeIndex)
        self._rerankers = {}  # (folder, precision) -> (rerank.Reranker on this device, _ShardPassageTokens)
        self._walk = None  # walk.ShardWalk, made on first use
        self.iteration_log: list | None = None  # set to [] to record (bytes, compute s, comm s) per PPR iteration

    # --------------------------------------------------------------------------------------------- entry
    @engine.in_inference_mode
    def retrieve(self, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool = False):
        """Top-k passages for a batch (see engine.retrieve; under inference mode, as there): Retrieved, and with
        ``trace`` (Retrieved, engine.Trace) with every field but the host-read counts and the PageRank's steps.
        ``queries.entity_rows``, when given, must be rows of the index this shard was built from."""
        if cfg.adjacent_passages:
            raise ValueError("adjacent_passages is not supported by the sharded engine (it links passages "
                             "across shard boundaries); query the index in one process")
        if cfg.rerank and cfg.rerank_set_reader:
            raise ValueError("rerank_set_reader is not supported by the sharded engine (the set reader reads every "
                             "candidate's vector, which lie on several ranks); query the index in one process")
        cfg = cfg.for_corpus(0, local=False)  # ppr_mode "auto": the exact walk, the one this engine has
        if cfg.use_ppr and cfg.ppr_mode != "exact" or cfg.reset_passages:
            raise ValueError(f"ppr_mode={cfg.ppr_mode!r} / reset_passages={cfg.reset_passages} are not supported by "
                             "the sharded engine (it runs the exact PageRank on the dense reset); set "
                             "ppr_mode='exact' and reset_passages=0 (--ppr-mode exact --reset-passages 0), or query "
                             "the index in one process")
        if cfg.ann != "exact":
            raise ValueError(f"ann={cfg.ann!r} is not supported by the sharded engine (each shard scans its own "
                             "vectors exactly); set ann='exact' (--ann exact), or query the index in one process")
        queries = self._stored_vectors(queries.to(self.shard.device))
        return stages.run(self, queries, cfg, trace)

    # ------------------------------------------------------------------- the stage list's operations (stages.Backend)
    def round(self, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool):
        """One graph round (round.graph_round) on this shard: (Retrieved, its Trace with ``trace``, else None)."""
        res = graph_round(self, queries, cfg, trace)
        return res if trace else (res, None)

    # ------------------------------------------------------------------------ the round's part (round.Part)
    @property
    def device(self) -> torch.device:
        return self.shard.device

    @property
    def lo(self) -> int:
        return self.shard.lo

    @property
    def rows(self):
        return self._rows

    @property
    def sentence_emb(self) -> torch.Tensor:
        return self.shard.sentence_emb

    @property
    def M_crow(self):
        return self.shard.M.crow

    @property
    def M_col(self):
        return self.shard.M.col

    @property
    def MT_crow(self):
        return self.shard.matrix("MT").crow_indices().to(torch.int64)  # MT: the sentences this rank owns

    @property
    def MT_col(self):
        return self.shard.matrix("MT").col_indices().to(torch.int64)

    @property
    def M(self):
        return self.shard.matrix("M")

    @property
    def MT(self):
        return self.shard.matrix("MT")

    @property
    def N_logT(self):
        return self.shard.N_logT

    def passage_cosines(self, query_emb: torch.Tensor) -> torch.Tensor:
        return cosines(self.shard.passage_emb, query_emb)  # [P_r, B]

    def nearest(self, queries: EncodedQueries, cfg: RetrievalConfig):
        """Eq. 3's scan over the entities this rank owns (global ids); a question entity with a stored vector
        (entity_rows) gets that entity, with its self-cosine from the owner (-inf elsewhere)."""
        sh = self.shard
        dev = sh.device
        q = queries.entity_emb.to(dev, sh.entity_emb.dtype)
        Q = q.shape[0]
        best = torch.full((Q,), float("-inf"), dtype=sh.entity_emb.dtype, device=dev)
        arg = torch.zeros(Q, dtype=torch.int64, device=dev)
        known = queries.entity_rows.to(dev) if queries.entity_rows is not None else torch.full((Q,), -1, device=dev)
        scan = torch.nonzero(known < 0).flatten()
        if scan.numel() and sh.owned_entities.numel():
            b, a = nearest_entities(sh.entity_emb, q.index_select(0, scan))
            best[scan], arg[scan] = b, sh.owned_entities[a]
        hit = torch.nonzero(known >= 0).flatten()
        if hit.numel():  # a stored vector: its own entity, with its self-cosine (nearest_entities' known path)
            loc = sh.owned_row(known[hit])
            mine = loc >= 0
            best[hit[mine]] = (q[hit[mine]] * sh.entity_emb[loc[mine]]).sum(1)
            arg[hit] = known[hit]
        return best, arg

    def local_entries(self, entries: ColumnEntries) -> ColumnEntries:
        """The entries of the entities this shard holds, with its local entity rows (N_logT's)."""
        loc = self.shard.local_entity(entries.row)
        h = loc >= 0
        return ColumnEntries(loc[h], entries.col[h], entries.val[h], (self.shard.entities.numel(), entries.shape[1]))

    def walk(self, cfg: RetrievalConfig) -> ShardWalk:
        if self._walk is None:
            self._walk = ShardWalk(self.shard, self.comm)
        self._walk.log = self.iteration_log
        return self._walk

    def push_graph(self, adjacent_passages: bool):
        raise ValueError("the local PageRank runs in one process only")  # retrieve refuses ppr_mode="local" first

    def questions_per_chunk(self, memory_budget, cfg) -> int:
        """The whole batch (chunks would have to agree across the ranks)."""
        return 1 << 62

    def pair_rerank(self, queries, ranking: Retrieved, cfg) -> Retrieved:
        return self._pairs(queries, ranking, cfg)

    def learned_rerank(self, queries, ranking, cfg, candidates, known=None):
        """rerank_stage.apply with this rank's passages: each rank scores the pairs of the candidates it holds
        (_ShardPassageTokens), every rank fuses and orders the same logits."""
        reranker, tokens = self._reranker(cfg)
        return rerank_stage.apply(reranker, tokens, queries, ranking, candidates, known, **rerank_stage.passes(cfg))

    def reranker(self, cfg: RetrievalConfig):
        """The learned reranker that ``cfg`` names, loaded once on this rank's device (rank 0 also tokenises the
        questions with it: encode_questions)."""
        return self._reranker(cfg)[0]

    def _reranker(self, cfg: RetrievalConfig):
        key = (cfg.reranker, cfg.reranker_precision)
        if key not in self._rerankers:
            sh = self.shard
            r = load_reranker(cfg.reranker or None, sh.device, cfg.reranker_precision)
            tokens = r.tokenize_passages([passage_text(t, x) for t, x in zip(sh.titles, sh.texts)])
            self._rerankers[key] = (r, _ShardPassageTokens(tokens, sh, self.comm))
        return self._rerankers[key]

    @property
    def num_entities(self) -> int:
        return self.shard.num_entities

    @property
    def entity_names(self):
        return _Unnamed() if self._names is None else self._names

    def _pairs(self, queries: EncodedQueries, out: Retrieved, cfg: RetrievalConfig) -> Retrieved:
        """pairs.rerank: the candidates' vectors from their ranks (all-reduce of [B, N, D], zeros elsewhere) and
        the linking entities of the candidates each rank holds (all-gather of (question, slot, entity))."""
        sh = self.shard
        N = min(cfg.pair_candidates, out.indices.shape[1])
        if N < 2:
            return out
        dev = sh.device
        idx = out.indices.to(dev)
        cand = idx[:, :N]
        mine = (cand >= sh.lo) & (cand < sh.hi)
        vec = torch.zeros((*cand.shape, sh.dim), dtype=torch.float32, device=dev)
        vec[mine] = sh.passage_emb[cand[mine] - sh.lo].float()
        self.comm.phase = "pairs"
        self.comm.all_reduce(vec)
        linking = pairs.link_entities(sh.walk_df, cfg.pair_link_max_passages)
        tp = sh.to_passages
        q, slot, col = pairs.candidate_entities(tp.crow, tp.col, linking, torch.where(mine, cand - sh.lo, -1))
        triples = self.comm.all_gather_rows(torch.stack([q, slot, sh.walk_entities[col]], 1))
        link = pairs.linked(triples[:, 0], triples[:, 1], triples[:, 2], cand.shape[0], N)
        return pairs.rerank(Retrieved(idx, out.scores.to(dev)), queries.query_emb, vec, link,
                            queries.has_entities(), cfg)

    def _stored_vectors(self, queries: EncodedQueries) -> EncodedQueries:
        """The question entities with a stored-vector row get that entity's vector from its owner (the
        question side may send a placeholder: QuestionIndex)."""
        rows = queries.entity_rows
        if rows is None or not bool((rows >= 0).any()):
            return queries
        sh = self.shard
        hit = torch.nonzero(rows >= 0).flatten()
        loc = sh.owned_row(rows[hit].to(sh.device))
        vec = torch.zeros(hit.numel(), sh.dim, dtype=torch.float32, device=sh.device)
        vec[loc >= 0] = sh.entity_emb[loc[loc >= 0]].float()
        self.comm.phase = "seeds"
        self.comm.all_reduce(vec)
        emb = queries.entity_emb.clone()
        emb[hit.to(emb.device)] = vec.to(emb.device, emb.dtype)
        return dataclasses.replace(queries, entity_emb=emb)

    # -------------------------------------------------------------------------------------- chain rounds
    @property
    def _chain_tables(self) -> chain.ChainTables:
        """chain.ChainTables of this rank's passages and sentences (local rows and entities), made on first use."""
        if self._tables is None:
            self._tables = chain.ChainTables.build(_ChainView(self.shard, self.entity_names), self.shard.device)
        return self._tables

    @property
    def tables(self) -> chain.ChainTables:
        return self._chain_tables

    @property
    def part(self):
        return self

    def entity_vectors(self, e: torch.Tensor) -> torch.Tensor:
        """round.Part.entity_vectors: each entity's vector from its owner (an all-reduce, zeros elsewhere)."""
        sh = self.shard
        e = e.to(sh.device)
        vec = torch.zeros(e.numel(), sh.dim, dtype=torch.float32, device=sh.device)
        loc = sh.owned_row(e)
        have = loc >= 0
        vec[have] = sh.entity_emb[loc[have]].float()
        self.comm.phase = "chain"
        return self.comm.all_reduce(vec)

    def local_seeds(self, seeds: chain.ChainSeeds) -> chain.ChainSeeds:
        """round.Part.local_seeds: a passage's sentences and the entities they mention are all on its rank, so the
        seeds this rank holds give its passages' prior entries with nothing exchanged."""
        local = self.shard.local_entity(seeds.entity)
        held = local >= 0
        return chain.ChainSeeds(seeds.question[held], local[held], seeds.weight[held])

    # ------------------------------------------------------------------------------------------- results
    def passages(self, rows, entities: bool = False) -> dict:
        """{global row: (id, title, text)} for the given rows, gathered from the ranks holding them; with
        ``entities``, (id, title, text, the set of global entity ids the passage contains: C's row)."""
        sh = self.shard
        mine = {p: (sh.passage_ids[p - sh.lo], sh.titles[p - sh.lo], sh.texts[p - sh.lo])
                for p in {int(r) for r in rows} if sh.lo <= p < sh.hi}
        if entities:  # the walk's columns of a passage are its entities (Shard.build: every C entry is one)
            tp, walk = self.shard.to_passages.to("cpu"), self.shard.walk_entities.cpu()
            mine = {p: (*v, set(walk[tp.col[tp.crow[p - sh.lo]:tp.crow[p - sh.lo + 1]]].tolist()))
                    for p, v in mine.items()}
        out = {}
        for part in self.comm.all_gather_object(mine):
            out.update(part)
        return out

    def hits(self, out: Retrieved) -> list:
        """api.LinearRAG.hits for a sharded result (every rank gets the same list)."""
        idx, scores = out.indices.cpu().tolist(), out.scores.cpu().tolist()
        info = self.passages([i for row in idx for i in row if i >= 0])
        return [[Hit(info[i][0], float(s), info[i][1], info[i][2], i) for i, s in zip(row, srow) if i >= 0]
                for row, srow in zip(idx, scores)]


    def explain(self, questions: list, queries: EncodedQueries, cfg: RetrievalConfig):
        """LinearRAG.explain's answer (retrieval/explain.py) for a batch on the shards; every rank calls it (it
        gathers the hits' passages): the explanations where this engine has the entity names (``entity_names``:
        rank 0 of query_job), None elsewhere."""
        out, tr = self.retrieve(queries, cfg, trace=True)
        hits = self.hits(out)
        info = self.passages(named_rows(tr, hits), entities=True)
        if self._names is None:
            return None
        return explanations(questions, queries, hits, tr, self._names, lambda row: info[row][3],
                            lambda row: info[row][0])


class _ShardRows(WholeIndex):
    """Where activation.propagate_reference_pairs' rows live on a shard: each sentence is owned by one rank;
    a step's sentences are the global top ``top_k_sentence`` of every rank's own (a gather of top-k), of which
    a rank takes those it owns; candidates go out with global entity ids and are gathered from every rank."""

    def __init__(self, shard: Shard, comm: Comm):
        self.shard, self.comm = shard, comm

    @property
    def num_entities(self) -> int:
        return self.shard.num_entities

    def take(self, MT_crow, MT_col, e_idx, b_idx, sigma, used, B: int, k: int):
        sh = self.shard
        dev = sh.device
        n = e_idx.numel()
        # this rank's best unused owned sentences of each frontier pair (entities it does not hold: none)
        loc = sh.local_entity(e_idx)
        has = torch.nonzero(loc >= 0).flatten()
        sig = torch.full((n, k), float("-inf"), dtype=torch.float64, device=dev)
        gid = torch.full((n, k), float("inf"), dtype=torch.float64, device=dev)
        if has.numel():
            picks = kernels.segment_topk_sigma(MT_crow, MT_col, loc[has], b_idx[has], sigma, used, B, k)
            ok = picks >= 0
            pr, _ = torch.nonzero(ok, as_tuple=True)
            s_loc = picks[ok]
            sub_sig = torch.full((has.numel(), k), float("-inf"), dtype=torch.float64, device=dev)
            sub_gid = torch.full((has.numel(), k), float("inf"), dtype=torch.float64, device=dev)
            sub_sig[ok] = kernels.gather_sigma(sigma, s_loc, b_idx[has][pr]).double()
            sub_gid[ok] = sh.sentences[s_loc].double()
            sig[has], gid[has] = sub_sig, sub_gid
        top_sig, top_gid = self.comm.merge_topk(sig, gid)  # sigma descending, ties to the lower sentence
        ok = top_sig > float("-inf")
        pair, _ = torch.nonzero(ok, as_tuple=True)  # (pair, rank) in pair order, best first
        cs = sh.local_sentence(top_gid[ok].to(torch.int64))
        mine = cs >= 0
        mine[mine.clone()] = sh.owned_sentence[cs[mine]]
        m = torch.nonzero(mine).flatten()
        # sigma as the owner computed it
        return pair[m], cs[m], b_idx[pair[m]], top_sig[ok][m].to(torch.float32)

    def held(self, e: torch.Tensor, b: torch.Tensor, av: torch.Tensor):
        """kernels.propagate_step's active entries (entity, question, a) of the entities this rank holds, with
        local entity rows."""
        loc = self.shard.local_entity(e)
        h = loc >= 0
        return loc[h], b[h], av[h]

    def global_entities(self, e: torch.Tensor) -> torch.Tensor:
        return self.shard.entities[e]

    def gather_rows(self, x: torch.Tensor) -> torch.Tensor:
        return self.comm.all_gather_rows(x)


class _ShardPassageTokens:
    """A shard's passages tokenised for a reranker (``tokens``: rerank.PassageTokens of its rows lo .. hi - 1), for
    Reranker.rerank (PassageTokens.score_pairs): each rank scores, in one batched pass, the (question, candidate)
    pairs of the candidates it holds, and the logits are summed over the ranks (an all-reduce, zeros where not
    held). A chain-aware reranker's context passages (a question's top two candidates, chain_context) may lie
    on other ranks: the tokens of the distinct ones come by an all-reduce too (zeros where not held)."""

    def __init__(self, tokens, shard: Shard, comm: Comm):
        self.tokens, self.shard, self.comm = tokens, shard, comm

    def score_pairs(self, reranker, q, q_of_pair: torch.Tensor, rows: torch.Tensor,
                    context: torch.Tensor | None, **passes) -> torch.Tensor:
        sh, comm = self.shard, self.comm
        ids, lengths = self.tokens.ids, self.tokens.lengths
        i = torch.nonzero((rows >= sh.lo) & (rows < sh.hi)).flatten()  # the pairs scored here
        table_ids, table_len = [ids.index_select(0, rows[i] - sh.lo)], [lengths.index_select(0, rows[i] - sh.lo)]
        ctx = None
        comm.phase = "rerank"
        if context is not None:  # the distinct context rows (the same on every rank), after the pairs' rows
            u = torch.unique(context)
            mine = (u >= sh.lo) & (u < sh.hi)
            loc = torch.where(mine, u - sh.lo, torch.zeros_like(u))
            both = torch.cat([ids.index_select(0, loc), lengths.index_select(0, loc)[:, None]], 1) * mine[:, None]
            comm.all_reduce(both)  # [U, Lp + 1]
            table_ids.append(both[:, :-1])
            table_len.append(both[:, -1])
            c = context[i]
            ctx = torch.where(c >= 0, i.numel() + torch.searchsorted(u, c), torch.full_like(c, -1))
        table = PassageTokens(torch.cat(table_ids), torch.cat(table_len))
        out = torch.zeros(rows.numel(), dtype=torch.float32, device=rows.device)
        out[i] = reranker.pair_logits(q, table, q_of_pair[i], torch.arange(i.numel(), device=rows.device), ctx,
                                      **passes)
        return comm.all_reduce(out)


class _Unnamed:
    """Entity names where the shard holds none: entity e is "entity e"."""

    def __getitem__(self, e: int) -> str:
        return f"entity {e}"


class _ChainView:
    """The shard seen as the index chain.ChainTables.build reads (local passage and sentence rows, local entities;
    ``entities``: the whole index's entity names by global id, for a later round's entity texts)."""

    def __init__(self, sh: Shard, names):
        self.PS, self.M, self.titles, self.sentences = sh.PS, sh.M, sh.titles, sh.sentence_texts
        self.sentence_emb, self.entities = sh.sentence_emb, names


# ------------------------------------------------------------------------------------------ question side


class QuestionIndex:
    """What the question pipeline reads of an index (entity strings and token hashes, the index settings),
    without its tensors. An entity string that takes an index entity's stored vector gets a zero
    placeholder here and its row in EncodedQueries.entity_rows: the sharded seed search uses only the
    row (the entity's owner supplies its self-cosine)."""

    def __init__(self, index):
        self.entities = index.entities
        self.keys = index.keys
        self.index_config = index.index_config
        self.retrieval_config = index.retrieval_config
        self.num_entities = index.num_entities
        self.dim = index.dim
        self.entity_emb = _ZeroRows(index.dim)


class _ZeroRows:
    def __init__(self, dim):
        self.dim = dim

    def __getitem__(self, rows):
        return torch.zeros(len(rows), self.dim)


def encode_questions(qindex: QuestionIndex, questions: list, cfg: RetrievalConfig, nlp=None, encoder=None,
                     device="cpu", reranker=None) -> EncodedQueries:
    """LinearRAG.encode_queries for a sharded index (rank 0 runs it and broadcasts the result); with cfg.rerank
    the questions' reranker tokens too (``reranker``: the rerank.Reranker, default: the one cfg names)."""
    pipe = QuestionPipeline(qindex, nlp or models.load_nlp(qindex.index_config),
                            encoder or models.load_encoder(qindex.index_config, device))
    if cfg.rerank:
        reranker = reranker or load_reranker(cfg.reranker or None, device, cfg.reranker_precision)
    enc = pipe.encode_questions(questions, cfg, True, None, reranker)
    return dataclasses.replace(enc, rows_of=None)  # the rows are the index's, read by the shards' owners
