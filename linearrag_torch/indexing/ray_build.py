"""Indexing on a Ray cluster: `linearrag index CORPUS INDEX_DIR --ray [ADDRESS]` and `linearrag add INDEX_DIR FILE --ray`.

The build is build.add_passages() with its two heavy stages moved onto the cluster with Ray Data:

- NER: the passage texts go to the cluster in blocks of rows, each row one spaCy batch
  (IndexConfig.ner_batch_size passages, cut at the same offsets as the local nlp.pipe cuts them), and a
  ``map_batches`` pool of CPU actors (each loads spaCy once) returns one nlp.PassageAnalysis per passage;
- encoding: RayEncoder is an encoding.TextEncoder whose encode() forms on the driver exactly the forward
  passes the local Encoder.encode forms (same de-duplication, order and batch boundaries: the driver's
  Encoder runs encode() with its forward pass recorded instead of computed), ships each pass as one row
  to a ``map_batches`` pool of encoder actors (one GPU each where the cluster has GPUs, CPU otherwise)
  and puts the vectors back in place. Each actor computes the very batches the local build computes,
  so the vectors equal the local build's (a text's vector depends on its batch-mates in the last bits).

The driver reads and checks the corpus (the index holds every text anyway), numbers the nodes, makes
M, PS, C, N and writes the index exactly as a local build does (build.py; same format, same atomic
write). So the result equals the local build of the same corpus on the same kind of device.

Every node needs this package installed with its models (the same versions as the driver's: the
vectors depend on them). Ray is the optional extra ``ray``: pip install -e ".[ray]".
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import re
import socket
import sys
import time
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from tqdm.auto import tqdm

from .. import env
from ..runtime.words import count
from ..config import IndexConfig, RetrievalConfig
from ..corpus import read_passages

if TYPE_CHECKING:  # torch loads where the work starts: `linearrag --help` parses these flags without it
    import torch

RAY_INSTALL_HINT = 'the Ray build needs the "ray" extra: pip install -e ".[ray]" (or pip install "ray[data]")'
CONNECT_TIMEOUT_S = 5.0  # a TCP probe of ADDRESS before ray.init (which would otherwise retry for a minute)


class RayBuildError(ValueError):
    """Ray missing, a cluster that cannot be reached, or resources the cluster lacks (the CLI prints it)."""


@dataclass
class RayOptions:
    """Where and how the Ray build runs.

    ``address``: None = ray.init()'s default (the cluster in $RAY_ADDRESS or one started on this machine
    with `ray start`, else a new local one), "local" = a new local one, else "HOST:PORT" of the head's GCS
    (`ray start --head` prints it; default port 6379), "ray://HOST:10001" (Ray Client) or "auto".
    ``ner_actors``: spaCy actors, 1 CPU each (default: one per CPU of the cluster).
    ``encode_actors``: encoder actors (default: one per GPU when the cluster has GPUs, else one per
    ``encode_cpus`` CPUs). ``encode_cpus``: CPUs, and torch threads, of each encoder actor (None: 1 for
    GPU actors; for CPU actors this machine's cores, at most the largest node's CPUs: a forward pass
    of few rows gives other last bits with another thread count, ~2e-7 in float32 and ~6e-4 in
    bfloat16, so the vectors equal a local build's where the actors have the local build's threads).
    ``encode_gpus``: GPUs of each encoder actor (None: 1 when the cluster has GPUs, else 0: CPU actors).
    """

    address: Optional[str] = None
    ner_actors: Optional[int] = None
    encode_actors: Optional[int] = None
    encode_cpus: Optional[float] = None
    encode_gpus: Optional[float] = None


# ---------------------------------------------------------------------------------------------- Ray itself
def import_ray():
    """The ray module with Ray Data, or RayBuildError naming the extra to install."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise RayBuildError(f"{RAY_INSTALL_HINT} ({exc})") from None
    return ray


