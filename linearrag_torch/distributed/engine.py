"""The query path of retrieval.engine on one shard (ShardedEngine; the exchanges are listed in __init__.py),
and the question side of a sharded index (QuestionIndex, encode_questions: rank 0 encodes, then broadcasts)."""
from __future__ import annotations

import dataclasses
import time

import torch

from .. import kernels
from ..config import RetrievalConfig
from ..queries import EncodedQueries, Retrieved
from ..retrieval import chain, engine, pairs, stages  # engine: the single-process engine, whose math this one splits up
from ..retrieval.activation import ActivePairs, nearest_entities
from ..retrieval.engine import cosines
from ..retrieval.pagerank import FLOOR_RULE_BELOW
from .comm import Comm
from .shard import Shard


class ShardedEngine:
    """The query path of engine.retrieve on one shard; every rank calls ``retrieve`` with the same
    queries and config and gets the same Retrieved (global passage rows)."""

    def __init__(self, shard: Shard, comm: Comm):
        if comm.world != shard.world or comm.rank != shard.rank:
            raise ValueError(f"shard {shard.rank}/{shard.world} in process group rank {comm.rank}/{comm.world}")
        self.shard = shard
        self.comm = comm
        self._tables = None  # chain.ChainTables of this rank's rows (_chain_tables)
        self.iteration_log: list | None = None  # set to [] to record (bytes, compute s, comm s) per PPR iteration

    # --------------------------------------------------------------------------------------------- entry
    @engine.in_inference_mode
    def retrieve(self, queries: EncodedQueries, cfg: RetrievalConfig) -> Retrieved:
        """Top-k passages for a batch (see engine.retrieve; trace is not offered; under inference mode, as
        there). ``queries.entity_rows``, when given, must be rows of the index this shard was built from."""
        if cfg.adjacent_passages:
            raise ValueError("adjacent_passages is not supported by the sharded engine (it links passages "
                             "across shard boundaries); query the index in one process")
        if cfg.rerank:
            raise ValueError("rerank is not supported by the sharded engine yet; query the index in one process "
                             "(LinearRAG, `linearrag query`, `linearrag serve`)")
        queries = self._stored_vectors(queries.to(self.shard.device))
        return stages.run(self, queries, cfg)

    # ------------------------------------------------------------------- the stage list's operations (stages.Backend)
    def round(self, queries: EncodedQueries, cfg: RetrievalConfig, trace: bool):
        if trace:
            raise ValueError("the sharded engine keeps no trace")
        return self._one_round(queries, cfg), None

    def chain_seeds(self, queries, ranking: Retrieved, source: torch.Tensor, cfg) -> chain.ChainSeeds:
        return self._chain_seeds(queries, ranking, source, cfg)

    def later_queries(self, queries, seeds: chain.ChainSeeds, cfg) -> EncodedQueries:
        return dataclasses.replace(self._second_round_queries(queries, seeds), prior=self._prior(queries, seeds, cfg))

    def pair_rerank(self, queries, ranking: Retrieved, cfg) -> Retrieved:
        return self._pairs(queries, ranking, cfg)

    def learned_rerank(self, queries, ranking, cfg, candidates):
        raise ValueError("rerank is not supported by the sharded engine yet; query the index in one process "
                         "(LinearRAG, `linearrag query`, `linearrag serve`)")

    @property
    def num_entities(self) -> int:
        return self.shard.num_entities

    @property
    def entity_names(self) -> list:
        raise ValueError("the sharded engine keeps no trace")

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
    def activate(self, queries: EncodedQueries, cfg: RetrievalConfig) -> ActivePairs:
        keys, vals = self.seed_pairs(queries)
        E, B = self.shard.num_entities, queries.batch_size
        if not cfg.use_activation:
            return ActivePairs.from_keys(keys, vals, torch.ones_like(keys), vals, (E, B))
        self.comm.phase = "activation"
        if cfg.mode == "paper":
            return self._propagate_paper(keys, vals, queries, cfg)
        return self._propagate_reference(keys, vals, queries, cfg)

    def _propagate_reference(self, keys, seed_vals, queries, cfg) -> ActivePairs:
        """activation.propagate_reference_pairs with the sentences spread over the ranks."""
        sh, B, comm = self.shard, queries.batch_size, self.comm
        dev = sh.device
        MT = sh.matrix("MT")
        MT_crow, MT_col = MT.crow_indices().to(torch.int64), MT.col_indices().to(torch.int64)
        M_crow, M_col = sh.M.crow, sh.M.col
        sigma = (sh.sentence_emb, queries.query_emb)
        score, weight = seed_vals.clone(), seed_vals.clone()
        tier = torch.ones(keys.numel(), dtype=torch.int64, device=dev)
        e_idx, b_idx, f = keys // B, keys % B, seed_vals
        used = torch.empty(0, dtype=torch.int64, device=dev)  # local sentence * B + b, owned sentences only
        steps = 0
        k = cfg.top_k_sentence
        for t in range(1, cfg.max_iterations):
            keep = f >= cfg.delta
            e_idx, b_idx, f = e_idx[keep], b_idx[keep], f[keep]
            if e_idx.numel() == 0:
                break
            steps = t
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
                v = kernels.gather_sigma(sigma, s_loc, b_idx[has][pr])
                sub_sig = torch.full((has.numel(), k), float("-inf"), dtype=torch.float64, device=dev)
                sub_gid = torch.full((has.numel(), k), float("inf"), dtype=torch.float64, device=dev)
                sub_sig[ok], sub_gid[ok] = v.double(), sh.sentences[s_loc].double()
                sig[has], gid[has] = sub_sig, sub_gid
            allp = comm.all_gather(torch.stack([sig, gid]))  # [world, 2, n, k]
            sig_all = allp[:, 0].permute(1, 0, 2).reshape(n, -1)
            gid_all = allp[:, 1].permute(1, 0, 2).reshape(n, -1)
            # the global top k: sigma descending, ties to the lower sentence
            o = torch.argsort(gid_all, dim=1, stable=True)
            o = o.gather(1, torch.argsort(-sig_all.gather(1, o), dim=1, stable=True))[:, :k]
            top_sig, top_gid = sig_all.gather(1, o), gid_all.gather(1, o)
            ok = top_sig > float("-inf")
            pair, _ = torch.nonzero(ok, as_tuple=True)  # (pair, rank) in pair order, best first
            cs_g = top_gid[ok].to(torch.int64)
            cb = b_idx[pair]
            cs_l = sh.local_sentence(cs_g)
            mine = cs_l >= 0
            mine[mine.clone()] = sh.owned_sentence[cs_l[mine]]
            m = torch.nonzero(mine).flatten()
            used = torch.unique(torch.cat([used, cs_l[m] * B + cb[m]]))
            base = f[pair[m]] * top_sig[ok][m].to(f.dtype)  # score(e) * sigma[s] (sigma as the owner computed it)
            owner2, pos2, _ = kernels.segment_positions(M_crow, cs_l[m])
            cand = base[owner2]
            okc = cand >= cfg.delta
            flat_l = sh.entities[M_col[pos2][okc]] * B + cb[m][owner2][okc]
            cand_l = cand[okc]
            flat = comm.all_gather_rows(flat_l)
            cand = comm.all_gather_rows(cand_l)
            flat, inv = torch.unique(flat, sorted=True, return_inverse=True)
            new = torch.full((flat.numel(),), float("-inf"), dtype=score.dtype, device=dev).scatter_reduce_(0, inv, cand, "amax")
            added = torch.zeros(flat.numel(), dtype=weight.dtype, device=dev).index_add_(0, inv, cand)
            merged, where = torch.unique(torch.cat([keys, flat]), sorted=True, return_inverse=True)
            old_at, new_at = where[:keys.numel()], where[keys.numel():]
            score = score.new_zeros(merged.numel()).index_copy_(0, old_at, score).index_copy_(0, new_at, new)
            weight = weight.new_zeros(merged.numel()).index_copy_(0, old_at, weight).index_add_(0, new_at, added)
            tier = tier.new_zeros(merged.numel()).index_copy_(0, old_at, tier).index_fill_(0, new_at, t + 1)
            keys = merged
            e_idx, b_idx, f = flat // B, flat % B, new
        return ActivePairs.from_keys(keys, score, tier, weight, (sh.num_entities, B), steps)

    def _propagate_paper(self, keys, seed_vals, queries, cfg) -> ActivePairs:
        """activation.propagate_paper (kernels.propagate_step) with the sentences spread over the ranks:
        the dense [E, B] state is replicated, y = Mᵀ(sigma ⊙ M a) is summed over the ranks' owned sentences."""
        sh, B, comm = self.shard, queries.batch_size, self.comm
        E, dev = sh.num_entities, sh.device
        sigma = (sh.sentence_emb, queries.query_emb)
        a = torch.zeros(E * B, dtype=seed_vals.dtype, device=dev).index_copy_(0, keys, seed_vals).view(E, B)
        tier = torch.zeros(E * B, dtype=torch.int64, device=dev).index_fill_(0, keys, 1).view(E, B)
        MT = sh.matrix("MT")
        MT_crow, MT_col, MT_val = MT.crow_indices().to(torch.int64), MT.col_indices().to(torch.int64), MT.values()
        live = torch.ones(B, dtype=torch.bool, device=dev)
        steps = 0
        for t in range(1, cfg.max_iterations):
            # kernels.propagate_step: x = M (a ⊙ [a >= delta]) on owned sentences, y = Mᵀ (sigma ⊙ x)
            a_new = a.clamp(min=0)
            e, b = ((a >= cfg.delta) & (a != 0)).nonzero(as_tuple=True)
            flat_l = torch.zeros(0, dtype=torch.int64, device=dev)
            y_l = torch.zeros(0, dtype=a.dtype, device=dev)
            if e.numel():
                loc = sh.local_entity(e)
                h = loc >= 0
                e_l, b_l, av = loc[h], b[h], a[e[h], b[h]]
                owner, pos, _ = kernels.segment_positions(MT_crow, e_l)
                key = MT_col[pos] * B + b_l[owner]
                key, inv = torch.unique(key, sorted=True, return_inverse=True)
                x = torch.zeros(key.numel(), dtype=a.dtype, device=dev).index_add_(0, inv, MT_val[pos] * av[owner])
                s, sb = key // B, key % B
                z = x * kernels.gather_sigma(sigma, s, sb)
                owner2, pos2, _ = kernels.segment_positions(sh.M.crow, s)
                flat_l = sh.entities[sh.M.col[pos2]] * B + sb[owner2]
                y_l = sh.M.val[pos2].to(a.dtype) * z[owner2]
            flat = comm.all_gather_rows(flat_l)
            yv = comm.all_gather_rows(y_l)
            if flat.numel():
                flat, inv2 = torch.unique(flat, sorted=True, return_inverse=True)
                y = torch.zeros(flat.numel(), dtype=a.dtype, device=dev).index_add_(0, inv2, yv)
                y = y * (y >= cfg.delta)
                a_new.view(-1)[flat] = torch.maximum(y, a.reshape(-1)[flat])
            newly = (a_new >= cfg.delta) & (tier == 0)
            live = live & newly.any(dim=0)
            if not bool(live.any()):
                break
            steps = t
            a = torch.where(live, a_new, a)
            tier = torch.where(newly & live, t + 1, tier)
        flat = torch.nonzero(tier.reshape(-1) > 0).flatten()
        return ActivePairs.from_keys(flat, a.reshape(-1)[flat], tier.reshape(-1)[flat], a.reshape(-1)[flat], (E, B), steps)

    # ---------------------------------------------------------------------------------------- one round
    def _one_round(self, queries: EncodedQueries, cfg: RetrievalConfig) -> Retrieved:
        sh = self.shard
        B, dev = queries.batch_size, sh.device
        sim = cosines(sh.passage_emb, queries.query_emb)  # [P_r, B]
        act = self.activate(queries, cfg)
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
        return self._topk(scores, min(cfg.top_k, sh.num_passages))

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
        allk = self.comm.all_gather(torch.stack([pad_v, pad_i]))  # [world, 2, B, k]
        v = allk[:, 0].permute(1, 0, 2).reshape(B, -1)
        i = allk[:, 1].permute(1, 0, 2).reshape(B, -1)
        o = torch.argsort(i, dim=1, stable=True)
        o = o.gather(1, torch.argsort(-v.gather(1, o), dim=1, stable=True))[:, :k]
        return Retrieved(i.gather(1, o).to(torch.int64), v.gather(1, o).to(scores.dtype))

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
    def passages(self, rows) -> dict:
        """{global row: (id, title, text)} for the given rows, gathered from the ranks holding them."""
        sh = self.shard
        mine = {p: (sh.passage_ids[p - sh.lo], sh.titles[p - sh.lo], sh.texts[p - sh.lo])
                for p in {int(r) for r in rows} if sh.lo <= p < sh.hi}
        out = {}
        for part in self.comm.all_gather_object(mine):
            out.update(part)
        return out

    def hits(self, out: Retrieved) -> list:
        """api.LinearRAG.hits for a sharded result (every rank gets the same list)."""
        from ..corpus import Hit

        idx, scores = out.indices.cpu().tolist(), out.scores.cpu().tolist()
        info = self.passages([i for row in idx for i in row if i >= 0])
        return [[Hit(info[i][0], float(s), info[i][1], info[i][2], i) for i, s in zip(row, srow) if i >= 0]
                for row, srow in zip(idx, scores)]


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
                     device="cpu") -> EncodedQueries:
    """LinearRAG.encode_queries for a sharded index (rank 0 runs it and broadcasts the result)."""
    from .. import models
    from ..corpus import check_question
    from ..retrieval.pipeline import QuestionPipeline

    for q in questions:
        check_question(q)
    pipe = QuestionPipeline(qindex, nlp or models.load_nlp(qindex.index_config),
                            encoder or models.load_encoder(qindex.index_config, device))
    enc = pipe.encode(questions, pipe.entities(questions, cfg.lexicon_seeds, None, cfg.question_ner), True)
    return EncodedQueries(enc.query_emb, enc.entity_emb, enc.entity_owner, enc.entity_text, enc.entity_rows, None)
