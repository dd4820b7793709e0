"""One index sharded across processes (torch.distributed): every rank holds a contiguous range of the
passages with the sentence and entity rows they need, runs the batched query path on its shard, and
exchanges only what the math makes global. The result equals engine.retrieve on the whole index (up to
float summation order, ~1e-7). docs/METHOD.md, "Sharded retrieval", derives each exchange; in short:

    seeds (eq. 3)     each entity is scanned by one rank (its owner); all-gather of [best, arg] per
                      question entity, the largest cosine wins, ties to the lowest entity index
    activation        the state (active pairs) is replicated; each sentence is owned by one rank.
      reference       per step: all-gather of each frontier pair's top_k_sentence unused (sigma, sentence)
                      -> the global top_k_sentence; all-gather of the candidates the taken sentences give
      paper           per step: all-gather of the partial sums M^T(sigma . M a) over owned sentences
    eq. 7             all-reduce max of the per-question min and max of cos(q, p) (min-max normalisation);
                      ln(1 + N_ep) sums are local (a passage's row of N is on its rank)
    PageRank          reset normalisation: all-reduce of the passage reset sums (and the reset's dangling
                      mass). Per block Gauss-Seidel step (walk.ShardWalk) an all-reduce of [shared entities + 1,
                      B]: the partial W_ep p' of the entities whose passages lie on several ranks and the new
                      passages' dangling mass; then one of the step's L1 change [B]
    top-k             all-gather of each rank's local top k, merged best first, ties to the lower passage
    chain round       the owner of a source passage computes its chain seeds; all-gather and max
                      per entity; the seed vectors come from the entities' owners (all-reduce)
    pair rerank       all-reduce of the top pair_candidates passages' vectors [B, N, D] (zeros where not
                      held); all-gather of the (question, slot, entity) links of the candidates each rank holds
    learned rerank    each rank scores, in one batched pass, the (question, candidate) pairs of the candidates
      (and in the     it holds; all-reduce of the logits [B, K] (zeros where not held), then every rank fuses and
      chain rounds)   orders the same. A chain-aware reranker's context passages (each question's top two
                      candidates): all-reduce of the distinct ones' tokens [U, Lp + 1] first
    explain           the trace is the same on every rank (the state is replicated); all-gather of the hits'
                      passages with their entity ids

The math is written once: the stage list (retrieval/stages.py) runs on a ShardedEngine as on the torch engine,
the graph round (retrieval/round.py) runs with the ShardedEngine as its round.Part as it runs on the whole index
(engine.DeviceGraph, through the communicator's one-process form), and the activation (activation.propagate_reference_pairs, propagate_paper / kernels.propagate_step) and the
reranker (rerank.Reranker.rerank) take where the rows live as an argument: the whole index in one process
(every exchange the identity: activation.WholeIndex, rerank.PassageTokens), a shard's here (_ShardRows,
_ShardPassageTokens over Comm). adjacent_passages alone is refused (its edges link passages across ranks).

Use: ``Shard.build(index, rank, world)`` then ``ShardedEngine(shard, Comm()).retrieve(queries, cfg)``
inside an initialised process group (``Comm(False)`` for one process without torch.distributed).
``run_local`` starts N local processes; ``python -m linearrag_torch.distributed`` is the torchrun entry point.

    comm.py      Comm (runtime/comm.py): the collectives (the identity in one process), bytes and seconds per phase
    shard.py     Shard: what one rank holds, built from the whole index (passage_bounds)
    walk.py      ShardWalk: the step of eq. 6's walk on a shard (pagerank.personalized_pagerank runs the loop)
    engine.py    ShardedEngine: a shard as the graph round's part; the question side (QuestionIndex, encode_questions)
    launch.py    process groups (init_group, run_local), the per-rank jobs, `linearrag query --shards N`
    __main__.py  the torchrun entry point
"""
from .comm import Comm
from .engine import QuestionIndex, ShardedEngine, encode_questions
from ..env import device_for  # the device of a rank (env.py holds the hardware checks)
from .launch import init_group, query_job, retrieve_job, run_local
from .shard import Shard, passage_bounds

__all__ = ["Comm", "QuestionIndex", "Shard", "ShardedEngine", "device_for", "encode_questions", "init_group",
           "passage_bounds", "query_job", "retrieve_job", "run_local"]
