"""The query path of retrieval.engine on one shard (ShardedEngine; the exchanges are listed in __init__.py),
and the question side of a sharded index (QuestionIndex, encode_questions: rank 0 encodes, then broadcasts)."""
from __future__ import annotations

import dataclasses
import time

import torch

from .. import kernels, models
from ..config import RetrievalConfig
from ..corpus import Hit, check_question
from ..index.graph import passage_text
from ..queries import EncodedQueries, Retrieved
from ..rerank import load_reranker
from ..rerank.scoring import PassageTokens
from ..retrieval import chain, engine, pairs, rerank_stage, stages  # engine: the single-process engine, whose math this one splits up
from ..retrieval.activation import (ActivePairs, WholeIndex, dense_seeds, nearest_entities, propagate_paper,
                                   propagate_reference_pairs)
from ..retrieval.engine import Trace, cosines
from ..retrieval.explain import explanations, named_rows
from ..retrieval.pagerank import FLOOR_RULE_BELOW
from ..retrieval.pipeline import QuestionPipeline
from .comm import Comm
from .shard import Shard


class ShardedEngine:
    """The query path of engine.retrieve on one shard; every rank calls ``retrieve`` with the same
    queries and config and gets the same Retrieved (global passage rows). ``entity_names``: the whole index's
    entity names, for a trace's chain seeds (a shard holds none; without them a trace names entity e "entity e")."""

    def __init__(self, shard: Shard, comm: Comm, entity_names=None):
        if comm.world != shard.world or comm.rank != shard.rank:
            raise ValueError(f"shard {shard.rank}/{shard.world} in process group rank {comm.rank}/{comm.world}")
        self.shard = shard
        self.comm = comm
        self._names = entity_names
        self._tables = None  # chain.ChainTables of this rank's rows (_chain_tables)
        self._rows = _ShardRows(shard, comm)  # where the activation's rows live (activation.WholeIndex)
        self._rerankers = {}  # (folder, precision) -> (rerank.Reranker on this device, _ShardPassageTokens)
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
        return self._one_round(queries, cfg, trace)

    def chain_seeds(self, queries, ranking: Retrieved, source: torch.Tensor, cfg) -> chain.ChainSeeds:
        return self._chain_seeds(queries, ranking, source, cfg)

    def later_queries(self, queries, seeds: chain.ChainSeeds, cfg) -> EncodedQueries:
        return dataclasses.replace(self._second_round_queries(queries, seeds), prior=self._prior(queries, seeds, cfg))

    def pair_rerank(self, queries, ranking: Retrieved, cfg) -> Retrieved:
        return self._pairs(queries, ranking, cfg)

    def learned_rerank(self, queries, ranking, cfg, candidates, known=None):
        """rerank_stage.apply with this rank's passages: each rank scores the pairs of the candidates it holds
        (_ShardPassageTokens), every rank fuses and orders the same logits."""
        reranker, tokens = self._reranker(cfg)
        return rerank_stage.apply(reranker, tokens, queries, ranking, candidates, known)

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

    # ---------------------------------------------------------------------------------------------- seeds
    def seed_pairs(self, queries: EncodedQueries):
        """activation.seed_pairs over the whole index: (keys e * B + b sorted unique, values)."""
        sh, B = self.shard, queries.batch_size
        dev = sh.device
        Q = queries.entity_emb.shape[0]
        if Q == 0 or sh.num_entities == 0:
            return torch.zeros(0, dtype=torch.int64, device=dev), torch.zeros(0, dtype=sh.entity_emb.dtype, device=dev)
        best = torch.full((Q,), float("-inf"), dtype=sh.entity_emb.dtype, device=dev)
        arg = torch.zeros(Q, dtype=torch.int64, device=dev)
        known = queries.entity_rows.to(dev) if queries.entity_rows is not None else torch.full((Q,), -1, device=dev)
        scan = torch.nonzero(known < 0).flatten()
        if scan.numel() and sh.owned_entities.numel():
            b, a = nearest_entities(sh.entity_emb, queries.entity_emb.index_select(0, scan))
            best[scan], arg[scan] = b, sh.owned_entities[a]
        hit = torch.nonzero(known >= 0).flatten()
        if hit.numel():  # a stored vector: its own entity, with its self-cosine (nearest_entities' known path)
            loc = sh.owned_row(known[hit])
            mine = loc >= 0
            v = sh.entity_emb[loc[mine]]
            best[hit[mine]] = (queries.entity_emb[hit[mine]].to(v.dtype) * v).sum(1)
            arg[hit] = known[hit]
        self.comm.phase = "seeds"
        both = self.comm.all_gather(torch.stack([best.double(), arg.double()]))  # [world, 2, Q]
        vals, args = both[:, 0], both[:, 1]
        top = vals.max(0).values
        # the largest cosine; among ranks reaching it, the lowest entity index
        args = torch.where(vals == top, args, torch.full_like(args, float("inf")))
        best, arg = top.to(sh.entity_emb.dtype), args.min(0).values.to(torch.int64)
        keys, inv = torch.unique(arg * B + queries.entity_owner.to(dev), sorted=True, return_inverse=True)
        vals = torch.full((keys.numel(),), float("-inf"), dtype=best.dtype, device=dev)
        return keys, vals.scatter_reduce_(0, inv, best, "amax")

    # ---------------------------------------------------------------------------------------- activation
    def activate(self, queries: EncodedQueries, cfg: RetrievalConfig):
        """engine.activate_pairs on the shards: (seed keys, seed values, ActivePairs), the same on every rank."""
        keys, vals = self.seed_pairs(queries)
        vals = vals.float()
        sh, B = self.shard, queries.batch_size
        if not cfg.use_activation:
            return keys, vals, ActivePairs.from_keys(keys, vals, torch.ones_like(keys), vals, (sh.num_entities, B))
        self.comm.phase = "activation"
        MT, sigma = sh.matrix("MT"), (sh.sentence_emb, queries.query_emb)  # MT: the sentences this rank owns
        if cfg.mode == "paper":  # the dense [E, B] state on every rank, y summed over the ranks' sentences
            seeds, is_seed = dense_seeds(keys, vals, sh.num_entities, B)
            return keys, vals, ActivePairs.from_activation(
                propagate_paper(sh.matrix("M"), MT, sigma, seeds, is_seed, cfg, self._rows))
        return keys, vals, propagate_reference_pairs(
            sh.M.crow, sh.M.col, MT.crow_indices().to(torch.int64), MT.col_indices().to(torch.int64), sigma, keys,
            vals, B, cfg, self._rows)

    # ---------------------------------------------------------------------------------------- one round
    def _one_round(self, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool = False):
        """One graph round (engine._retrieve_chunk): (Retrieved, its Trace with ``trace``, else None)."""
        sh = self.shard
        B, dev = queries.batch_size, sh.device
        sim = cosines(sh.passage_emb, queries.query_emb)  # [P_r, B]
        seed_keys, seed_vals, act = self.activate(queries, cfg)
        use_graph = torch.zeros(B, dtype=torch.bool, device=dev)
        use_graph[act.col] = True
        g = torch.nonzero(use_graph).flatten()
        scores = sim
        if g.numel():
            n = g.numel()
            col = torch.full((B,), -1, dtype=torch.int64, device=dev)
            col[g] = torch.arange(n, device=dev)
            prior = sim if queries.prior is None else queries.prior.apply(sim)  # this rank's passages (_chain)
            bg, sim_g = col[act.col], prior.index_select(1, g)
            reset_p = self._passage_reset(sim_g, act, bg, cfg)
            if cfg.use_ppr:
                ppr_p, valid = self._pagerank(reset_p, act.row, bg, act.reset, cfg)
            else:
                ppr_p, valid = reset_p, torch.ones(n, dtype=torch.bool, device=dev)
            use_graph[g] = valid
            scores = sim.clone()
            scores[:, g[valid]] = ppr_p[:, valid]
        out = self._topk(scores, min(cfg.top_k, sh.num_passages))
        if not trace:
            return out, None
        return out, Trace(*dense_seeds(seed_keys, seed_vals, sh.num_entities, B), act.dense(), ~use_graph)

    def _passage_reset(self, sim, act: ActivePairs, bg, cfg) -> torch.Tensor:
        """Eq. 7 (pagerank.passage_reset_entries) with the min-max normalisation over every rank's passages."""
        sh = self.shard
        self.comm.phase = "eq7"
        ext = self.comm.all_reduce(torch.cat([-sim.min(dim=0).values, sim.max(dim=0).values]), "max")
        n = sim.shape[1]
        lo, hi = -ext[:n], ext[n:]
        span = (hi - lo)[None]
        lo = lo[None]
        mm = torch.where(span > 0, (sim - lo) / torch.where(span > 0, span, torch.ones_like(span)), torch.zeros_like(sim))
        z = torch.zeros_like(sim)
        loc = sh.local_entity(act.row)
        h = loc >= 0
        kernels.spmm_sparse_rhs(sh.N_logT.crow, sh.N_logT.col, sh.N_logT.val, loc[h], bg[h],
                                (act.val / act.tier.to(sim.dtype))[h], z)
        return (cfg.lam * mm + torch.log1p_(z)) * cfg.passage_node_weight

    def _pagerank(self, reset_p, e_glob, cols, e_vals, cfg):
        """pagerank.personalized_pagerank (passage scores only) on the sharded walk: see the module doc."""
        sh, comm = self.shard, self.comm
        dev = reset_p.device
        d = float(cfg.damping)
        rp = torch.nan_to_num(reset_p, nan=0.0).clamp_(min=0)
        B = rp.shape[1]
        ev = torch.nan_to_num(e_vals.to(rp.dtype), nan=0.0).clamp_(min=0)
        n_priv, n_sh = sh.walk_private.numel(), sh.walk_shared.numel()
        # the walk rows of the reset entries: private ones held here, every shared one
        loc = sh.local_entity(e_glob)
        wrow = torch.full_like(e_glob, -1)
        if n_priv:
            pos = torch.searchsorted(sh.walk_private, loc.clamp(min=0)).clamp_(max=n_priv - 1)
            wrow = torch.where((loc >= 0) & (sh.walk_private[pos] == loc), pos, wrow)
        if n_sh:
            pos = torch.searchsorted(sh.walk_shared, e_glob).clamp_(max=n_sh - 1)
            wrow = torch.where(sh.walk_shared[pos] == e_glob, n_priv + pos, wrow)
        h = wrow >= 0

        def entity_reset(values):
            return torch.zeros(n_priv + n_sh, B, dtype=rp.dtype, device=dev).index_put_(
                (wrow[h], cols[h]), values[h], accumulate=True)

        dp, de = sh.dangling_passages, sh.dangling_walk
        # the reset's total, and its mass on the dangling passages and entities (dangling walk rows are
        # private: each is held by one rank), in one collective
        comm.phase = "ppr_setup"
        sums = comm.all_reduce(torch.stack([rp.sum(0), rp.index_select(0, dp).sum(0),
                                            entity_reset(ev).index_select(0, de).sum(0)]))
        total = sums[0].index_add_(0, cols, ev)
        valid = total > 0
        norm = torch.where(valid, total, torch.ones_like(total))
        rp.div_(norm)
        re = entity_reset(ev / norm[cols])
        r_dp, r_de = sums[1] / norm, sums[2] / norm
        W_pe, W_ep = sh.matrix("to_passages"), sh.matrix("to_entities")
        result = torch.zeros_like(rp)
        cols_w = torch.arange(B, device=dev)
        xp, xe = rp.clone(), re.clone()
        # g: the dangling mass of (xp, xe). A dangling entity row has no edge, so after a step it holds its
        # reset times that step's entity coefficient: the entities' part of g is r_de times it (x_0 = r: 1)
        g_e = r_de.clone()
        g = r_dp + g_e
        last = torch.full((B,), float("inf"), dtype=rp.dtype, device=dev)
        ch_loc = torch.zeros(B, dtype=rp.dtype, device=dev)
        log = self.iteration_log
        comm.phase = "ppr"
        for t in range(cfg.ppr_max_iter):
            t0 = time.perf_counter()
            # block Gauss-Seidel (kernels.ppr_step): the passages (all local), then the entities from them
            reset_part = rp * ((1.0 - d) + d * g)
            out_p = torch.addmm(reset_part, W_pe, xe, alpha=d) if W_pe.shape[1] else reset_part
            y = torch.mm(W_ep, out_p) if W_ep.shape[0] else xe.new_zeros(n_priv + n_sh, xp.shape[1])
            buf = torch.cat([y[n_priv:], out_p.index_select(0, dp).sum(0)[None], ch_loc[None]])
            t1 = time.perf_counter()
            comm.all_reduce(buf)
            t2 = time.perf_counter()
            sent = buf.numel() * buf.element_size() if comm.world > 1 else 0
            y_sh, g_p, change = buf[:n_sh], buf[n_sh], buf[n_sh + 1]
            if t > 0:  # the stop rule of personalized_pagerank, for the step before
                stop = (change < cfg.ppr_tol) | ((change >= last) & (change < FLOOR_RULE_BELOW))
                last = change
                if bool(stop.any()):
                    result[:, cols_w[stop]] = xp[:, stop]
                    k = torch.nonzero(~stop).flatten()
                    if k.numel() == 0:
                        if log is not None:
                            log.append((sent, t1 - t0, t2 - t1))
                        break
                    cols_w, last = cols_w[k], last[k]
                    xp, xe, rp, re = xp[:, k], xe[:, k], rp[:, k], re[:, k]
                    out_p, y, y_sh, g_p, g_e, r_de = out_p[:, k], y[:, k], y_sh[:, k], g_p[k], g_e[k], r_de[k]
            t3 = time.perf_counter()
            coef_e = (1.0 - d) + d * (g_p + g_e)  # g' over (p', xe)
            out_e = re * coef_e
            out_e[:n_priv] += d * y[:n_priv]
            out_e[n_priv:] += d * y_sh
            g_e = r_de * coef_e
            g = g_p + g_e
            ch_loc = (out_p - xp).abs().sum(0) + (out_e[:n_priv] - xe[:n_priv]).abs().sum(0)
            if sh.rank == 0:  # the shared rows are the same on every rank: counted once
                ch_loc = ch_loc + (out_e[n_priv:] - xe[n_priv:]).abs().sum(0)
            xp, xe = out_p, out_e
            if log is not None:
                log.append((sent, (t1 - t0) + (time.perf_counter() - t3), t2 - t1))
        else:
            result[:, cols_w] = xp  # ppr_max_iter reached
        return result, valid

    def _topk(self, scores, k: int) -> Retrieved:
        """kernels.topk_columns over every rank's passages: local top k, all-gathered, merged."""
        sh = self.shard
        B = scores.shape[1]
        kl = min(k, scores.shape[0])
        idx, vals = kernels.topk_columns(scores, kl)
        pad_i = torch.full((B, k), float("inf"), dtype=torch.float64, device=scores.device)
        pad_v = torch.full((B, k), float("-inf"), dtype=torch.float64, device=scores.device)
        pad_i[:, :kl], pad_v[:, :kl] = (idx + sh.lo).double(), vals.double()
        self.comm.phase = "topk"
        v, i = self.comm.merge_topk(pad_v, pad_i)
        return Retrieved(i.to(torch.int64), v.to(scores.dtype))

    # -------------------------------------------------------------------------------------- chain rounds
    @property
    def _chain_tables(self) -> chain.ChainTables:
        """chain.ChainTables of this rank's passages and sentences (local rows and entities), made on first use."""
        if self._tables is None:
            self._tables = chain.ChainTables.build(_ChainView(self.shard), self.shard.device)
        return self._tables

    def _prior(self, queries: EncodedQueries, seeds: chain.ChainSeeds, cfg: RetrievalConfig):
        """chain.passage_prior for this rank's passages: a passage's sentences and the entities they mention
        are all on its rank, so the seeds this rank holds give its passages' entries with nothing exchanged."""
        local = self.shard.local_entity(seeds.entity)
        held = local >= 0
        return chain.passage_prior(self._chain_tables, queries,
                                   chain.ChainSeeds(seeds.question[held], local[held], seeds.weight[held]), cfg)

    def _chain_seeds(self, queries, first: Retrieved, source: torch.Tensor, cfg) -> chain.ChainSeeds:
        """chain.chain_seeds of the sources (chain.chain_sources) this rank holds, gathered from every rank
        (global entity ids)."""
        sh = self.shard
        idx = first.indices.to(sh.device)
        mine = source & (idx >= sh.lo) & (idx < sh.hi)
        local = Retrieved(torch.where(mine, idx - sh.lo, torch.full_like(idx, -1)), first.scores.to(sh.device))
        seeds = chain.chain_seeds(self._chain_tables, queries, local, mine, cfg)
        rows = torch.stack([seeds.question.double(), sh.entities[seeds.entity].double(), seeds.weight], 1)
        self.comm.phase = "chain"
        rows = self.comm.all_gather_rows(rows)  # [n, 3]: question, global entity, w (exact in float64)
        return chain.ChainSeeds.from_entries(rows[:, 0].long(), rows[:, 1].long(), rows[:, 2], sh.num_entities)

    def _second_round_queries(self, queries: EncodedQueries, seeds: chain.ChainSeeds) -> EncodedQueries:
        """chain.second_round_queries: each seed entity's own vector (from its owner) scaled by w(e)."""
        sh = self.shard
        dev = queries.entity_emb.device
        if seeds.entity.numel() == 0:
            return queries
        e = seeds.entity.to(sh.device)
        vec = torch.zeros(e.numel(), sh.dim, dtype=torch.float32, device=sh.device)
        loc = sh.owned_row(e)
        have = loc >= 0
        vec[have] = sh.entity_emb[loc[have]].float()
        self.comm.phase = "chain"
        self.comm.all_reduce(vec)
        emb = (vec * seeds.weight.to(vec.device, torch.float32)[:, None]).to(dev)
        rows = queries.entity_rows
        if rows is not None:
            rows = torch.cat([rows, torch.full((e.numel(),), -1, dtype=rows.dtype, device=rows.device)])
        return EncodedQueries(queries.query_emb, torch.cat([queries.entity_emb, emb]),
                              torch.cat([queries.entity_owner, seeds.question.to(queries.entity_owner.device)]),
                              list(queries.entity_text) + [f"entity {i}" for i in e.tolist()], rows, None)

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
                    context: torch.Tensor | None) -> torch.Tensor:
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
        out[i] = reranker.pair_logits(q, table, q_of_pair[i], torch.arange(i.numel(), device=rows.device), ctx)
        return comm.all_reduce(out)


class _Unnamed:
    """Entity names where the shard holds none: entity e is "entity e"."""

    def __getitem__(self, e: int) -> str:
        return f"entity {e}"


class _ChainView:
    """The shard seen as the index chain.ChainTables.build reads (local passage and sentence rows, local entities)."""

    def __init__(self, sh: Shard):
        self.PS, self.M, self.titles, self.sentences = sh.PS, sh.M, sh.titles, sh.sentence_texts
        self.sentence_emb = sh.sentence_emb


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
    for q in questions:
        check_question(q)
    pipe = QuestionPipeline(qindex, nlp or models.load_nlp(qindex.index_config),
                            encoder or models.load_encoder(qindex.index_config, device))
    enc = pipe.encode(questions, pipe.entities(questions, cfg.lexicon_seeds, None, cfg.question_ner), True)
    out = EncodedQueries(enc.query_emb, enc.entity_emb, enc.entity_owner, enc.entity_text, enc.entity_rows, None)
    if cfg.rerank:
        reranker = reranker or load_reranker(cfg.reranker or None, device, cfg.reranker_precision)
        out.rerank_tokens = reranker.question_tokens(list(questions))
    return out
