"""Command line: `linearrag index | add | delete | convert | query | answer | demo` (run `linearrag COMMAND --help`)."""
from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import time
from pathlib import Path

from . import __version__, env
from .cli_common import check_output_dir, count, open_index_dir, order_note, print_explanations, print_hits, question_items, retrieval_settings, sizes, snippet
from .config import ENCODER_BACKENDS, IndexConfig, RetrievalConfig, add_flags


def _add_settings(p: argparse.ArgumentParser, stored: bool) -> None:
    """The RetrievalConfig flags (config.py holds each one's help). Left out, a flag keeps the stored
    value (query, answer) or the library's default (index): the flags default to None either way."""
    if stored:
        g = p.add_argument_group("retrieval settings", "default: the values stored with the index")
    else:  # `index`: nothing here changes the build; the values become the index's stored defaults
        g = p.add_argument_group(
            "retrieval settings stored with the index",
            "not used to build it: stored as the defaults of query, answer and serve, which take the same flags "
            "per call; default: the library's (docs/QUALITY.md; see --reference-code)",
        )
    # query and answer have their own --top-k (per call, not stored)
    names = add_flags(g, RetrievalConfig, unset_none=True, show_defaults=not stored, skip=("top_k",) if stored else ())
    p.set_defaults(retrieval_fields=names)
    g.add_argument("--reference-code", action="store_true",
                   help="start from the reference code's settings (lam 0.05, damping 0.5, no lexicon seeds, one round)")


def _retrieval_config(args, base: RetrievalConfig) -> RetrievalConfig:
    """``base`` (or the reference code's settings with --reference-code) changed by the flags given."""
    if args.reference_code:
        base = RetrievalConfig.reference_code(top_k=base.top_k)
    return base.replace(**retrieval_settings(args))


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _query_speed_args(p):
    p.add_argument("--quantize", choices=("bfloat16", "int8", "int8-all"), default=None,
                   help="the question encoder in reduced precision: bfloat16 (bf16 autocast where the device has "
                        "native bf16: ~2.4x faster on a CPU with AMX; a question's scores then depend on its batch "
                        "by ~1e-4), int8 or int8-all (int8 Linear layers, CPU only; vectors within cosine ~0.99 "
                        "resp. ~0.98 of the exact ones). Default: exact float32 whatever the index was encoded in")
    p.add_argument("--encoder-backend", choices=ENCODER_BACKENDS, default="torch",
                   help="where the question encoder runs: torch, or onnx (float32 on ONNX Runtime, CPU only, extra "
                        "[onnx]: the same vectors to float noise, its encoder stage ~1.2-1.3x faster; exported "
                        "once into ~/.cache/linearrag_torch/onnx) (default torch)")
    p.add_argument("--threads", type=_positive_int, default=None,
                   help="torch threads (default: $LINEARRAG_THREADS, else one per core; use 1 on cores shared "
                        "with other busy processes)")