def _probe(address: str) -> None:
    """Open and close a TCP connection to HOST:PORT of ``address`` (RayBuildError naming it if that fails)."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        host, port = rest, "10001" if address.startswith("ray://") else "6379"
    host = host.strip("[]") or "127.0.0.1"
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise RayBuildError(
            f"cannot reach the Ray cluster at {address!r} ({host}:{port}: {exc.strerror or exc}); start it with "
            "`ray start --head` on the head node and give its address (HOST:6379, or ray://HOST:10001)"
        ) from None


def connect(address: Optional[str] = None, announce=None):
    """ray, connected: to the running Ray of this process if any, else as RayOptions.address says
    (RayBuildError naming ``address`` when nothing answers there). ``announce``: called with one line that
    says which cluster this process joined or started (cluster_line), when it does either."""
    ray = import_ray()
    if address not in (None, "", "auto", "local"):
        _probe(address)  # a given address must answer, also when this process runs Ray already
    if ray.is_initialized():
        return ray
    starts_local = starts_new_cluster(ray, address)
    try:
        init_quietly(ray, address or None, starts_local, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
        where = f"the Ray cluster at {address!r}" if address else "a Ray cluster"
        raise RayBuildError(f"cannot connect to {where}: {exc}") from None
    if announce is not None:
        announce(cluster_line(ray, starts_local))
    return ray


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def init_quietly(ray, address: Optional[str], starts_local: bool, **kwargs) -> None:
    """ray.init with only errors on the terminal (Ray's own loggers at ERROR: no notices such as the one that
    a new local cluster turned token authentication on); no dashboard for a new local cluster."""
    if starts_local:
        kwargs["include_dashboard"] = False
    ray.init(address=address, logging_level=logging.ERROR, **kwargs)


def cluster_line(ray, starts_local: bool) -> str:
    """One line for the terminal: which Ray cluster, and what it has."""
    cpus, gpus, _ = _resources(ray)
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    where = "a new local Ray cluster" if starts_local else "the Ray cluster at " + str(
        ray.get_runtime_context().gcs_address)
    return f"Ray: {where}, {count(nodes, 'node')}, {cpus:g} CPUs, {gpus:g} GPUs"


def starts_new_cluster(ray, address: Optional[str]) -> bool:
    """Whether ray.init(address) starts a new cluster on this machine rather than joining one."""
    return address == "local" or (address in (None, "") and not env.RAY_ADDRESS.get()
                                  and not _local_cluster_running(ray))


def _local_cluster_running(ray) -> bool:
    try:
        from ray._private.services import find_gcs_addresses  # not public; only to pick ray.init's arguments
        return bool(find_gcs_addresses())
    except Exception:  # noqa: BLE001 - any failure: assume none (ray.init decides)
        return False


def _quiet_ray_data(ray) -> None:
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False  # our own bar per stage instead
    for name in ("print_on_execution_start", "enable_auto_log_stats"):
        if hasattr(ctx, name):
            setattr(ctx, name, False)
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # "progress bars disabled" and the like


def _resources(ray) -> tuple[float, float, float]:
    """(CPUs of the cluster, GPUs of the cluster, CPUs of its largest node)."""
    total = ray.cluster_resources()
    largest = max((n.get("Resources", {}).get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")), default=0.0)
    return float(total.get("CPU", 0.0)), float(total.get("GPU", 0.0)), float(largest)


@dataclass
class _Plan:
    """The actor pools of one build, from RayOptions and the cluster's resources."""

    ner_actors: int
    encode_actors: int
    encode_cpus: float
    encode_gpus: float

    @property
    def device(self) -> str:
        return "cuda" if self.encode_gpus > 0 else "cpu"


