"""Compare two index folders that should be equal (an incremental update against a fresh build).

    python -m benchmarks.compare_indexes A_DIR B_DIR QUESTIONS.jsonl [--top-k 5]

Prints one JSON object: whether the strings, the matrices M, C, N, PS and the NER record are identical,
the largest |difference| of each embedding matrix, and, for every question in both retrieval modes,
whether the top-k passage ids are identical and the largest |score difference|; for each question whose
top-k differs (the first 20), both lists to top-k + 3 with their scores and the gap between the k-th score and
the next (a near tie that a small difference of the vectors reorders, or a real difference). Exit status 0 when
everything that must be exact is, every top-k list is identical and every score is within 1e-5.

The 2wiki figures of the add/delete work were made with the CLI, e.g. (H = the first half of the
corpus, R = the rest, F = the full corpus; `flock /tmp/linearrag-bench.lock` around timed steps):

    linearrag index corpus.jsonl F;  linearrag index H.jsonl H
    cp -r H A && linearrag add A R.jsonl            # A must equal F
    cp -r F D && linearrag delete D --ids-file R.jsonl   # D must equal H
    python -m benchmarks.compare_indexes A F questions.jsonl
    python -m benchmarks.compare_indexes D H questions.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from linearrag_torch import LinearRAG
from linearrag_torch.corpus import read_questions
from linearrag_torch.index import MATRICES, NER_PARTS

SCORE_TOL = 1e-5


def _same(x, y) -> bool:
    return tuple(x.shape) == tuple(y.shape) and all(torch.equal(getattr(x, k), getattr(y, k)) for k in ("crow", "col", "val"))


def compare(a_dir, b_dir, questions: list, top_k: int = 5, batch: int = 128) -> dict:
    A, B = LinearRAG.load(a_dir, device="cpu"), LinearRAG.load(b_dir, device="cpu")
    B.models.nlp, B.models.encoder = A.nlp, A.encoder  # one set of models
    ia, ib = A.index, B.index
    out = {"a": str(a_dir), "b": str(b_dir), "summary_a": ia.summary(), "summary_b": ib.summary(),
           "strings_equal": {f: getattr(ia, f) == getattr(ib, f)
                             for f in ("passage_ids", "titles", "texts", "sentences", "entities")},
           "matrices_equal": {m: _same(getattr(ia, m), getattr(ib, m)) for m in MATRICES},
           "ner_equal": None if ia.ner is None or ib.ner is None else
           {p: _same(getattr(ia.ner, p), getattr(ib.ner, p)) for p in NER_PARTS},
           "emb_max_abs_diff": {}}
    for f in ("passage_emb", "sentence_emb", "entity_emb"):
        ea, eb = getattr(ia, f), getattr(ib, f)
        out["emb_max_abs_diff"][f] = float((ea - eb).abs().max()) if ea.shape == eb.shape and ea.numel() else (
            0.0 if ea.shape == eb.shape else "shapes differ")
    for mode in ("reference", "paper"):
        ha, hb = [], []
        for s in range(0, len(questions), batch):
            encoded = A.encode_queries(questions[s:s + batch])  # the same question vectors for both
            cfg = A.config.replace(mode=mode, top_k=top_k)
            ha += A.hits(A.retrieve(encoded, cfg))
            hb += B.hits(B.retrieve(encoded, cfg))
        differing = [i for i, (x, y) in enumerate(zip(ha, hb)) if [h.id for h in x] != [h.id for h in y]]
        detail = []  # each differing question's lists a little past the cut, with their scores: a near tie or not
        for i in differing[:20]:
            encoded = A.encode_queries([questions[i]])
            cfg = A.config.replace(mode=mode, top_k=top_k + 3)
            xa, xb = A.hits(A.retrieve(encoded, cfg))[0], B.hits(B.retrieve(encoded, cfg))[0]
            detail.append({"question": i, "a": [[str(h.id), float(h.score)] for h in xa],
                           "b": [[str(h.id), float(h.score)] for h in xb],
                           "gap_at_cut_a": float(xa[top_k - 1].score - xa[top_k].score) if len(xa) > top_k else None,
                           "gap_at_cut_b": float(xb[top_k - 1].score - xb[top_k].score) if len(xb) > top_k else None})
        out[mode] = {"questions": len(questions), "same_top_k_ids": len(questions) - len(differing),
                     "differing": differing[:20], "differing_detail": detail,
                     "max_abs_score_diff": max((abs(h.score - g.score) for x, y in zip(ha, hb) for h, g in zip(x, y)),
                                               default=0.0)}
    exact = [*out["strings_equal"].values(), *out["matrices_equal"].values(), *(out["ner_equal"] or {}).values()]
    out["ok"] = all(exact) and all(out[m]["same_top_k_ids"] == len(questions) and out[m]["max_abs_score_diff"] <= SCORE_TOL
                                   for m in ("reference", "paper"))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.compare_indexes", description=__doc__.split("\n\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("questions", help='JSON lines with "question"')
    ap.add_argument("--top-k", type=int, default=5)
    args = ap.parse_args(argv)
    out = compare(args.a, args.b, [q["question"] for q in read_questions(args.questions)], args.top_k)
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
