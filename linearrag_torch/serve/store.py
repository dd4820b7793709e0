"""The server as a store: many indexes in one process, each under its folder's name, the models loaded once.

A ``Store`` holds named indexes (``IndexHost``, one per index folder), one engine thread and one dynamic batcher
(serve/batcher.py) for all of them. A batch holds the questions of one index only (the batch key starts with the
index's name), and while several indexes have questions waiting the batcher starts from the index that has had
the fewest engine seconds lately (``Batcher(group=...)``): a busy index cannot starve a quiet one; and while a
quieter index is active, the busy index's batches are bounded in time to about the quieter one's (serve/batcher.py),
so the quiet index's questions wait behind one short batch, not a full one. Each index has
its own HTTP front (serve/front.py: validation, admission by count and by work, its metrics), so an index under
overload is refused on its own admission while the others keep theirs. The encoder, spaCy and the reranker are
loaded once: every index loaded after the first takes the first's models where it uses the same ones
(``LinearRAG.share_models_from``); so are the NER worker processes (--ner-processes), which are the store's: kept
while any loaded index uses them, stopped with the last one (``release_ner_pool``) or the server.

Writes (``add``, ``delete``) go through the same path as `linearrag add` / `delete`: under the folder's write lock
(index/lock.py; a writer in another process gets 409), the incremental update computed on the engine thread
(between two batches; its seconds counted to the index's share), the new files written atomically with their
checksums and fsynced (index/storage.py) on a thread beside it, then the new index swapped in on the engine thread
between two batches: a search sees the index before or after a write, never a mix, and a write is on disk before
its answer. Writes to one index are serialised (an asyncio lock), and each one holds a heavy place of the index's
admission.

The HTTP routes are serve/store_app.py's; the MCP tools serve/mcp_tools.py's.
"""
from __future__ import annotations

import asyncio
import logging
import re
import shutil
import time
from pathlib import Path

from .admission import HEAVY_COST
from .batcher import Batcher
from .engine_host import LocalEngineHost, ReloadRefused, index_fingerprint
from .front import HTTPError, HTTPFront, Overloaded
from .host import Lifespan, cancel_tasks
from .keys import Keys, Principal
from .metrics import Metrics
from .settings import ServeSettings

log = logging.getLogger("linearrag.serve")

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
WRITE_UNITS_PER_PASSAGE = 2.0  # a write's work units: a heavy request's, and this per passage beyond (NER, encoder)
UNLOAD_DRAIN_S = 30.0  # an unload waits at most this long for the index's requests in flight


def write_cost(n: int) -> float:
    """Work units of a write of ``n`` passages (or ids): always heavy (serve/admission.py)."""
    return HEAVY_COST + 1 + WRITE_UNITS_PER_PASSAGE * n


def is_index_dir(path: Path) -> bool:
    return (path / "index.json").is_file()


def not_an_index(folder: Path) -> str:
    """Why ``folder``, a subfolder of a store's folder, is not served (it has no index.json)."""
    why = "not an index folder (no index.json)"
    try:
        inner = sorted(p.name for p in folder.iterdir() if p.is_dir() and is_index_dir(p))
    except OSError as exc:
        return f"{why}; cannot list it: {exc.strerror or exc}"
    if inner:  # ROOT/a/b/index.json: only ROOT's own subfolders are served
        shown = ", ".join(inner[:3]) + (f" and {len(inner) - 3} more" if len(inner) > 3 else "")
        why += f"; it holds index folders ({shown}): pass {folder} itself to serve them"
    return why