def plan_actors(options: RayOptions, cpus: float, gpus: float, largest_node_cpus: float) -> _Plan:
    """Actor counts and resources (RayBuildError when the cluster cannot hold one actor)."""
    if cpus < 1:
        raise RayBuildError(f"the Ray cluster has {cpus:g} CPUs: it needs at least one for the spaCy actors")
    encode_gpus = options.encode_gpus if options.encode_gpus is not None else (1.0 if gpus >= 1 else 0.0)
    if encode_gpus > gpus:
        raise RayBuildError(f"each encoder actor asks for {encode_gpus:g} GPUs, the Ray cluster has {gpus:g}")
    encode_cpus = options.encode_cpus
    if encode_cpus is None:
        encode_cpus = 1.0 if encode_gpus > 0 else float(max(1, min(os.cpu_count() or 1, int(largest_node_cpus))))
    if encode_cpus > largest_node_cpus:
        raise RayBuildError(f"each encoder actor asks for {encode_cpus:g} CPUs, the largest node of the "
                            f"Ray cluster has {largest_node_cpus:g}")
    ner = options.ner_actors or max(1, int(cpus))
    if options.encode_actors:
        encode = options.encode_actors
    elif encode_gpus > 0:
        encode = max(1, int(gpus / encode_gpus))
    else:
        encode = max(1, int(cpus / encode_cpus))
    return _Plan(ner, encode, float(encode_cpus), float(encode_gpus))


def _run_pool(ray, rows: list, actor_cls, size: int, key: str, remote_args: dict, setup: dict, bar):
    """Rows through a map_batches pool of ``size`` actor_cls actors, one row per call; {row[key]: output row}.

    ``setup`` (what the actors load) travels as a JSON column of every row rather than as constructor
    arguments."""
    setup_json = json.dumps(setup)
    rows = [{**row, "setup": setup_json} for row in rows]
    ds = ray.data.from_items(rows, override_num_blocks=max(1, min(len(rows), 2 * size)))
    with warnings.catch_warnings():
        # max_restarts=0: an actor that dies fails the build with its error (the except below) instead of
        # Ray Data's default of endless restarts, which Ray itself warns (an "E" line on the terminal) cannot
        # work with these actors, whose constructor's arguments live in the object store. Ray 2.60 takes it
        # only among the ``ray_remote_args`` it calls deprecated (no named parameter yet): asked for where
        # map_batches still takes them, that one warning ignored.
        warnings.filterwarnings("ignore", message=".*ray_remote_args.* is deprecated")
        if any(p.kind is p.VAR_KEYWORD for p in inspect.signature(ds.map_batches).parameters.values()):
            remote_args = {**remote_args, "max_restarts": 0}
        ds = ds.map_batches(actor_cls, batch_size=1, batch_format="numpy",
                            compute=ray.data.ActorPoolStrategy(size=max(1, min(size, len(rows)))), **remote_args)
    out = {}
    try:
        for row in ds.iter_rows():
            out[int(row[key])] = row
            bar.update(int(row["count"]))
    except ray.exceptions.RayError as exc:  # an actor failed: a model missing on a node, say
        detail = _user_error(exc)
        raise RayBuildError(f"the {actor_cls.__name__.strip('_')} pool failed on the Ray cluster: {detail}") from None
    return out


def _user_error(exc: BaseException) -> str:
    """The line of Ray's error text (with its wrappers' causes) that names the error raised in our code,
    e.g. "...ModelLoadError: cannot load spaCy model 'x' ..."; else the text's first line."""
    texts, seen, e = [], set(), exc
    while isinstance(e, BaseException) and id(e) not in seen:
        seen.add(id(e))
        texts.append(str(e))
        e = getattr(e, "cause", None) or e.__cause__
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for text in texts for line in text.splitlines()]
    ours = [line for line in lines if re.match(r"^[\w.]*(Error|Exception): ", line)
            and not re.match(r"^(ray\.|UserCodeException|RayTaskError)", line)]
    return ours[-1] if ours else next((line for line in lines if line), type(exc).__name__)


