"""`linearrag add INDEX_DIR MORE.jsonl`: add passages to an index."""
from __future__ import annotations

from .common import update_index
from .flags import add_ray_build_flags, device_arg, ray_options


def add_parser(sub) -> None:
    a = sub.add_parser("add", help="add the passages of a JSONL file to an index",
                       description="Sentence split, NER and encode only the new passages and append them to the index in "
                                   "INDEX_DIR (new sentences and entities are appended, existing ones reused by their text); "
                                   "the result answers like an index built from all passages at once. Ids must be new. "
                                   "The folder is locked while it is updated and replaced atomically.")
    a.add_argument("index_dir", metavar="INDEX_DIR")
    a.add_argument("corpus", metavar="MORE.jsonl", help='one JSON object per line: "text", optional "id" and "title" '
                                                          "(a missing id continues the index's numbering)")
    a.add_argument("--quiet", action="store_true", help="no progress bars")
    device_arg(a)
    add_ray_build_flags(a)


def run(args) -> int:
    if args.ray is not None:  # the local update does not touch the Ray code
        from ..indexing.ray_build import add as ray_add

        ray = ray_options(args)
        return update_index(args.index_dir, args.device,
                            lambda rag: ray_add(rag, args.corpus, ray, progress=not args.quiet), "added", "to")
    return update_index(args.index_dir, args.device, lambda rag: rag.add(args.corpus, progress=not args.quiet),
                        "added", "to")