def discover(paths, skipped: list | None = None) -> tuple[dict, Path | None]:
    """({name: folder} of the indexes in ``paths``, the store's root or None). Each path is an index folder (served
    under its folder's name) or a folder of index folders (each served under its own name; with one such path it
    is the root, where created indexes go). ValueError for a path that is neither, a bad or repeated name.
    ``skipped``: a list to which each subfolder of a folder of index folders that is not an index is appended, as
    (folder, why) (the store logs them: a folder left out silently looks like a lost index)."""
    found, roots = {}, []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            raise ValueError(f"{path}: not a folder")
        if is_index_dir(path):
            folders = [path]
        else:
            subfolders = sorted(p for p in path.iterdir() if p.is_dir())
            folders = [p for p in subfolders if is_index_dir(p)]
            if skipped is not None:
                skipped += [(p, not_an_index(p)) for p in subfolders if not is_index_dir(p)]
            roots.append(path)
        for folder in folders:
            name = folder.resolve().name
            if not NAME_RE.match(name):
                raise ValueError(f"{folder}: an index's name is its folder's name, which must be letters, digits, "
                                 "'_', '.' or '-' (at most 64, not starting with a punctuation mark)")
            if name in found:
                raise ValueError(f"two indexes named {name!r}: {found[name]} and {folder}")
            found[name] = folder
    return found, roots[0] if len(roots) == 1 else None


class IndexHost(LocalEngineHost):
    """One index of a store: an EngineHost (serve/host.py) whose searches go to the store's shared batcher with the
    index's name in their key, with its own HTTP front (``front``) and metrics. ``status``: "loading", "ready",
    "failed", "unloaded"."""

    def __init__(self, store: "Store", name: str, index_dir: Path):
        super().__init__(index_dir, store.settings, batcher=lambda run: store.batcher)
        self.store, self.name = store, name
        self.status = "unloaded"
        self.write_lock = asyncio.Lock()
        self._reload_lock = asyncio.Lock()
        self.front = HTTPFront(self, llm=store.llm)

    async def hits(self, key: tuple, items: list) -> list:
        if self.rag.index.num_passages == 0:  # a new, empty index: nothing to find
            return [[] for _ in items]
        return await self.batcher.submit((self.name, key), items)

    async def explain(self, key: tuple, questions: list, top_k: int) -> list:
        if self.rag.index.num_passages == 0:
            return [{"question": q, "hits": []} for q in questions]
        return await self.batcher.call_for((self.name,), self._explain, key, questions, top_k)

    async def start(self) -> None:  # the store starts and stops the shared pieces
        pass

    async def stop(self) -> None:
        pass

    def _warm(self, rag) -> None:
        if rag.index.num_passages:
            super()._warm(rag)

    def _swap(self, rag) -> None:
        """A reload's swap (LocalEngineHost._swap), except that NER worker processes the new index does not use are
        the store's to stop: other indexes may use them."""
        old_pool = self.rag.ner_pool if self.rag is not None else None
        if old_pool is not None and old_pool is not rag.ner_pool:
            self.rag.models.detach_ner_pool()
        super()._swap(rag)
        if old_pool is not None and old_pool is not rag.ner_pool:
            self.store.release_ner_pool(old_pool)

    def _swap_index(self, index) -> None:
        """Engine thread, between two batches: serve ``index`` (the device graph made here, not in the next
        batch)."""
        self.rag.replace_index(index)
        self._pairs = {}
        if index.num_passages:
            self.rag.graph  # noqa: B018

    def describe(self) -> dict:
        return {"name": self.name, "status": self.status, **super().describe()}

    def summary(self) -> dict:
        """What GET /v1/indexes lists of it."""
        counts = self.rag.index.summary() if self.ready and self.rag is not None else None
        return {"name": self.name, "status": self.status, "counts": counts, "fingerprint": self.fingerprint,
                "error": self.load_error}


