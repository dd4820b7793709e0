"""`linearrag train-set-reader`: mine the engine's candidate sets of the training questions, then train the set
reader (set_reader.py) on them.

Mining (cli/train_set_reader.py's ``mine_sets``: the engine is the command line's to give, as for
`linearrag train-reranker`): each training question runs through the engine's own query path with ``--rerank`` (the
chain rounds' rerank included) over an index of the training file's paragraphs; its final list's first ``reach``
candidates (10) are read by the cross-encoder as the engine reads them, and kept in the graph's order: passage
keys, the graph's scores, the logits, the pooled vectors, whether the pair was read in the chain rounds' rerank,
and the question's embedding. The first ``rerank_candidates`` (5) of them are exactly what ``--rerank`` reads
(the pairs of a question depend only on its graph order's first two). The cache is one safetensors file and a JSON
file, so training the head takes minutes.

Training (``train_set_reader``): listwise, on the split of `linearrag train-reranker` (rerank.train.split_heldout:
1,213 questions trained, 135 held out): each trained question's set read at 5 and at 10 candidates, the loss
-sum over its gold candidates of log softmax(fused + delta) over its read candidates, over its gold count. Then,
on the held-out questions only: ``alpha`` (the weight of the head's correction; a grid) and the reach classifier's
threshold (the questions read at 10), the classifier itself trained on the trained questions (label: a gold
passage among the graph's candidates 6-10).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from .set_reader import SetReader, candidate_features, save_set_reader

CACHE_TENSORS = "sets.safetensors"
CACHE_INFO = "sets.json"


# ------------------------------------------------------------------------------------------------------ the cache
def save_sets(sets: dict, folder, info: dict) -> None:
    """The mined sets as ``folder``/sets.safetensors and sets.json."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sets.items()}, str(folder / CACHE_TENSORS))
    (folder / CACHE_INFO).write_text(json.dumps(info, indent=2) + "\n")


def load_sets(folder) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    folder = Path(folder)
    return load_file(str(folder / CACHE_TENSORS)), json.loads((folder / CACHE_INFO).read_text())


# ---------------------------------------------------------------------------------------------------- training
def pointwise(sets: dict, settings, read: torch.Tensor) -> torch.Tensor:
    """The shipped fused score of the mined candidates (-inf where not read)."""
    from .scoring import fuse

    return fuse(settings, sets["logits"], sets["graph_scores"]).masked_fill(~read, float("-inf"))


def read_mask(sets: dict, n: torch.Tensor) -> torch.Tensor:
    """[N, K] the first n[i] candidates of each question that hold a passage."""
    K = sets["rows"].shape[1]
    return (torch.arange(K).unsqueeze(0) < n.unsqueeze(1)) & (sets["rows"] >= 0)