def _device_arg(p):
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N (default auto)")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="linearrag",
        description="LinearRAG graph retrieval (entities, sentences, passages; activation + PageRank) on torch.",
    )
    top.add_argument("--version", action="version", version=f"linearrag {__version__}")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("index", help="build an index from a JSONL corpus",
                       usage="%(prog)s CORPUS.jsonl INDEX_DIR [index settings] [retrieval settings] [--ray ...] [--device D]",
                       description="Sentence split, NER and encode every passage; write the Tri-Graph index to INDEX_DIR.")
    p.add_argument("corpus", metavar="CORPUS.jsonl", help='one JSON object per line: "text", optional "id" and "title"')
    p.add_argument("index_dir", metavar="INDEX_DIR")
    p.set_defaults(index_fields=add_flags(p.add_argument_group("index settings", "stored with the index (config.IndexConfig)"),
                                          IndexConfig))
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    _device_arg(p)
    _add_settings(p, stored=False)
    from .indexing.ray_build import add_flags as add_ray_flags

    add_ray_flags(p)

    a = sub.add_parser("add", help="add the passages of a JSONL file to an index",
                       description="Sentence split, NER and encode only the new passages and append them to the index in "
                                   "INDEX_DIR (new sentences and entities are appended, existing ones reused by their text); "
                                   "the result answers like an index built from all passages at once. Ids must be new. "
                                   "The folder is locked while it is updated and replaced atomically.")
    a.add_argument("index_dir", metavar="INDEX_DIR")
    a.add_argument("corpus", metavar="MORE.jsonl", help='one JSON object per line: "text", optional "id" and "title" '
                                                          "(a missing id continues the index's numbering)")
    a.add_argument("--quiet", action="store_true", help="no progress bars")
    _device_arg(a)
    add_ray_flags(a)

    r = sub.add_parser("delete", help="remove passages from an index",
                       description="Remove passages by id, with the sentences and entities no remaining passage has; "
                                   "the result answers like an index built without them. The folder is locked while "
                                   "it is updated and replaced atomically.")
    r.add_argument("index_dir", metavar="INDEX_DIR")
    r.add_argument("--ids", metavar="ID,...", help="comma-separated passage ids")
    r.add_argument("--ids-file", metavar="FILE", help='one id per line, or JSON lines with an "id" field (a corpus file)')

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

    q = sub.add_parser("query", help="retrieve: rank the passages of an index for questions",
                       description="Rank passages for each question (arguments, or --questions FILE.jsonl).")
    q.add_argument("index_dir", metavar="INDEX_DIR")
    q.add_argument("question", nargs="*", help="question text(s)")
    q.add_argument("--questions", metavar="FILE.jsonl", help='JSON lines with "question" and optional "id"')
    q.add_argument("--top-k", type=_positive_int, default=None, help="passages per question (default: the index's, 5)")
    q.add_argument("--json", action="store_true", help="one JSON object per question per line")
    q.add_argument("--explain", action="store_true", help="print per question, as one JSON line, how its hits were "
                   "reached (LinearRAG.explain: entities, seeds, chain seeds, pair and rerank detail) (torch engine)")
    q.add_argument("--backend", choices=("torch", "scipy"), default="torch", help="torch engine or the scipy reference")
    q.add_argument("--batch-size", type=_positive_int, default=256, help="questions per batched call (default %(default)s)")
    _query_speed_args(q)
    q.add_argument("--ner-processes", type=int, default=0, metavar="N",
                   help="spaCy NER of each batch of 16 or more questions split over N worker processes and this one "
                        "(~340 MB and ~2 s to start each; pays with cores to spare) (default 0: NER here alone)")
    q.add_argument("--shards", type=_positive_int, default=None, metavar="N",
                   help="split the index over N local processes (torch.distributed: gloo on CPU, NCCL on GPUs) "
                        "and answer as one; prints what one process prints (docs/scale-out.md: across machines with torchrun)")
    _device_arg(q)
    _add_settings(q, stored=True)

    sv = sub.add_parser("serve", help="serve an index over HTTP with dynamic batching, limits and metrics",
                        description="Serve INDEX_DIR over HTTP (FastAPI on uvicorn; needs pip install "
                                    "'linearrag_torch[serve]'). Concurrent requests are batched into one engine call "
                                    "(up to --max-batch-size questions or --max-wait-ms). Routes: POST /v1/search, "
                                    "GET /health, /info, /metrics (Prometheus), POST /admin/reload, and the OpenAPI "
                                    "page at /docs. SIGTERM answers the requests in flight, then exits 0. With --ray: "
                                    "the same routes on Ray Serve, --replicas N (or --autoscale MIN,MAX) engine "
                                    "replicas, one per GPU where the cluster has GPUs (pip install "
                                    "'linearrag_torch[ray]').")
    sv.add_argument("index_dir", metavar="INDEX_DIR")
    from .answers.generation import add_llm_flags
    from .serve.ray_app import add_flags as add_ray_flags
    from .serve.settings import add_flags as add_serve_flags

    add_serve_flags(sv)
    add_ray_flags(sv)
    add_llm_flags(sv)  # optional: POST /v1/answer needs a chat model

    an = sub.add_parser("answer", help="answer questions with a chat model from the retrieved passages",
                        description="Retrieve the top-k passages of each question (arguments, or --questions "
                                    "FILE.jsonl), ask an OpenAI-compatible chat model to reason briefly and end with "
                                    "'Answer: ...', and print the parsed answers. Replies are cached on disk, so a "
                                    "rerun costs no tokens. An endpoint error prints one line naming the URL and the "
                                    "HTTP status and exits 2.")
    an.add_argument("index_dir", metavar="INDEX_DIR")
    an.add_argument("question", nargs="*", help="question text(s)")
    an.add_argument("--questions", metavar="FILE.jsonl", help='JSON lines with "question" and optional "id"')
    an.add_argument("--top-k", type=_positive_int, default=5, help="passages shown to the model (default %(default)s)")
    an.add_argument("--json", action="store_true",
                    help='one JSON object per question per line: {"id", "question", "answer", "reply", "marker_found", '
                         '"cached", "usage", "passages": [{"id", "score", "title"}]}')
    an.add_argument("--batch-size", type=_positive_int, default=256, help="questions per retrieval call (default %(default)s)")
    _device_arg(an)
    from .answers.generation import add_llm_flags

    add_llm_flags(an)
    _add_settings(an, stored=True)

    d = sub.add_parser("demo", help="index the bundled sample corpus and show the passages found for its multi-hop questions",
                       description="Index a few hundred bundled 2WikiMultiHopQA passages (cached after the first run) "
                                   "and show, for each bundled question, the passages found and the entities that bridged them.")
    d.add_argument("--top-k", type=int, default=3, help="passages shown per question (default %(default)s)")
    d.add_argument("--questions", type=int, default=5, help="how many bundled questions to answer (default %(default)s)")
    d.add_argument("--cache", default=None, help="where to keep the demo index (default: ~/.cache/linearrag_torch)")
    _device_arg(d)
    from .rerank.options import add_parser as add_train_reranker

    add_train_reranker(sub)
    return top