# ---------------------------------------------------------------------------------------------- NER
class _Loaded:
    """An actor's models, loaded at its first row from the row's setup (and again only if that changes)."""

    def __init__(self):
        self.setup_json = None
        self.models = None

    def get(self, setup_json: str, load):
        if setup_json != self.setup_json:
            self.models, self.setup_json = load(json.loads(setup_json)), setup_json
        return self.models


class _NerActor:
    """A spaCy pipeline loaded once; each row is one spaCy batch of passage texts (JSON)."""

    def __init__(self):
        import torch

        torch.set_num_threads(1)
        self.loaded = _Loaded()

    @staticmethod
    def _load(setup: dict):
        from ..models.nlp import load_spacy  # deferred (and below): spaCy; this module stays torch-free

        cfg = IndexConfig.from_dict(setup["cfg"])
        return cfg, load_spacy(cfg.spacy_model)

    def __call__(self, batch: dict) -> dict:
        import numpy as np

        from ..models.nlp import analyse_passages

        out = []
        for texts_json, setup_json in zip(batch["texts"], batch["setup"]):
            cfg, nlp = self.loaded.get(setup_json, self._load)
            texts = json.loads(texts_json)
            analyses = analyse_passages(nlp, texts, cfg.dropped_labels, max(1, len(texts)), 1, False)
            out.append(json.dumps([list(a) for a in analyses], ensure_ascii=False))
        return {"chunk": batch["chunk"], "count": batch["count"], "analyses": np.array(out, dtype=object)}


def ray_analyse(ray, cfg: IndexConfig, ner_actors: int, progress: bool = True):
    """The NER stage of build.add_passages on the cluster: texts -> one nlp.PassageAnalysis per text.

    The texts are cut into spaCy batches of cfg.ner_batch_size at the offsets the local nlp.pipe cuts
    them (with one process or several), so every passage is tagged in the same batch as locally."""
    from ..models.nlp import PassageAnalysis  # deferred: imports spaCy and torch

    def analyse(texts: Sequence[str]) -> list:
        texts = list(texts)
        step = max(1, cfg.ner_batch_size)
        rows = [{"chunk": i, "count": len(texts[s:s + step]), "texts": json.dumps(texts[s:s + step], ensure_ascii=False)}
                for i, s in enumerate(range(0, len(texts), step))]
        if not rows:
            return []
        with tqdm(total=len(texts), desc="NER (ray)", unit="passage", disable=not progress) as bar:
            done = _run_pool(ray, rows, _NerActor, ner_actors, "chunk", {"num_cpus": 1}, {"cfg": cfg.to_dict()}, bar)
        return [PassageAnalysis(*a) for i in range(len(rows)) for a in json.loads(done[i]["analyses"])]

    return analyse


# ---------------------------------------------------------------------------------------------- encoding
class _EncodeActor:
    """The index's encoder loaded once (models.load_encoder, as the local build loads it); each row is one
    forward pass (JSON list of token id lists, Encoder.encode_pass), answered with its float32 vectors as bytes."""

    def __init__(self):
        self.loaded = _Loaded()

    @staticmethod
    def _load(setup: dict):
        import torch

        from .. import models  # deferred: imports torch

        if setup["device"] == "cpu":
            torch.set_num_threads(max(1, int(setup["threads"])))
        return models.load_encoder(IndexConfig.from_dict(setup["cfg"]), setup["device"])

    def __call__(self, batch: dict) -> dict:
        import numpy as np
        import torch

        out = []
        with torch.inference_mode():
            for tokens_json, setup_json in zip(batch["tokens"], batch["setup"]):
                encoder = self.loaded.get(setup_json, self._load)
                vectors = encoder.encode_pass([tuple(row) for row in json.loads(tokens_json)])
                out.append(vectors.float().cpu().numpy().astype(np.float32).tobytes())
        return {"batch": batch["batch"], "count": batch["count"], "vectors": np.array(out, dtype=object)}


