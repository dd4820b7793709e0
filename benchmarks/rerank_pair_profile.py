"""Where `rerank=True`'s time goes: per call of the cross-encoder (the chain round's rerank, the final list's), its
pairs a question, its passes, each pair's own length (tokens before the padding) against the pairs' fixed length,
the filling copies of the last pass, and the seconds in the cross-encoder's forward passes against the whole
retrieve (issue 50).

    python -m benchmarks.rerank_pair_profile --data DIR [DIR ...] --indexes IDX [IDX ...] [--questions 64]
                                             [--json OUT] [--set rerank_length_step=16 ...]

One batch of ``--questions`` questions per data set through ``rag.retrieve`` with ``rerank=True`` (after a warm-up
batch), the defaults unless ``--set FIELD=VALUE`` changes them; torch's threads as set (``OMP_NUM_THREADS``).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402


def profile(rag, questions: list[str], cfg) -> dict:
    from benchmarks.quality import encode
    from linearrag_torch.models.reranker import CrossEncoder
    from linearrag_torch.rerank.scoring import Reranker

    rag.retrieve(encode(rag, questions[:8], cfg), cfg)  # warm-up: the model loaded, the passages tokenised
    calls, fwd = [], [0.0]
    orig_fwd, orig_pairs = CrossEncoder.forward, Reranker.pair_logits

    def forward(self, ids, mask, types=None):
        t0 = time.perf_counter()
        out = orig_fwd(self, ids, mask, types)
        fwd[0] += time.perf_counter() - t0
        calls[-1]["lengths"] += mask.sum(1).tolist()
        calls[-1]["shapes"].append(list(ids.shape))
        return out

    def pair_logits(self, q, p, q_of_pair, *args, **kw):
        calls.append({"pairs": q_of_pair.numel(), "lengths": [], "shapes": []})
        return orig_pairs(self, q, p, q_of_pair, *args, **kw)

    CrossEncoder.forward, Reranker.pair_logits = forward, pair_logits
    try:
        enc = encode(rag, questions, cfg)
        timings: dict = {}
        t0 = time.perf_counter()
        rag.retrieve(enc, cfg, timings=timings)
        total = time.perf_counter() - t0
    finally:
        CrossEncoder.forward, Reranker.pair_logits = orig_fwd, orig_pairs
    B = len(questions)
    out = {"questions": B, "retrieve_s": round(total, 3), "cross_encoder_s": round(fwd[0], 3),
           "timings_s": {k: round(v, 3) for k, v in timings.items()}, "calls": []}
    laid = own = 0
    for name, c in zip(["chain round", "final list"] if len(calls) == 2 else [f"call {i}" for i in range(len(calls))],
                       calls):
        rows = sum(s[0] for s in c["shapes"])
        tokens = sum(s[0] * s[1] for s in c["shapes"])
        own_c = sum(c["lengths"][:c["pairs"]])  # the pairs' own tokens (the filling copies left out)
        laid += tokens
        own += own_c
        hist = collections.Counter(min(c["shapes"][0][1], -(-n // 8) * 8) for n in c["lengths"][:c["pairs"]])
        out["calls"].append({"call": name, "pairs_per_question": round(c["pairs"] / B, 2), "passes": len(c["shapes"]),
                             "filling_copies": rows - c["pairs"], "pass_shapes": sorted({tuple(s) for s in c["shapes"]}),
                             "mean_pair_tokens": round(own_c / max(c["pairs"], 1), 1),
                             "pairs_by_length_rounded_to_8": dict(sorted(hist.items())),
                             "padding_share": round(1 - own_c / max(tokens, 1), 4)})
    out["padding_share"] = round(1 - own / max(laid, 1), 4)  # padding and filling copies among the tokens laid out
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.rerank_pair_profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", nargs="+", type=Path, required=True)
    ap.add_argument("--indexes", nargs="+", type=Path, required=True)
    ap.add_argument("--questions", type=int, default=64)
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="RetrievalConfig settings changed")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if len(args.indexes) != len(args.data):
        ap.error("give one index per data folder")
    from benchmarks.rerank_loop import variants
    from linearrag_torch import LinearRAG
    from linearrag_torch.corpus import read_questions

    cfg = variants(["x=" + ",".join(args.set)])["x"]
    res = {"command": " ".join(["python", "-m", "benchmarks.rerank_pair_profile"] + (argv or sys.argv[1:])),
           "date": time.strftime("%Y-%m-%d"), "torch_threads": torch.get_num_threads(), "datasets": {}}
    for data, index in zip(args.data, args.indexes):
        rag = LinearRAG.load(index, device="cpu")
        qs = [q["question"] for q in read_questions(str(data / "questions.jsonl"))][:args.questions]
        res["precision"] = rag.reranker(cfg).precision
        res["datasets"][data.name] = got = profile(rag, qs, cfg)
        print(f"{data.name}: cross-encoder {got['cross_encoder_s']} of {got['retrieve_s']} s, padding "
              f"{got['padding_share']:.1%}; " + "; ".join(f"{c['call']} {c['pairs_per_question']} pairs/q, "
                                                         f"{c['mean_pair_tokens']} tokens" for c in got["calls"]),
              file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