def cmd_index(args) -> int:
    from .api import LinearRAG

    t0 = time.perf_counter()
    check_output_dir(args.index_dir)  # not after minutes of indexing
    cfg = _retrieval_config(args, RetrievalConfig())
    icfg = IndexConfig(**{name: getattr(args, name) for name in args.index_fields})
    from contextlib import nullcontext

    from .index import index_lock

    existing = Path(args.index_dir).is_dir()  # replacing an index: lock before the work, not only to write
    with index_lock(args.index_dir) if existing else nullcontext():
        if args.ray is not None:  # the local build does not touch the Ray code
            from .indexing.ray_build import build as ray_build, options_from_args

            rag = ray_build(args.corpus, index_config=icfg, config=cfg, options=options_from_args(args),
                            device=args.device, progress=not args.quiet)
        else:
            rag = LinearRAG.build(args.corpus, index_config=icfg, config=cfg, device=args.device, progress=not args.quiet)
        rag.save(args.index_dir)
    s = rag.index.summary()
    print(f"indexed {sizes(s)} "
          f"(nnz M {s['nnz_M']}, C {s['nnz_C']}, N {s['nnz_N']}) into {args.index_dir} "
          f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def _update_index(index_dir: str, device: str, change, verb: str, preposition: str) -> int:
    """Load INDEX_DIR under its writer lock, apply change(rag), save atomically, report the sizes
    ("<verb> N passages (+S sentences, +E entities) <preposition> INDEX_DIR: now ...")."""
    from .api import LinearRAG
    from .index import index_lock

    t0 = time.perf_counter()
    path = open_index_dir(index_dir)
    with index_lock(path):  # held for the whole read-modify-write
        rag = LinearRAG.load(path, device=device)
        before = rag.index.summary()
        change(rag)
        rag.save(path)
    after = rag.index.summary()
    growth = ", ".join(f"{'+' if d >= 0 else '-'}{count(abs(d), noun, plural)}" for d, noun, plural in (
        (after["sentences"] - before["sentences"], "sentence", None),
        (after["entities"] - before["entities"], "entity", "entities")))
    n = abs(after["passages"] - before["passages"])
    print(f"{verb} {count(n, 'passage')} ({growth}) {preposition} {index_dir}: now {sizes(after)} "
          f"in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


def cmd_add(args) -> int:
    if args.ray is not None:  # the local update does not touch the Ray code
        from .indexing.ray_build import add as ray_add, options_from_args

        ray = options_from_args(args)
        return _update_index(args.index_dir, args.device,
                             lambda rag: ray_add(rag, args.corpus, ray, progress=not args.quiet), "added", "to")
    return _update_index(args.index_dir, args.device, lambda rag: rag.add(args.corpus, progress=not args.quiet),
                         "added", "to")


def cmd_delete(args) -> int:
    ids = []
    if args.ids is not None:
        ids += [x.strip() for x in args.ids.split(",")]
        if any(not x for x in ids):
            raise ValueError(f"--ids {args.ids!r} holds an empty id")
    if args.ids_file:
        ids += _read_ids(Path(args.ids_file))
    if not ids:
        raise ValueError("no id given (--ids ID,... or --ids-file FILE)")
    return _update_index(args.index_dir, "cpu", lambda rag: rag.delete(ids), "deleted", "from")


def _read_ids(path: Path) -> list:
    """Ids of an --ids-file: one per line (blank lines skipped), or JSON objects with an "id"."""
    from .corpus import InputError, read_input

    raw = read_input(path, "a file of ids")
    ids = []
    for lineno, line in enumerate(raw.split(b"\n"), 1):
        where = f"{path}, line {lineno}"
        try:
            text = line.decode("utf-8-sig" if lineno == 1 else "utf-8").strip()
        except UnicodeDecodeError as exc:
            raise InputError(f"{where}: not valid UTF-8 (byte {exc.start + 1} of the line)") from None
        if not text:
            continue
        if text.startswith("{"):
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InputError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(obj, dict) or isinstance(obj.get("id"), bool) or not isinstance(obj.get("id"), (int, str)):
                raise InputError(f'{where}: expected an id, or a JSON object with an integer or string "id"')
            text = obj["id"]
        ids.append(text)
    return ids


def cmd_convert(args) -> int:
    from .index import TriGraphIndex, index_lock
    from .index.storage import make_dirs

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


def _require_encoder_backend(backend: str) -> None:
    """--encoder-backend onnx without the [onnx] extra: one line naming it, before the index loads."""
    if backend == "onnx":
        from .extras import require

        require("onnx", "onnxruntime", "onnx", what="--encoder-backend onnx")


def cmd_query(args) -> int:
    from .api import LinearRAG

    items = question_items(args)
    _require_encoder_backend(args.encoder_backend)
    if args.ner_processes < 0:
        raise SystemExit(f"linearrag query: error: --ner-processes must be >= 0, got {args.ner_processes}")
    if args.shards:
        if args.ner_processes:
            raise SystemExit("linearrag query: error: --ner-processes does not apply with --shards")
        from .distributed.launch import cmd_query_sharded

        return cmd_query_sharded(args, items)
    from .runtime.threads import set_threads

    set_threads(args.threads)
    rag = LinearRAG.load(args.index_dir, device=args.device, quantize=args.quantize,
                         encoder_backend=args.encoder_backend)
    rag.config = _retrieval_config(args, rag.config)
    if args.ner_processes and len(items) >= 16:  # smaller batches would not use them
        rag.start_ner_processes(args.ner_processes)
    results = []
    try:
        for start in range(0, len(items), args.batch_size):
            qs = [it["question"] for it in items[start:start + args.batch_size]]
            results += rag.explain(qs, top_k=args.top_k) if args.explain else \
                rag.search(qs, top_k=args.top_k, backend=args.backend)
    finally:
        rag.close()
    if args.explain:
        print_explanations(items, results)
        return 0
    print_hits(items, results, args.json, order_note(rag.config.replace(top_k=args.top_k)))
    return 0


def _check_port(host: str, port: int) -> None:
    """A clear error now when HOST:PORT cannot be bound (in use, say): the server binds it only after the index
    has loaded, and uvicorn then fails with its own traceback (Errno 98). The port is bound as uvicorn binds it
    (SO_REUSEADDR: a port whose last connections linger in TIME_WAIT is free) and released at once."""
    if port == 0:  # any free port
        return
    import socket

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
    except OSError as exc:
        hint = " (another server? choose another --port)" if exc.errno == errno.EADDRINUSE else ""
        raise ValueError(f"cannot serve on {host}:{port}: {exc.strerror or exc}{hint}") from None


def cmd_serve(args) -> int:
    try:
        from .serve.app import serve
    except ImportError as exc:
        raise ValueError(f"serving needs the 'serve' extra: pip install 'linearrag_torch[serve]' ({exc})") from None
    from .serve.settings import from_args

    from .serve.ray_app import RaySettings
    from .serve.ray_app import from_args as ray_from_args

    ray_settings = ray_from_args(args)
    if not ray_settings.ray and ray_settings != RaySettings():
        raise ValueError("the Ray Serve settings (--replicas, --autoscale, ...) need --ray")
    open_index_dir(args.index_dir)  # a clear error now for a folder that holds no index
    _require_encoder_backend(getattr(args, "encoder_backend", "torch"))
    if not (ray_settings.ray and ray_settings.ray_address):  # a remote cluster's nodes bind it, not this one
        _check_port(args.host, args.port)
    llm = None
    if args.llm_base_url or args.llm_model or env.LLM_BASE_URL.get():
        from .answers.generation import LLMError, llm_from_args

        try:
            llm = llm_from_args(args)
        except LLMError as exc:  # no model, say: status 2
            raise ValueError(str(exc)) from None
    if ray_settings.ray:
        try:
            from ray import serve as _  # noqa: F401
        except ImportError as exc:
            raise ValueError(f"--ray needs the 'ray' extra: pip install 'linearrag_torch[ray]' ({exc})") from None
        import functools

        from .serve.ray_app import serve_ray

        # the ingress replica makes its own LLM from the same flags (an LLM object holds locks and a cache)
        llm_factory = functools.partial(llm_from_args, args) if llm is not None else None
        return serve_ray(os.path.abspath(args.index_dir), from_args(args), ray_settings, llm_factory)
    return serve(args.index_dir, from_args(args), llm)


def cmd_answer(args) -> int:
    from .api import LinearRAG
    from .answers.generation import LLMError, answer_batch, llm_from_args

    items = question_items(args)
    try:
        # a missing URL or model fails before the index loads; a retry says what it waits for and how long
        llm = llm_from_args(args, notify=lambda line: print(f"linearrag answer: waiting: {line}", file=sys.stderr,
                                                             flush=True))
        rag = LinearRAG.load(args.index_dir, device=args.device)
        rag.config = _retrieval_config(args, rag.config)
        hits = []
        for start in range(0, len(items), args.batch_size):
            hits += rag.search([it["question"] for it in items[start:start + args.batch_size]], top_k=args.top_k)
        answers = answer_batch(hits, [it["question"] for it in items], llm, top_k=args.top_k)
    except LLMError as exc:
        print(f"linearrag answer: error: {exc}", file=sys.stderr)
        return 2
    for it, a in zip(items, answers):
        if args.json:
            d = a.to_dict(include_text=False)
            print(json.dumps({"id": it["id"], **d}, ensure_ascii=False))
        else:
            print(f"Q {it['id']}: {it['question']}")
            print(f"  A: {a.answer}" + ("" if a.marker_found else "  (no 'Answer:' line: the whole reply)"))
            print("  from: " + "; ".join(f"[{p.id}] {p.title or snippet(p.text, 40)}" for p in a.passages))
    spent = sum(a.usage.get("total_tokens", 0) for a in answers if not a.cached)
    print(f"answered {count(len(answers), 'question')} with {llm.model}: {count(sum(a.cached for a in answers), 'reply', 'replies')} "
          f"from the cache, {count(spent, 'token')} spent", file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(args)


def cmd_train_reranker(args) -> int:
    from .rerank.options import run

    return run(args)


def main(argv=None) -> int:
    env.offline_by_default()
    args = parser().parse_args(argv)
    from .corpus import InputError
    from .extras import MissingExtra
    from .retrieval.memory import keep_freed_memory

    keep_freed_memory()  # this process is ours: reuse freed memory instead of faulting it in again
    from .index import IndexFormatError
    from .models.reranker import RerankerLoadError

    try:
        commands = {"index": cmd_index, "add": cmd_add, "delete": cmd_delete, "query": cmd_query, "demo": cmd_demo,
                    "serve": cmd_serve, "convert": cmd_convert}
        commands["answer"] = cmd_answer
        commands["train-reranker"] = cmd_train_reranker
        return commands[args.command](args)
    except (InputError, IndexFormatError, RerankerLoadError, MissingExtra, ValueError, FileNotFoundError, OSError) as exc:
        print(f"linearrag {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