def _with_precision(cfg: IndexConfig, precision: Optional[str]) -> IndexConfig:
    if precision is None or not hasattr(cfg, "encoder_precision"):
        return cfg
    return dataclasses.replace(cfg, encoder_precision=precision)


def _resolve_on_cluster(ray, cfg: IndexConfig, plan: _Plan) -> Optional[str]:
    """IndexConfig.encoder_precision resolved where the encoder actors run ("auto" depends on the device)."""
    precision = getattr(cfg, "encoder_precision", None)
    if precision is None:
        return None
    if precision != "auto":
        return precision

    def resolve(p, device):
        from linearrag_torch.models.encoding import resolve_precision  # deferred: imports torch; runs on the cluster

        return resolve_precision(p, device)

    task = ray.remote(resolve).options(num_cpus=min(plan.encode_cpus, 1.0) if plan.encode_gpus else plan.encode_cpus,
                                       num_gpus=plan.encode_gpus)
    return ray.get(task.remote(precision, plan.device))


class RayEncoder:
    """An encoding.TextEncoder whose forward passes run in a Ray Data actor pool.

    The driver holds the index's encoder on its CPU only to tokenize (token_keys) and to form the
    forward passes: it runs Encoder.encode with the forward pass recorded instead of computed, which
    keeps the local build's de-duplication, sort order and batch boundaries whatever they are."""

    def __init__(self, ray, cfg: IndexConfig, plan: _Plan, precision: Optional[str] = None, local=None):
        """``precision``: the resolved IndexConfig.encoder_precision of the actors; ``local``: the driver's
        encoder (default: loaded from ``cfg`` on the CPU)."""
        from .. import models  # deferred: imports torch

        self.ray = ray
        self.plan = plan
        self.cfg = _with_precision(cfg, precision)
        self.precision = precision
        self.local = local if local is not None else models.load_encoder(self.cfg, "cpu")

    @property
    def dim(self) -> int:
        return self.local.dim

    def token_keys(self, texts: Sequence[str]) -> list:
        return self.local.token_keys(texts)

    def forward_passes(self, texts: Sequence[str], keys=None) -> tuple[list, torch.Tensor]:
        """(the forward passes Encoder.encode(texts) makes, each a list of token id tuples; per text, its pass
        and its row in that pass as a [len(texts), 2] int64 tensor)."""
        import torch

        passes: list = []
        dim = self.local.dim

        def record(batch: list) -> torch.Tensor:
            where = torch.zeros(len(batch), dim, dtype=torch.float32)
            where[:, 0] = len(passes)
            where[:, 1] = torch.arange(len(batch), dtype=torch.float32)
            passes.append(list(batch))
            return where

        where = self.local.encode(list(texts), keys=keys, run_pass=record)  # the passes recorded, not run
        if texts and not passes:
            raise RuntimeError("Encoder.encode ran no pass through run_pass: ray_build.RayEncoder must "
                               "follow the change of encoding.Encoder")
        return passes, where[:, :2].round().to(torch.int64)

    def encode(self, texts: Sequence[str], progress: bool = False, desc: str = "", keys=None) -> torch.Tensor:
        import torch

        texts = list(texts)
        if not texts:
            return torch.zeros(0, self.dim, dtype=torch.float32)
        passes, where = self.forward_passes(texts, keys)
        rows = [{"batch": b, "count": len(p), "tokens": json.dumps(p)} for b, p in enumerate(passes)]
        plan = self.plan
        remote = {"num_cpus": plan.encode_cpus if plan.encode_gpus == 0 else min(plan.encode_cpus, 1.0),
                  "num_gpus": plan.encode_gpus}
        setup = {"cfg": self.cfg.to_dict(), "device": plan.device, "threads": max(1, int(plan.encode_cpus))}
        with tqdm(total=len(texts), desc=(desc or "encode") + " (ray)", unit="text", disable=not progress) as bar:
            done = _run_pool(self.ray, rows, _EncodeActor, plan.encode_actors, "batch", remote, setup, bar)
            bar.update(len(texts) - bar.n)  # texts that share another text's tokens
        import numpy as np

        return assemble([torch.from_numpy(np.frombuffer(done[b]["vectors"], dtype=np.float32).copy()).view(len(p), self.dim)
                         for b, p in enumerate(passes)], where)