def set_scores(reader: SetReader, sets: dict, settings, read: torch.Tensor, alpha: float | None = None,
               train: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(the set reader's scores, the pointwise fused scores) of the mined sets read at ``read``."""
    fused = pointwise(sets, settings, read)
    feats = candidate_features(sets["logits"], fused, sets["graph_scores"], sets["from_loop"], read)
    d = reader.delta(sets["vectors"].float(), feats, read)
    a = reader.alpha if alpha is None else alpha
    return torch.where(read, fused + a * d, float("-inf")), fused


def recall(scores: torch.Tensor, sets: dict, read: torch.Tensor, ks=(2, 5)) -> dict:
    """R@k (percent) of the lists ordered by ``scores`` over the read candidates, the unread after them in the
    graph's order (as Reranker.rerank orders them); a gold passage outside the candidates counts as missed."""
    K = scores.shape[1]
    key = torch.where(read, scores, -1e9 - torch.arange(K, dtype=torch.float32))
    key = key.masked_fill(sets["rows"] < 0, -1e12)
    order = torch.sort(key, dim=1, descending=True, stable=True).indices
    gold = sets["gold"].gather(1, order).float()
    n = sets["n_gold"].float().clamp(min=1)
    return {f"R@{k}": round(100.0 * float((gold[:, :k].sum(1) / n).mean()), 2) for k in ks}


def subset(sets: dict, ix) -> dict:
    ix = torch.as_tensor(ix, dtype=torch.int64)
    return {k: v.index_select(0, ix) for k, v in sets.items()}


def train_set_reader(sets: dict, train_ix, held_ix, settings, *, dim: int = 64, heads: int = 4, layers: int = 1,
                     epochs: int = 40, lr: float = 1e-3, batch: int = 32, seed: int = 0, base: int = 5,
                     reach: int = 10, reach_share: float = 0.4, log=print) -> tuple[SetReader, dict]:
    """Train the set reader on the mined sets ``train_ix``; fit ``alpha`` and the reach threshold on ``held_ix``.

    Parameters
    ----------
    sets : dict
        mine_sets' tensors.
    train_ix, held_ix : list of int
        The trained and held-out questions' positions in ``sets``.
    settings : RerankerSettings
        The cross-encoder's (its fusion weights make the pointwise score).
    base, reach : int
        Candidates read by default and for the questions the reach classifier picks.
    reach_share : float
        The largest share of held-out questions the threshold may send to ``reach`` (the cost).

    Returns
    -------
    (SetReader, dict)
        The reader (eval mode) and the facts for its card (held-out recall before and after, alpha, threshold).
    """
    t0 = time.time()
    torch.manual_seed(seed)
    tr, ho = subset(sets, train_ix), subset(sets, held_ix)
    H, D = tr["vectors"].shape[2], tr["query_emb"].shape[1]
    reader = SetReader(H, dim, heads, layers, query_dim=D)
    opt = torch.optim.AdamW([p for n, p in reader.named_parameters() if not n.startswith("reach.")], lr=lr,
                            weight_decay=0.01)
    N = tr["rows"].shape[0]
    views = [read_mask(tr, torch.full((N,), k)) for k in (base, reach)]
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for epoch in range(epochs):
        reader.train()
        total, count = 0.0, 0
        for view in views:
            perm = torch.randperm(N, generator=gen)
            for s in range(0, N, batch):
                ix = perm[s:s + batch]
                part, read = subset(tr, ix), view.index_select(0, ix)
                gold = part["gold"] & read
                keep = gold.any(1)
                if not keep.any():
                    continue
                score, _ = set_scores(reader, part, settings, read, alpha=1.0)
                logp = torch.log_softmax(score, 1).masked_fill(~read, 0.0)
                loss = -((logp * gold).sum(1) / gold.sum(1).clamp(min=1))[keep].mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                total, count = total + float(loss.detach()) * int(keep.sum()), count + int(keep.sum())
        losses.append(round(total / max(count, 1), 4))
    reader.eval()
    log(f"set reader: {epochs} epochs, loss {losses[0]} -> {losses[-1]}")
    # the reach classifier: a gold passage among the graph's candidates base+1 .. reach, on the trained questions
    label = (tr["gold"][:, base:reach].any(1)).float()
    ropt = torch.optim.LBFGS(reader.reach.parameters(), max_iter=200, line_search_fn="strong_wolfe")

    def nll():
        ropt.zero_grad()
        z = reader.reach(tr["query_emb"]).squeeze(-1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(z, label) + 1e-3 * reader.reach.weight.pow(2).sum()
        loss.backward()
        return loss

    ropt.step(nll)
    facts = {"epochs": epochs, "lr": lr, "batch": batch, "seed": seed, "dim": dim, "heads": heads, "layers": layers,
             "first_losses": losses[:5], "last_losses": losses[-5:], "trained_questions": len(train_ix),
             "heldout_questions": len(held_ix), "reach_label_share_trained": round(float(label.mean()), 4)}
    with torch.no_grad():
        Nh = ho["rows"].shape[0]
        r5, r10 = read_mask(ho, torch.full((Nh,), base)), read_mask(ho, torch.full((Nh,), reach))
        held = {"pointwise_5": recall(pointwise(ho, settings, r5), ho, r5),
                "pointwise_10": recall(pointwise(ho, settings, r10), ho, r10)}
        best = None
        for a in [x / 4 for x in range(0, 13)]:  # alpha on the held-out questions, read at 5
            got = recall(set_scores(reader, ho, settings, r5, alpha=a)[0], ho, r5)
            if best is None or got["R@2"] + got["R@5"] > best[1]["R@2"] + best[1]["R@5"]:
                best = (a, got)
        reader.alpha = best[0]
        held["set_5"] = best[1]
        held["set_10"] = recall(set_scores(reader, ho, settings, r10)[0], ho, r10)
        p = torch.sigmoid(reader.reach(ho["query_emb"]).squeeze(-1))
        best_t = (1.01, held["set_5"], 0.0)
        for t in sorted(set(torch.quantile(p, torch.linspace(1 - reach_share, 1, 9)).tolist())):
            n = torch.where(p > t, reach, base)
            rd = read_mask(ho, n)
            got = recall(set_scores(reader, ho, settings, rd)[0], ho, rd)
            if got["R@5"] + got["R@2"] > best_t[1]["R@5"] + best_t[1]["R@2"]:
                best_t = (t, got, float((p > t).float().mean()))
        reader.reach_threshold = float(best_t[0])
        held["set_reach"] = best_t[1]
        facts.update(alpha=reader.alpha, reach_threshold=round(reader.reach_threshold, 5),
                     heldout_reach_share=round(best_t[2], 4), heldout=held, train_seconds=round(time.time() - t0, 1))
    reader.facts = facts
    return reader, facts


def card(facts: dict, mining: dict, command: str | None = None) -> str:
    """SET_READER.md: the set reader's model card."""
    h = facts["heldout"]
    rows = "\n".join(f"| {name} | {v['R@2']} | {v['R@5']} |" for name, v in h.items())
    return f"""# linearrag_torch set reader

A small attention head over the reranker's candidates (rerank/set_reader.py): for each question it reads the
pooled vectors the cross-encoder of this folder computes for its candidates, with the cross-encoder's logit, the
pointwise fused score, the graph's rank and score and whether the pair was read in the chain rounds' rerank, lets
the candidates attend to each other ({facts['layers']} layer(s), width {facts['dim']}, {facts['heads']} heads) and adds
{facts['alpha']} x its correction to the pointwise fused score. A logistic classifier on the question's embedding
picks the questions whose first 10 candidates are read instead of 5 (threshold {facts['reach_threshold']}).
Used with `--rerank --rerank-set-reader` (`RetrievalConfig.rerank_set_reader`).

| | |
|---|---|
| base | none: trained from scratch on the vectors of this folder's cross-encoder (all-MiniLM-L6-v2, Apache-2.0) |
| data | datasets/train_multihop (1,348 training-split questions: 2WikiMultihopQA, Apache-2.0; HotpotQA, CC BY-SA 4.0; MuSiQue, CC BY 4.0): {facts['trained_questions']} trained, {facts['heldout_questions']} held out (alpha and the threshold fitted there); never the dev sets |
| candidate sets | mined with the engine's `--rerank` (chain rounds' rerank of 5, the final list's first 10 read, {mining.get('precision', '?')}) for {mining.get('mined_questions', '?')} questions over {len(mining.get('indexes', [])) or 1} index(es) of their {mining.get('paragraphs', '?')} paragraphs; {mining.get('seconds', '?')} s |
| loss | listwise: -log softmax of each gold candidate among the read ones (sets read at 5 and at 10) |
| optimiser | AdamW lr {facts['lr']}, weight decay 0.01, {facts['epochs']} epochs of {facts['batch']} questions; the classifier: L-BFGS, its label a gold passage among the graph's candidates 6-10 |
| seed | {facts['seed']} |
| time | {facts['train_seconds']} s of training (after {mining.get('seconds', '?')} s of mining) on {mining.get('device', '?')}, torch {mining.get('torch', '?')}, {mining.get('torch_threads', '?')} thread(s) |

Held-out training questions (R@2 / R@5 of the mined lists, percent):

| reader | R@2 | R@5 |
|---|---|---|
{rows}

Reproduce: `{command or mining.get('command', 'linearrag train-set-reader --train questions.jsonl --out DIR')}`.
"""