class Store(Lifespan):
    """Named indexes served in one process (see the module's docstring). ``paths``: index folders or folders of
    index folders (``discover``); ``root``: where created indexes go (default: the one folder of index folders
    given, if any). ``keys``: the API keys (serve/keys.py; default: --keys-file, else --api-key, else open).
    ``models``: a loaded LinearRAG whose models the indexes share (an application that has them already; default:
    the first index loaded brings them)."""

    def __init__(self, paths=(), settings: ServeSettings | None = None, llm=None, root=None, keys: Keys | None = None,
                 models=None):
        self.settings = s = settings or ServeSettings()
        self.llm = llm
        self.skipped: list = []  # (folder, why): the subfolders of a store's folder that are not indexes
        found, default_root = discover(paths, self.skipped)
        for folder, why in self.skipped:
            log.warning("not serving %s: %s", folder, why)
        self.root = Path(root) if root is not None else default_root
        if len(found) > s.max_indexes:
            raise ValueError(f"{len(found)} indexes, more than --max-indexes {s.max_indexes}")
        if keys is None:
            keys = Keys.load(s.keys_file, s.api_key) if s.keys_file else Keys(api_key=s.api_key)
        self.keys = keys
        self.metrics = Metrics()  # the server's own (connections); each index has its own beside it
        self.batcher = Batcher(self._run_batch, s.max_batch_size, s.max_wait_ms, on_batch=self._on_batch,
                               gather_ms=s.gather_ms, cost=self._cost, heavy_share=s.heavy_share,
                               heavy_cost=HEAVY_COST, group=lambda key: key[0])
        self.hosts: dict[str, IndexHost] = {name: IndexHost(self, name, folder) for name, folder in found.items()}
        self.on_fatal = None  # (the CLI's hook: a store keeps serving the indexes that loaded)
        self._tasks: list[asyncio.Task] = []
        self._admin_lock: asyncio.Lock | None = None
        self.models = models

    # ------------------------------------------------------------------ the shared batcher
    def _run_batch(self, key, questions):
        host = self.hosts.get(key[0])
        if host is None or host.rag is None:
            raise RuntimeError(f"index {key[0]!r} was unloaded")
        return host._run_batch(key[1], questions)

    def _cost(self, key, item) -> float:
        host = self.hosts.get(key[0])
        return host.question_cost(key[1], item) if host is not None else 1.0

    def _on_batch(self, stats) -> None:
        host = self.hosts.get(stats.key[0]) if stats.key else None
        if host is not None:
            host.metrics.on_batch(stats)  # its front's admission learns its pace from it

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._admin_lock = asyncio.Lock()
        if self.settings.threads is not None:
            from ..runtime.threads import set_threads

            set_threads(self.settings.threads)
        self.batcher.start()
        self._tasks.append(asyncio.get_running_loop().create_task(self._load_all(), name="linearrag-store-load"))

    async def stop(self) -> None:
        await cancel_tasks(self._tasks)
        await self.batcher.stop()
        pools = {id(h.rag.ner_pool): h.rag.ner_pool for h in self.hosts.values()
                 if h.rag is not None and h.rag.ner_pool is not None}
        for pool in pools.values():  # the NER worker processes the indexes started (not the application's)
            if not self._application_pool(pool):
                pool.close()

    def _application_pool(self, pool) -> bool:
        """Whether ``pool`` is the NER worker processes of the models the application gave (``models``): its own."""
        return self.models is not None and getattr(self.models, "ner_pool", None) is pool

    def release_ner_pool(self, pool) -> None:
        """NER worker processes an index no longer uses: stopped unless another loaded index uses them (they are
        shared by every index of the same spaCy model: the store's, not the index's that started them) or they are
        the application's."""
        if pool is None or self._application_pool(pool):
            return
        if any(h.rag is not None and h.rag.ner_pool is pool for h in self.hosts.values()):
            return
        pool.close()

    async def _load_all(self) -> None:
        """Load the indexes one after the other (on the engine thread: the first load's torch threads are the
        engine's, see LocalEngineHost._load_beside), each after the first sharing its models."""
        for host in list(self.hosts.values()):
            await self._load(host)
        if self.hosts and all(h.status == "failed" for h in self.hosts.values()) and self.on_fatal is not None:
            self.on_fatal(RuntimeError("; ".join(f"{h.name}: {h.load_error}" for h in self.hosts.values())))

    def models_source(self, skip=None):
        """A loaded LinearRAG whose models a new index may share (None: none yet)."""
        return next((h.rag for h in self.hosts.values() if h is not skip and h.rag is not None and h.ready),
                    self.models)

    async def _load(self, host: IndexHost) -> None:
        host.status, host.load_error, host.ready = "loading", None, False
        try:
            like = self.models_source(skip=host)
            host.rag, host.fingerprint = await host._fingerprinted(self.batcher.call_for((host.name,), host._load_rag,
                                                                                        like))
            await self.batcher.call_for((host.name,), host._warm, host.rag)
            host.loaded_at, host.ready, host.status = time.time(), True, "ready"
            log.info("serving %s as %r: %s", host.index_dir, host.name, host.rag.index.summary())
        except Exception as exc:  # noqa: BLE001 (the index is listed as failed; the others serve)
            host.rag = None
            host.status, host.load_error = "failed", f"{type(exc).__name__}: {exc}"
            log.error("cannot serve %s: %s", host.index_dir, host.load_error)

    # ------------------------------------------------------------------ lookup and keys
    def principal(self, authorization) -> Principal | None:
        return self.keys.resolve(authorization)

    def visible(self, principal: Principal) -> list[IndexHost]:
        return [h for name, h in sorted(self.hosts.items()) if principal.sees(name)]

    def host(self, principal: Principal | None, name: str, role: str = "read") -> IndexHost:
        """The index ``name`` for ``principal``: 401 without a key, 404 when it does not exist or is outside the key's
        scope (the same answer: names do not leak), 403 when the key's role is below ``role``."""
        if principal is None:
            raise unauthorized()
        host = self.hosts.get(name)
        if host is None or not principal.sees(name):
            raise HTTPError(404, f"no index named {name!r}", "no_index")
        if not principal.may(role):
            raise HTTPError(403, f"this key's role ({principal.role}) may not do this ({role} or above needed)",
                            "forbidden")
        return host

    @staticmethod
    def ready_front(host: IndexHost) -> HTTPFront:
        if host.status == "unloaded":
            raise HTTPError(409, f"index {host.name!r} is unloaded (POST /v1/indexes/{host.name}/load)", "unloaded")
        return host.front

    # ------------------------------------------------------------------ writes
    async def add(self, host: IndexHost, passages: list[dict]) -> dict:
        """Add ``passages`` (validated dicts: id, title, text) to the index, incrementally, and write it."""
        from ..corpus import InputError, read_passages

        def compute(rag):
            from ..indexing.build import add_passages

            try:
                new = read_passages(passages, first_id=rag.index.num_passages, existing_ids=rag.index.passage_ids)
            except InputError as exc:  # an id the index holds (given, or a missing id's default)
                raise _Invalid(["body", "passages"], str(exc)) from None
            index = add_passages(rag.index, new, progress=False, nlp=rag.nlp, encoder=rag.models.passage_encoder(),
                                 ids_checked=True)
            return _prepared(rag, index)

        return await self._write(host, len(passages), compute, "added")

    async def delete(self, host: IndexHost, ids: list) -> dict:
        """Delete the passages ``ids`` (each present: checked before) from the index, and write it."""
        def compute(rag):
            from ..indexing.build import delete_passages

            known = {str(p) for p in rag.index.passage_ids}
            for i, pid in enumerate(ids):
                if str(pid) not in known:
                    raise _Invalid(["body", "ids", i], f"no passage with id {pid!r} in the index")
            if len({str(p) for p in ids}) >= rag.index.num_passages:
                raise _Invalid(["body", "ids"], "deleting these passages would leave the index empty (drop the "
                                                "index instead)")
            return _prepared(rag, delete_passages(rag.index, ids))

        return await self._write(host, len(ids), compute, "deleted")

    async def _write(self, host: IndexHost, n: int, compute, verb: str) -> dict:
        """One write: a heavy place in the index's admission, its write lock, the folder's lock, the update on the
        engine thread, the atomic write beside it, the swap between two batches."""
        from ..index import IndexLockedError, index_lock
        from ..index import storage

        front = self.ready_front(host)
        place = front.admit(self.settings.timeout)  # 503 while loading, 429 past the places
        cost = write_cost(n)
        ticket = None
        try:
            refused = front.admission.refusal(place.deadline, cost, admitted=True, cost=cost)
            if refused is not None:
                raise Overloaded(*refused)
            ticket = front.admission.take(cost)
            async with host.write_lock:
                t0 = time.perf_counter()
                lock = index_lock(host.index_dir)
                try:
                    await asyncio.to_thread(lock.__enter__)
                except IndexLockedError as exc:
                    raise HTTPError(409, f"{exc}: try again when it is done", "locked") from None
                try:
                    if host.fingerprint is None or index_fingerprint(host.index_dir) != host.fingerprint:
                        raise HTTPError(409, f"index {host.name!r} was changed on disk by another writer; POST "
                                             f"/admin/reload (or /v1/indexes/{host.name}/load) first", "changed")
                    before = host.rag.index.summary()
                    try:
                        index, files = await self.batcher.call_for((host.name,), compute, host.rag)
                    except _Invalid as exc:  # ids that conflict with the index: 409, as the schema cannot say it
                        raise HTTPError(409, [{"type": "id_conflict", "loc": exc.loc, "msg": exc.msg}],
                                        "invalid") from None
                    await asyncio.to_thread(storage.write, host.index_dir, *files)  # fsynced before the commit
                    fingerprint = index_fingerprint(host.index_dir)
                    await self.batcher.call_for((host.name,), host._swap_index, index)
                    host.fingerprint = fingerprint
                finally:
                    await asyncio.to_thread(lock.__exit__, None, None, None)
                after = index.summary()
                log.info("%s %d passages %s %r in %.2f s: now %s", verb, n, "to" if verb == "added" else "from",
                         host.name, time.perf_counter() - t0, after)
                return {"status": verb, "index": host.name, "passages": n, "counts": after,
                        "before": before, "fingerprint": fingerprint, "seconds": round(time.perf_counter() - t0, 3)}
        finally:
            if ticket is not None:
                front.admission.give_back(ticket)
            place.release()

    # ------------------------------------------------------------------ admin
    async def create(self, name: str) -> dict:
        """A new empty index ROOT/name (the models' settings of the indexes served, so that it shares them)."""
        from ..config import IndexConfig, RetrievalConfig
        from ..index import index_lock
        from ..indexing.build import empty_index
        from ..models.encoding import resolve_precision

        if self.root is None:
            raise HTTPError(409, "this server has no store folder to create indexes in: serve a folder of index "
                                 "folders (linearrag serve ROOT)", "no_root")
        async with self._admin_lock:
            if name in self.hosts or (self.root / name).exists():
                raise HTTPError(409, f"an index named {name!r} exists", "exists")
            if len(self.hosts) >= self.settings.max_indexes:
                raise HTTPError(409, f"this server holds --max-indexes {self.settings.max_indexes} indexes", "full")
            like = self.models_source()
            if like is not None:
                cfg, rcfg = like.index.index_config, like.index.retrieval_config
            else:
                cfg, rcfg = IndexConfig(), RetrievalConfig()
                import dataclasses

                from ..env import resolve_device

                device = str(resolve_device(self.settings.device))
                cfg = dataclasses.replace(cfg, encoder_precision=resolve_precision(cfg.encoder_precision, device))
            folder = self.root / name

            def make():
                folder.mkdir()
                index = empty_index(cfg, rcfg)
                with index_lock(folder):
                    index.save(folder)

            await asyncio.to_thread(make)
            host = self.hosts[name] = IndexHost(self, name, folder)
            await self._load(host)
            return host.summary()

    async def load(self, host: IndexHost) -> dict:
        """Load an unloaded (or failed) index again; a loaded one is reloaded from its folder."""
        async with self._admin_lock:
            if host.status == "ready":
                try:
                    await host.reload()
                except ReloadRefused as exc:
                    raise HTTPError(409, f"reload refused, still serving the previous index: {exc}", "refused") \
                        from None
            else:
                await self._load(host)
            if host.status != "ready":
                raise HTTPError(409, f"index {host.name!r} failed to load: {host.load_error}", "failed")
            return host.summary()

    async def unload(self, host: IndexHost) -> dict:
        """Stop serving the index and give its memory back (its folder stays; ``load`` serves it again)."""
        async with self._admin_lock:
            await self._unload(host)
            return host.summary()

    async def _unload(self, host: IndexHost) -> None:
        from ..retrieval.memory import release_freed_memory

        host.ready, host.status = False, "unloaded"  # new requests: 409 (admission: not ready)
        deadline = time.monotonic() + UNLOAD_DRAIN_S
        while host.front.in_flight and time.monotonic() < deadline:  # its requests in flight are answered first
            await asyncio.sleep(0.05)
        async with host.write_lock:
            rag, host.rag = host.rag, None
            pool = rag.models.detach_ner_pool() if rag is not None else None
            if pool is not None:  # stopped if no other index uses them (the store's, not this index's)
                await self.batcher.call(self.release_ner_pool, pool)
            del rag  # the last reference: its tensors go, and their memory back to the system
            await self.batcher.call(release_freed_memory)

    async def drop(self, host: IndexHost) -> dict:
        """Unload the index and delete its folder (only an index in the store's folder)."""
        from ..index import index_lock

        async with self._admin_lock:
            if self.root is None or host.index_dir.resolve().parent != self.root.resolve():
                raise HTTPError(409, f"index {host.name!r} was given on the command line, not made in the store's "
                                     "folder: unload it instead", "not_in_store")
            await self._unload(host)

            def remove():
                with index_lock(host.index_dir):
                    (host.index_dir / "index.json").unlink()  # no longer an index, whatever the rest does
                shutil.rmtree(host.index_dir)

            await asyncio.to_thread(remove)
            del self.hosts[host.name]
            return {"name": host.name, "status": "dropped"}

    # ------------------------------------------------------------------ read side
    async def explain(self, host: IndexHost, questions: list, top_k: int, key: tuple = ()) -> list:
        """LinearRAG.explain for ``questions`` on the engine thread, as JSON (IndexHost.explain)."""
        self.ready_front(host)._check_ready()
        return await host.explain(key, list(questions), top_k)

    def info(self, principal: Principal) -> dict:
        from .. import __version__

        return {"version": __version__, "indexes": {h.name: h.describe() for h in self.visible(principal)},
                "server": self.settings.public(), "queued_questions": self.batcher.queued}

    def exposition(self, principal: Principal) -> bytes:
        """/metrics: the server's metrics and those of the indexes ``principal`` sees, each sample of an index
        labelled index="NAME"."""
        parts = [({}, self.metrics.registry)] + [({"index": h.name}, h.metrics.registry)
                                                 for h in self.visible(principal)]
        return merged_exposition(parts)


class _Invalid(Exception):
    """A write's ids the index refuses (found on the engine thread): 409 naming ``loc``."""

    def __init__(self, loc: list, msg: str):
        super().__init__(msg)
        self.loc, self.msg = loc, msg


def _prepared(rag, index):
    """(index with rag's retrieval settings, checked, its files for storage.write), on the engine thread."""
    index.retrieval_config = rag.config
    index.validate()
    return index, index.to_files()



def unauthorized() -> HTTPError:
    return HTTPError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')", "unauthorized",
                     {"WWW-Authenticate": "Bearer"})


def merged_exposition(parts) -> bytes:
    """The Prometheus text of several registries as one: [(extra labels, registry)], the samples of one metric name
    under one family."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.metrics_core import Metric

    families: dict = {}
    for extra, registry in parts:
        for fam in registry.collect():
            merged = families.get(fam.name)
            if merged is None:
                merged = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            merged.samples.extend(s._replace(labels={**s.labels, **extra}) for s in fam.samples)

    class Fixed:
        def collect(self):
            return list(families.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed())
    return generate_latest(registry)


__all__ = ["IndexHost", "Store", "discover", "write_cost"]
