"""`linearrag serve INDEX_DIR`: serve an index over HTTP (serve/), or on Ray Serve with --ray (serve/ray_app.py);
`linearrag serve PATH...` with several index folders, a folder of index folders, --store or --keys-file: serve them
as a store (serve/store.py: indexes by name, writes over HTTP, keys by index and role, the MCP endpoint)."""
from __future__ import annotations

import errno
import os

from .. import env
from ..answers.chat import LLMError
from ..serve.ray_app import RaySettings, serve_ray
from ..serve.settings import ServeSettings
from .common import open_index_dir, require_encoder_backend
from .flags import add_flags, add_llm_flags, llm_from_args, settings_from_args


def add_parser(sub) -> None:
    sv = sub.add_parser("serve", help="serve an index over HTTP with dynamic batching, limits and metrics",
                        description="Serve INDEX_DIR over HTTP (FastAPI on uvicorn; needs pip install "
                                    "'linearrag_torch[serve]'). Concurrent requests are batched into one engine call "
                                    "(up to --max-batch-size questions or --max-wait-ms). Routes: POST /v1/search, "
                                    "GET /health, /info, /metrics (Prometheus), POST /admin/reload, and the OpenAPI "
                                    "page at /docs. SIGTERM answers the requests in flight, then exits 0. With --ray: "
                                    "the same routes on Ray Serve, --replicas N (or --autoscale MIN,MAX) engine "
                                    "replicas, one per GPU where the cluster has GPUs (pip install "
                                    "'linearrag_torch[ray]'). Several INDEX_DIRs, a folder of index folders, --store "
                                    "or --keys-file: a store, each index under its folder's name at "
                                    "/v1/indexes/NAME/search, passages added and deleted over HTTP, the admin API, "
                                    "keys by index and role, MCP at /mcp/ (docs/serving.md, 'The server as a "
                                    "store').")
    sv.add_argument("index_dir", metavar="INDEX_DIR", nargs="+",
                    help="an index folder, or a folder of index folders (a store's folder: created indexes go there)")
    add_flags(sv.add_argument_group("server settings"), ServeSettings)
    add_flags(sv.add_argument_group("Ray Serve (--ray)", "replicas of the engine on a Ray cluster"), RaySettings)
    add_llm_flags(sv)  # optional: POST /v1/answer needs a chat model


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


def is_store(args) -> bool:
    """Whether `serve` runs a store: several paths, a path that is a folder of index folders, --store, --keys-file."""
    from pathlib import Path

    paths = args.index_dir
    return len(paths) > 1 or not (Path(paths[0]) / "index.json").is_file() or bool(args.store) or \
        bool(args.keys_file)


def run(args) -> int:
    try:
        from ..serve.app import serve  # deferred: the 'serve' extra (fastapi, uvicorn)
    except ImportError as exc:
        raise ValueError(f"serving needs the 'serve' extra: pip install 'linearrag_torch[serve]' ({exc})") from None
    ray_settings = settings_from_args(RaySettings, args)
    if not ray_settings.ray and ray_settings != RaySettings():  # before the folders: a flag error names the flag
        raise ValueError("the Ray Serve settings (--replicas, --autoscale, ...) need --ray")
    if is_store(args):
        if ray_settings.ray:
            raise ValueError("--ray serves one index folder; a store (several folders, --store, --keys-file) runs "
                             "in this process")
        from ..serve.store import discover
        from ..serve.store_app import serve_store

        require_encoder_backend(getattr(args, "encoder_backend", "torch"))
        skipped: list = []  # the subfolders that are not indexes: the store logs them when it starts
        found, _ = discover(args.index_dir, skipped)  # a clear error now for a path that is neither
        if not found and not args.store:  # (an empty store, for POST /v1/indexes, needs --store)
            if len(args.index_dir) == 1 and not skipped:
                open_index_dir(args.index_dir[0])  # the single-index server's error, naming what is missing
            left = "".join(f"; {folder}: {why}" for folder, why in skipped[:3])
            raise ValueError(f"no index folder in {' '.join(args.index_dir)} (an empty store: add --store){left}")
        _check_port(args.host, args.port)
        return serve_store(args.index_dir, settings_from_args(ServeSettings, args), _llm(args))
    args.index_dir = args.index_dir[0]
    open_index_dir(args.index_dir)  # a clear error now for a folder that holds no index
    require_encoder_backend(getattr(args, "encoder_backend", "torch"))
    if not (ray_settings.ray and ray_settings.ray_address):  # a remote cluster's nodes bind it, not this one
        _check_port(args.host, args.port)
    llm = _llm(args)
    if ray_settings.ray:
        try:
            from ray import serve as _  # noqa: F401
        except ImportError as exc:
            raise ValueError(f"--ray needs the 'ray' extra: pip install 'linearrag_torch[ray]' ({exc})") from None
        import functools

        # the ingress replica makes its own LLM from the same flags (an LLM object holds locks and a cache)
        llm_factory = functools.partial(llm_from_args, args) if llm is not None else None
        return serve_ray(os.path.abspath(args.index_dir), settings_from_args(ServeSettings, args), ray_settings,
                         llm_factory)
    return serve(args.index_dir, settings_from_args(ServeSettings, args), llm)


def _llm(args):
    """The chat model of POST /v1/answer from the flags, or None."""
    if args.llm_base_url or args.llm_model or env.LLM_BASE_URL.get():
        try:
            return llm_from_args(args)
        except LLMError as exc:  # no model, say: status 2
            raise ValueError(str(exc)) from None
    return None
