"""The Python API: build or load an index, then answer batches of questions.

    rag = LinearRAG.build("corpus.jsonl")          # or LinearRAG.load("my_index")
    rag.save("my_index")
    for hits in rag.search(["Who directed X?", "Where was Y born?"], top_k=5):
        print([(h.id, h.title, round(h.score, 4)) for h in hits])
"""
from __future__ import annotations

from . import models
from .config import ENCODER_BACKENDS, IndexConfig, RetrievalConfig
from .corpus import check_question, read_passages
from .env import resolve_device
from .index import TriGraphIndex
from .queries import EncodedQueries, Retrieved
from .results import Hit
from .retrieval import engine, scipy_backend
from .retrieval.explain import explanations

BACKENDS = ("torch", "scipy")
QUESTION_ENCODERS = (None, "bfloat16", "int8", "int8-all")  # LinearRAG(quantize=...)


class LinearRAG:
    """A Tri-Graph index on a device, with the spaCy and encoder models that made it."""

    def __init__(self, index: TriGraphIndex, device="auto", nlp=None, encoder=None, quantize: str | None = None,
                 encoder_backend: str = "torch"):
        """``quantize``: the question encoder. None: float32, exact, and a question's vector does not depend
        on the other questions of its batch beyond float noise (~1e-7), whatever precision the index was
        encoded in (IndexConfig.encoder_precision). "bfloat16": bf16 autocast, where the device has native
        bf16 (env.native_bf16; float32 elsewhere): ~2.4x faster on a CPU with AMX, but a vector then
        depends on its batch by up to ~1e-3 per component (the kernels change with the batch's shape), so
        near-tied passages may swap with the batch. "int8" or "int8-all" (dynamically quantised Linear
        layers, CPU only: faster, vectors within cosine ~0.99 / ~0.98 of the exact ones; see
        encoding.quantize_int8). ``encoder_backend``: "torch", or "onnx" (the float32 question encoder on ONNX
        Runtime, CPU only, extra [onnx]: the same vectors to float noise; its encoder stage measured 10.2
        against 13.5 ms for one question, 4.4 against 5.1 per question in a batch of 256; not with ``quantize``). ``encoder``, when given, is used as it is for questions."""
        self.device = resolve_device(device)
        if quantize not in QUESTION_ENCODERS:
            raise ValueError(f"quantize must be one of {QUESTION_ENCODERS}, got {quantize!r}")
        if quantize in ("int8", "int8-all") and self.device.type != "cpu":
            raise ValueError(f"quantize={quantize!r} runs on the CPU only, the device is {self.device}")
        if encoder_backend not in ENCODER_BACKENDS:
            raise ValueError(f"encoder_backend must be one of {ENCODER_BACKENDS}, got {encoder_backend!r}")
        if encoder_backend == "onnx" and (quantize is not None or self.device.type != "cpu"):
            raise ValueError(f"encoder_backend='onnx' runs float32 on the CPU (device {self.device}, "
                             f"quantize {quantize!r})")
        self.index = index
        self.config = index.retrieval_config
        self.quantize = quantize
        self.encoder_backend = encoder_backend
        self.reuse_index_vectors = True  # the default of encode_queries(reuse_index_vectors=...)
        self._nlp = nlp
        self._encoder = encoder
        self._ner_pool = None  # nlp.NERPool (start_ner_processes)
        self._graph = None
        self._pipeline = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, corpus, index_config: IndexConfig | None = None, config: RetrievalConfig | None = None,
              device="auto", progress: bool = True, nlp=None, encoder=None) -> "LinearRAG":
        """Index ``corpus``: a JSONL path, or a list of Passage / dicts with "text" (and "id", "title")."""
        from .indexing.build import build_index

        dev = resolve_device(device)
        passages = read_passages(corpus)  # ids checked here, before any model loads
        index_config = index_config or IndexConfig()
        # each model loaded once; questions in float32 (see __init__) with the passages' model, unless the
        # caller chose the encoder
        loaded = models.for_index(index_config, dev, nlp, encoder)
        # the index stays on the CPU, as load() keeps it (the engine copies what it needs to ``dev``), and
        # save() writes it from there
        index = build_index(passages, index_config, config or RetrievalConfig(), device=str(dev), progress=progress,
                            nlp=loaded.nlp, encoder=loaded.passage_encoder, ids_checked=True, index_device="cpu")
        return cls(index, dev, loaded.nlp, loaded.question_encoder)

    @classmethod
    def load(cls, path, device="auto", quantize: str | None = None, encoder_backend: str = "torch") -> "LinearRAG":
        """Load an index folder written by save(). ``quantize``, ``encoder_backend``: the question encoder (see
        __init__)."""
        return cls(TriGraphIndex.load(path, device="cpu"), device, quantize=quantize, encoder_backend=encoder_backend)

    def save(self, path):
        """Write the index atomically to folder ``path`` (config included), under the folder's write lock."""
        self.index.retrieval_config = self.config
        return self.index.save(path)

    # ------------------------------------------------------------------ updates
    def add(self, corpus, progress: bool = False) -> "LinearRAG":
        """Append passages (a JSONL path, or a list of Passage / dicts as for build) to the index in memory;
        call save() to write it. Only the new passages are analysed and encoded; the result equals
        the index built from all passages at once. A missing id defaults to the passage's position
        in the grown index. An id already in the index (or repeated) raises InputError naming it and
        its line; the index is then unchanged. Two passages with the same text stay two passages."""
        from .indexing.build import add_passages

        passages = read_passages(corpus, first_id=self.index.num_passages, existing_ids=self.index.passage_ids)
        self.replace_index(add_passages(self.index, passages, progress=progress, nlp=self.nlp,
                                     encoder=self._passage_encoder(), ids_checked=True))
        return self

    def delete(self, ids) -> "LinearRAG":
        """Remove the passages with these ids (an id or a list; 7 and "7" are the same id) and the sentences
        and entities no remaining passage has, in memory; call save() to write it. The result equals
        the index built without them (embeddings are kept, not recomputed). An unknown id raises
        ValueError naming it; the index is then unchanged."""
        from .indexing.build import delete_passages

        ids = [ids] if isinstance(ids, (int, str)) else list(ids)
        self.replace_index(delete_passages(self.index, ids))
        return self

    def replace_index(self, index: TriGraphIndex) -> None:
        """Serve ``index`` from now on (what ``add`` and ``delete`` do with the index they computed; the Ray
        build's ``add`` too), with this object's retrieval settings; the caches derived from the old one go."""
        index.retrieval_config = self.config
        self.index = index
        self._graph = None  # caches derived from the index
        self._pipeline = None

    # ------------------------------------------------------------------ models
    @property
    def nlp(self):
        if self._nlp is None:
            self._nlp = models.load_nlp(self.index.index_config)
        return self._nlp

    def start_ner_processes(self, processes: int, caller_part: bool = True):
        """Run the questions' spaCy NER in ``processes`` worker processes that stay up (nlp.NERPool: each loads
        the index's spaCy model, IndexConfig.spacy_model), beside this process (``caller_part``: it takes a part
        of each batch too). A batch of fewer than 16 questions still runs here alone. For machines with cores to
        spare while NER runs; the entities are those of this process's NER. 0 stops them. Returns the pool (or
        None). close() stops it too."""
        from .indexing.nlp import NERPool

        self.close()
        if processes > 0:
            self.nlp  # noqa: B018 (a model that cannot load fails here, with its name, not in a worker)
            self._ner_pool = NERPool(self.index.index_config.spacy_model, processes, caller_part=caller_part)
        return self._ner_pool

    @property
    def ner_pool(self):
        """The NER worker processes (nlp.NERPool) of start_ner_processes, or None."""
        return self._ner_pool

    def detach_ner_pool(self):
        """Forget the NER worker processes without stopping them (another index took them over: share_models_from);
        returns them (or None)."""
        pool, self._ner_pool = self._ner_pool, None
        return pool

    def share_models_from(self, other: "LinearRAG") -> "LinearRAG":
        """Use ``other``'s loaded models where this index needs the same ones, instead of loading them again: its
        question encoder (same encoder and max_length, same device, quantize and encoder backend), its spaCy
        pipeline (same spacy_model and dropped labels) and its NER worker processes (same spacy_model: they
        load the model by name; both indexes then hold them, see detach_ner_pool). A model ``other`` has not
        loaded yet is left to load on first use. Returns self.

            new = LinearRAG(TriGraphIndex.load(folder), device).share_models_from(old)
        """
        old, new = other.index.index_config, self.index.index_config
        same_question_encoder = ((old.encoder, old.max_length) == (new.encoder, new.max_length)
                                 and str(self.device) == str(other.device) and self.quantize == other.quantize
                                 and self.encoder_backend == other.encoder_backend)
        if same_question_encoder and other._encoder is not None:
            self._encoder = other._encoder
        if (old.spacy_model, tuple(old.dropped_labels)) == (new.spacy_model, tuple(new.dropped_labels)) \
                and other._nlp is not None:
            self._nlp = other._nlp
        if old.spacy_model == new.spacy_model and other._ner_pool is not None:
            self._ner_pool = other._ner_pool
        self._pipeline = None
        return self

    def close(self) -> None:
        """Stop the NER worker processes, if any (the rest needs no closing)."""
        pool, self._ner_pool = self._ner_pool, None
        if pool is not None:
            pool.close()

    @property
    def encoder(self):
        """The question encoder (``quantize`` in __init__)."""
        if self._encoder is None:
            self._encoder = models.load_question_encoder(self.index.index_config, self.device, self.quantize,
                                                  self.encoder_backend)
        return self._encoder

    def _passage_encoder(self):
        """What add() encodes new passages with: the question encoder's model in the precision the index was
        encoded in (the vectors a full build would make), loaded apart only where the question encoder is int8."""
        enc, want = self.encoder, self.index.index_config.encoder_precision
        torch_backend = getattr(enc, "backend", "torch") == "torch"
        if not isinstance(getattr(enc, "precision", None), str) or (
                enc.precision == want and enc.quantize is None and torch_backend):
            return enc  # a stand-in encoder, or the right one already
        if enc.quantize is None and torch_backend:
            return enc.with_precision(want)
        return models.load_encoder(self.index.index_config, self.device)

    @property
    def pipeline(self):
        """The question path (pipeline.QuestionPipeline): NER, lexicon, encoder stages."""
        from .retrieval.pipeline import QuestionPipeline

        p = self._pipeline
        if (p is None or p.index is not self.index or p.nlp is not self.nlp or p.encoder is not self.encoder
                or p.ner_pool is not self._ner_pool):
            p = self._pipeline = QuestionPipeline(self.index, self.nlp, self.encoder, self._ner_pool)
        return p

    @property
    def graph(self) -> engine.DeviceGraph:
        if self._graph is None:
            self._graph = engine.DeviceGraph(self.index, self.device)
        return self._graph

    # ------------------------------------------------------------------ querying
    def encode_queries(self, questions: list[str], config: RetrievalConfig | None = None, *,
                       reuse_index_vectors: bool | None = None, timings: dict | None = None) -> EncodedQueries:
        """Question entities (spaCy NER as config.question_ner says, plus lexicon matches when
        config.lexicon_seeds; lower-cased)
        and encoding: the input of both backends. An entity string with the tokens of an index entity
        takes its stored vector (``reuse_index_vectors=False`` encodes it again: equal up to ~1e-7;
        None: the attribute rag.reuse_index_vectors, True unless set).
        ``timings``: a dict to which the seconds of the stages "ner", "lexicon", "encoder" are added
        (linearrag_torch.retrieval.pipeline)."""
        for q in questions:
            check_question(q)
        cfg = config or self.config
        pipe = self.pipeline
        ents = pipe.entities(questions, cfg.lexicon_seeds, timings, cfg.question_ner)
        reuse = self.reuse_index_vectors if reuse_index_vectors is None else reuse_index_vectors
        enc = pipe.encode(questions, ents, reuse, timings)
        if cfg.rerank:  # the reranker's question tokens (host work of the question path, like NER)
            from .runtime.tracing import stage

            with stage(timings, "encoder"):
                enc.rerank_tokens = self.reranker(cfg).question_tokens(list(questions))
        return enc

    def reranker(self, config: RetrievalConfig | None = None):
        """The learned reranker (rerank.Reranker) that ``config`` (default: this index's settings) names,
        loaded once on this index's device. A missing or damaged folder raises RerankerLoadError naming it."""
        cfg = config or self.config
        return self.graph.reranker(cfg.reranker, cfg.reranker_precision)

    def retrieve(self, queries: EncodedQueries, config: RetrievalConfig | None = None, backend: str = "torch", *,
                 timings: dict | None = None) -> Retrieved:
        """Rank passages for encoded questions with the torch engine or the scipy reference: the stage list of
        the config (retrieval/stages.py). ``timings``: seconds added to timings["graph"], and with cfg.rerank to
        timings["rerank"]. With cfg.rerank the learned reranker runs on this index's device, whichever backend
        ranked the candidates."""
        cfg = config or self.config
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if backend == "torch":
            return engine.retrieve(self.graph, queries, cfg, timings=timings)

        def reranker(c):
            r = self.reranker(c)
            return r, self.graph.rerank_passages(r)

        return scipy_backend.retrieve(self.index, queries.to("cpu"), cfg, reranker=reranker, timings=timings)

    def search(self, questions, top_k: int | None = None, backend: str = "torch", *, timings: dict | None = None,
               **overrides) -> list[list[Hit]]:
        """Top-k passages for each question (a string or a list of strings), best first.

        ``overrides`` change retrieval settings for this call (e.g. mode="paper", delta=0.3).
        ``timings``: a dict to which the seconds of each stage are added (pipeline.STAGES).
        """
        single = isinstance(questions, str)
        qs = [questions] if single else list(questions)
        if not qs:
            return []
        cfg = self.config.replace(top_k=top_k, **overrides)
        out = self.retrieve(self.encode_queries(qs, cfg, timings=timings), cfg, backend, timings=timings)
        hits = self.hits(out)
        return hits[0] if single else hits

    def answer(self, questions, llm=None, top_k: int = 5, **overrides):
        """Answers from a chat model given each question's top-k passages (see generation.answer_batch):
        an Answer (answer, reply, passages, ...) per question, or one for a single string. ``llm``: a
        generation.LLM, a dict of its arguments, or None (LINEARRAG_LLM_* environment variables)."""
        from .answers.generation import answer_batch

        out = answer_batch(self, questions, llm, top_k, **overrides)
        return out[0] if isinstance(questions, str) else out

    def hits(self, out: Retrieved) -> list[list[Hit]]:
        idx, scores = out.indices.cpu().tolist(), out.scores.cpu().tolist()
        ix = self.index
        return [
            [Hit(ix.passage_ids[i], float(s), ix.titles[i], ix.texts[i], i) for i, s in zip(row, srow) if i >= 0]
            for row, srow in zip(idx, scores)
        ]

    def explain(self, questions: list[str], top_k: int | None = None, **overrides) -> list[dict]:
        """Hits plus how they were reached: question entities, seeds, the first round's activated entities
        (tier >= 2: reached by semantic bridging) found in each hit passage, the later rounds' chain seeds
        (chain.py) with their seed scores, the ranks before the pair rerank of the first two hits
        (pairs.py; None without it), with rerank each reranked hit's fused score, reranker logit and graph score
        and rank, and per hit the round that found it with its rank and score there ("found")."""
        if isinstance(questions, str):
            questions = [questions]
        cfg = self.config.replace(top_k=top_k, **overrides)
        enc = self.encode_queries(list(questions), cfg)
        out, tr = engine.retrieve(self.graph, enc, cfg, trace=True)
        C = self.index.C
        return explanations(list(questions), enc, self.hits(out), tr, self.index.entities,
                            lambda row: set(C.col[C.crow[row]:C.crow[row + 1]].tolist()),
                            lambda row: self.index.passage_ids[row])
