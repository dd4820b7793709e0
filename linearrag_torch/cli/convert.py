"""`linearrag convert INDEX_DIR OUT_DIR --embedding-dtype D`: an index's embeddings in another precision."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ..config import IndexConfig
from .common import check_output_dir, count, open_index_dir


def add_parser(sub) -> None:
    cv = sub.add_parser("convert", help="store an index's embeddings in another precision, without re-encoding",
                        description="Write INDEX_DIR's index to OUT_DIR with its passage, sentence and entity vectors "
                                    "stored as --embedding-dtype (each rounded to the nearest value: the same vectors a "
                                    "fresh `linearrag index --embedding-dtype` build stores; the graph matrices, strings "
                                    "and settings are copied exactly). OUT_DIR may be INDEX_DIR (replaced atomically "
                                    "under its lock). Back to float32 from a half index does not restore the rounded bits.")
    cv.add_argument("index_dir", metavar="INDEX_DIR")
    cv.add_argument("out_dir", metavar="OUT_DIR")
    cv.add_argument("--embedding-dtype", required=True,
                    choices=IndexConfig.__dataclass_fields__["embedding_dtype"].metadata["choices"],
                    help=IndexConfig.__dataclass_fields__["embedding_dtype"].metadata["help"])


def run(args) -> int:
    from ..index import TriGraphIndex, index_lock  # deferred: imports torch, which `linearrag --help` must not load
    from ..index.storage import make_dirs

    t0 = time.perf_counter()
    src, out = open_index_dir(args.index_dir), Path(args.out_dir)
    same = out.exists() and out.resolve() == src.resolve()

    def folder_bytes(p: Path) -> int:
        return sum(f.stat().st_size for f in p.iterdir() if f.is_file())

    check_output_dir(out)
    size_before = folder_bytes(src)
    make_dirs(out)
    with index_lock(out):  # OUT_DIR: one writer; INDEX_DIR too when they are the same folder
        index = TriGraphIndex.load(src)
        before = index.index_config.embedding_dtype
        index.with_embedding_dtype(args.embedding_dtype).save(out)
    n = max(index.num_passages, 1)
    print(f"converted {count(index.num_passages, 'passage')} from {before} ({size_before / n:,.0f} bytes per passage) to "
          f"{args.embedding_dtype} ({folder_bytes(out) / n:,.0f} bytes per passage) "
          f"{'in place in ' + str(out) if same else 'into ' + str(out)} in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return 0