def assemble(pass_vectors: Sequence[torch.Tensor], where: torch.Tensor) -> torch.Tensor:
    """The vectors of the texts from those of the forward passes (RayEncoder.forward_passes' ``where``)."""
    import torch

    start = torch.tensor([0] + [len(v) for v in pass_vectors[:-1]], dtype=torch.int64).cumsum(0)
    return torch.cat(list(pass_vectors))[start[where[:, 0]] + where[:, 1]]


# ---------------------------------------------------------------------------------------------- the builds
class _Session:
    """Ray connected, the actor plan made, Ray Data made quiet."""

    def __init__(self, options: Optional[RayOptions], progress: bool):
        self.options = options or RayOptions()
        self.ray = connect(self.options.address, announce=_stderr_line if progress else None)
        _quiet_ray_data(self.ray)
        self.plan = plan_actors(self.options, *_resources(self.ray))

    def encoder(self, cfg: IndexConfig) -> RayEncoder:
        return RayEncoder(self.ray, cfg, self.plan, _resolve_on_cluster(self.ray, cfg, self.plan))

    def analyse(self, cfg: IndexConfig, progress: bool):
        return ray_analyse(self.ray, cfg, self.plan.ner_actors, progress)


def build_index_on_ray(corpus, index_config: Optional[IndexConfig] = None, config: Optional[RetrievalConfig] = None,
                       options: Optional[RayOptions] = None, progress: bool = True, timings: Optional[dict] = None):
    """The TriGraphIndex of LinearRAG.build(corpus, ...), with NER and encoding on a Ray cluster (see the module's
    docstring); ``LinearRAG(index, device)`` answers questions on it.

    ``corpus``: a JSONL path or a list of Passage / dicts, as for LinearRAG.build; the index is assembled on the
    CPU. ``timings``: if given, receives the seconds of "connect" (Ray and the driver's tokenizer) and of
    build_index's stages."""
    from .build import build_index  # deferred: imports torch and spaCy

    passages = read_passages(corpus)
    index_config = index_config or IndexConfig()
    t0 = time.perf_counter()
    session = _Session(options, progress)
    encoder = session.encoder(index_config)
    if timings is not None:
        timings["connect"] = time.perf_counter() - t0
    index = build_index(passages, index_config, config or RetrievalConfig(), device="cpu", progress=progress,
                        encoder=encoder, analyse=session.analyse(index_config, progress), timings=timings,
                        ids_checked=True)
    return index


def add(rag, corpus, options: Optional[RayOptions] = None, progress: bool = True, timings: Optional[dict] = None):
    """rag.add(corpus) with NER and encoding on a Ray cluster; returns ``rag`` (call rag.save() to write).
    ``timings``: as for build_index_on_ray()."""
    from .build import add_passages  # deferred: imports torch and spaCy

    passages = read_passages(corpus, first_id=rag.index.num_passages, existing_ids=rag.index.passage_ids)
    cfg = rag.index.index_config
    t0 = time.perf_counter()
    session = _Session(options, progress)
    encoder = RayEncoder(session.ray, cfg, session.plan, getattr(cfg, "encoder_precision", None))
    if timings is not None:
        timings["connect"] = time.perf_counter() - t0
    rag.replace_index(add_passages(rag.index, passages, progress=progress, encoder=encoder,
                                analyse=session.analyse(cfg, progress), timings=timings, ids_checked=True))
    return rag
