"""Add passages to a copy of an index in batches, in this process, as the store's write does (read_passages, then
indexing.build.add_passages with the index's passage encoder), and save it: the index an HTTP ingest in batches
makes, without the server (to compare with a fresh build: benchmarks.compare_indexes).

    python -m benchmarks.add_in_batches BASE_DIR MORE.jsonl OUT_DIR [--batch 10]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from .common import log


def main(argv=None) -> int:
    from linearrag_torch import LinearRAG
    from linearrag_torch.corpus import read_passages
    from linearrag_torch.indexing.build import add_passages

    ap = argparse.ArgumentParser(prog="python -m benchmarks.add_in_batches", description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("more")
    ap.add_argument("out")
    ap.add_argument("--batch", type=int, default=10)
    args = ap.parse_args(argv)
    more = [json.loads(x) for x in Path(args.more).read_text(encoding="utf-8").splitlines() if x.strip()]
    out = Path(args.out)
    if out.exists():
        raise SystemExit(f"{out} exists")
    shutil.copytree(args.base, out)
    rag = LinearRAG.load(out, device="cpu")
    t0 = time.perf_counter()
    for s in range(0, len(more), args.batch):
        new = read_passages(more[s:s + args.batch], first_id=rag.index.num_passages,
                            existing_ids=rag.index.passage_ids)
        index = add_passages(rag.index, new, progress=False, nlp=rag.nlp, encoder=rag.models.passage_encoder(),
                             ids_checked=True)
        index.retrieval_config = rag.config
        rag.replace_index(index)
    log(f"added {len(more)} passages in batches of {args.batch} in {time.perf_counter() - t0:.1f} s "
        f"(encoder precision {rag.index.index_config.encoder_precision})")
    rag.save(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
