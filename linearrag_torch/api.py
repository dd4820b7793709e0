"""The Python API: build or load an index, then answer batches of questions.

    rag = LinearRAG.build("corpus.jsonl")          # or LinearRAG.load("my_index")
    rag.save("my_index")
    for hits in rag.search(["Who directed X?", "Where was Y born?"], top_k=5):
        print([(h.id, h.title, round(h.score, 4)) for h in hits])
"""
from __future__ import annotations

from . import models
from .answers.generation import answer_batch
from .config import IndexConfig, RetrievalConfig
from .corpus import Hit, read_passages
from .env import resolve_device
from .index import TriGraphIndex
from .models.holder import QuestionModels
from .queries import EncodedQueries, Retrieved
from .retrieval import engine, scipy_backend
from .retrieval.explain import Paths, explanations
from .retrieval.pipeline import QuestionPipeline
from .runtime.tracing import stage

BACKENDS = ("torch", "scipy")


class LinearRAG:
    """A Tri-Graph index on a device, with the spaCy and encoder models that made it.

    Make one with ``build`` (from a corpus) or ``load`` (from a folder written by ``save``), then rank passages
    for batches of questions with ``search``: one call answers the whole batch, on the device. The models load
    on first use (``rag.models``: models.holder.QuestionModels). Guide: docs/python-api.md; settings:
    ``RetrievalConfig`` (``rag.config``, per-call overrides).

    Parameters
    ----------
    index : TriGraphIndex
        The index; it stays on the CPU, the engine copies what it needs to ``device``.
    device : str or torch.device, default "auto"
        Where questions are ranked: "auto" (CUDA when torch sees it, else the CPU), "cpu", "cuda", "cuda:1", ...
    nlp : spacy.language.Language, optional
        The spaCy pipeline for the questions' entities (default: the index's ``IndexConfig.spacy_model``,
        loaded on first use).
    encoder : optional
        The question encoder, used as it is (default: the index's ``IndexConfig.encoder`` as ``quantize`` and
        ``encoder_backend`` say, loaded on first use).
    quantize : {None, "bfloat16", "int8", "int8-all"}, default None
        The question encoder's arithmetic. None: float32, a vector independent of its batch up to float noise.
        "bfloat16": bf16 autocast where the device has native bf16 (float32 elsewhere, with a warning); a
        vector then depends on its batch, so near-tied passages may swap. "int8", "int8-all": dynamically
        quantised Linear layers, CPU only. Speed and accuracy: docs/tuning.md, "Encoder precision".
    encoder_backend : {"torch", "onnx"}, default "torch"
        "onnx": the float32 question encoder on ONNX Runtime (CPU only, extra ``[onnx]``, not with ``quantize``).

    Raises
    ------
    ValueError
        An unknown ``quantize`` or ``encoder_backend``, or one the device cannot run.

    Examples
    --------
    The examples of the methods continue this one (``rag``, ``passages``).

    >>> from linearrag_torch import LinearRAG
    >>> passages = [
    ...     {"id": "p1", "title": "Blue River", "text": "Blue River is a 1952 film directed by Anna Berg."},
    ...     {"id": "p2", "title": "Anna Berg",
    ...      "text": "Anna Berg was a Swedish director. She was the daughter of Karl Berg."},
    ...     {"id": "p3", "title": "Karl Berg", "text": "Karl Berg was a painter born in Uppsala."},
    ... ]
    >>> rag = LinearRAG.build(passages, device="cpu", progress=False)
    >>> [hit.id for hit in rag.search("Who directed Blue River?", top_k=2)]
    ['p1', 'p2']
    """

    def __init__(self, index: TriGraphIndex, device="auto", nlp=None, encoder=None, quantize: str | None = None,
                 encoder_backend: str = "torch"):
        self.device = resolve_device(device)
        self.index = index
        self.config = index.retrieval_config
        self.models = QuestionModels(index.index_config, self.device, quantize, encoder_backend, nlp, encoder)
        self.reuse_index_vectors = True  # the default of encode_queries(reuse_index_vectors=...)
        self._graph = None
        self._pipeline = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(cls, corpus, index_config: IndexConfig | None = None, config: RetrievalConfig | None = None,
              device="auto", progress: bool = True, nlp=None, encoder=None, timings: dict | None = None) -> "LinearRAG":
        """Index ``corpus``: spaCy NER and the encoder over every passage, then the graph.

        Parameters
        ----------
        corpus : str, os.PathLike or list
            A JSONL file (one object per line with "text", optional "id" and "title"), or a list of
            ``Passage`` or of such dicts. A missing id is the passage's position; a repeated id raises
            ``InputError`` naming it and its line, before any model loads.
        index_config : IndexConfig, optional
            How to build (models, encoder precision, storage dtype); stored with the index. Default IndexConfig().
        config : RetrievalConfig, optional
            The retrieval settings stored with the index (``rag.config``). Default ``RetrievalConfig()``.
        device : str or torch.device, default "auto"
            Where the models run and questions are ranked ("auto": CUDA when present, else the CPU).
        progress : bool, default True
            Show progress bars on stderr.
        nlp : spacy.language.Language, optional
            A loaded spaCy pipeline to use instead of ``index_config.spacy_model``.
        encoder : optional
            A loaded encoder to use, as it is, for the passages and the questions.
        timings : dict, optional
            Receives each stage's seconds: "load_models", then build_index's ("ner", "graph", "embed_passages", ...).

        Returns
        -------
        LinearRAG
            The new index on ``device``, in memory: ``save`` writes it.

        Examples
        --------
        >>> LinearRAG.build(passages, device="cpu", progress=False).index.num_passages
        3

        The bundled 2WikiMultiHopQA sample (300 passages: a minute or two on two CPU cores):

        >>> from linearrag_torch.data import sample_corpus_path
        >>> sample = LinearRAG.build(sample_corpus_path(), device="cpu")  # doctest: +SKIP
        """
        from .indexing.build import build_index  # deferred (as add, delete): imports spaCy (~1.4 s); search does not

        dev = resolve_device(device)
        passages = read_passages(corpus)  # ids checked here, before any model loads
        index_config = index_config or IndexConfig()
        # each model loaded once; questions in float32 (see __init__) with the passages' model, unless the
        # caller chose the encoder
        with stage(timings, "load_models"):
            loaded = models.for_index(index_config, dev, nlp, encoder)
        # the index stays on the CPU, as load() keeps it (the engine copies what it needs to ``dev``), and
        # save() writes it from there
        index = build_index(passages, index_config, config or RetrievalConfig(), device=str(dev), progress=progress,
                            nlp=loaded.nlp, encoder=loaded.passage_encoder, ids_checked=True, index_device="cpu",
                            timings=timings)
        return cls(index, dev, loaded.nlp, loaded.question_encoder)

    @classmethod
    def load(cls, path, device="auto", quantize: str | None = None, encoder_backend: str = "torch") -> "LinearRAG":
        """Load an index folder written by ``save`` (any index loads on any device).

        Parameters
        ----------
        path : str or os.PathLike
            The index folder. A damaged or incompatible one raises ``IndexFormatError`` naming the file.
        device : str or torch.device, default "auto"
            Where questions are ranked ("auto": CUDA when present, else the CPU).
        quantize : {None, "bfloat16", "int8", "int8-all"}, default None
            The question encoder's arithmetic (see the class's parameters).
        encoder_backend : {"torch", "onnx"}, default "torch"
            Where the question encoder runs (see the class's parameters).

        Returns
        -------
        LinearRAG
            The index with its stored retrieval settings; the models load on first use.

        Examples
        --------
        >>> import os, tempfile
        >>> folder = rag.save(os.path.join(tempfile.mkdtemp(), "index"))
        >>> LinearRAG.load(folder, device="cpu").index.num_passages
        3
        """
        return cls(TriGraphIndex.load(path, device="cpu"), device, quantize=quantize, encoder_backend=encoder_backend)

    def save(self, path):
        """Write the index, with its retrieval settings, atomically to a folder (safetensors + JSON).

        Parameters
        ----------
        path : str or os.PathLike
            The folder, created if needed; written under its write lock (``IndexLockedError`` while another
            process writes it).

        Returns
        -------
        pathlib.Path
            The folder.

        Examples
        --------
        >>> import os, tempfile
        >>> folder = rag.save(os.path.join(tempfile.mkdtemp(), "index"))
        >>> (folder / "index.json").is_file()
        True
        """
        self.index.retrieval_config = self.config
        return self.index.save(path)

    # ------------------------------------------------------------------ updates
    def add(self, corpus, progress: bool = False) -> "LinearRAG":
        """Append passages to the index in memory; ``save`` writes it.

        Only the new passages are analysed and encoded; the result equals the index built from all passages at
        once. Two passages with the same text stay two passages.

        Parameters
        ----------
        corpus : str, os.PathLike or list
            A JSONL path, or a list of ``Passage`` or dicts, as for ``build``. A missing id defaults to the
            passage's position in the grown index. An id already in the index (or repeated) raises
            ``InputError`` naming it and its line; the index is then unchanged.
        progress : bool, default False
            Show progress bars on stderr.

        Returns
        -------
        LinearRAG
            This object (so that calls chain).

        Examples
        --------
        >>> rag.add([{"id": "p4", "title": "Uppsala", "text": "Uppsala is a city in Sweden."}]).index.num_passages
        4
        """
        from .indexing.build import add_passages  # deferred: imports spaCy

        passages = read_passages(corpus, first_id=self.index.num_passages, existing_ids=self.index.passage_ids)
        self.replace_index(add_passages(self.index, passages, progress=progress, nlp=self.nlp,
                                     encoder=self.models.passage_encoder(), ids_checked=True))
        return self

    def delete(self, ids) -> "LinearRAG":
        """Remove passages, and the sentences and entities no remaining passage has, in memory; ``save`` writes it.

        The result equals the index built without them (embeddings are kept, not recomputed).

        Parameters
        ----------
        ids : int, str or list
            An id or a list of ids (7 and "7" are the same id). An unknown id raises ``ValueError`` naming it;
            the index is then unchanged.

        Returns
        -------
        LinearRAG
            This object, so that calls chain: ``rag.delete(ids).save(folder)``.

        Examples
        --------
        >>> rag.delete("p4").index.num_passages
        3
        """
        from .indexing.build import delete_passages  # deferred: imports spaCy

        ids = [ids] if isinstance(ids, (int, str)) else list(ids)
        self.replace_index(delete_passages(self.index, ids))
        return self

    def replace_index(self, index: TriGraphIndex) -> None:
        """Serve another index from now on, with this object's retrieval settings and models (what ``add`` and
        ``delete`` do with the index they computed); the caches derived from the old index go.

        Parameters
        ----------
        index : TriGraphIndex
            The index to serve; its stored retrieval settings are replaced by ``rag.config``.

        Examples
        --------
        >>> import os, tempfile
        >>> from linearrag_torch import TriGraphIndex
        >>> rag.replace_index(TriGraphIndex.load(rag.save(os.path.join(tempfile.mkdtemp(), "index"))))
        >>> rag.index.num_passages
        3
        """
        index.retrieval_config = self.config
        self.index = index
        self.models.index_config = index.index_config
        self._graph = None  # caches derived from the index
        self._pipeline = None

    # ------------------------------------------------------------------ models (models.holder.QuestionModels)
    quantize = property(lambda self: self.models.quantize, doc="The question encoder's arithmetic (__init__).")
    encoder_backend = property(lambda self: self.models.encoder_backend, doc="The question encoder's runtime.")
    nlp = property(lambda self: self.models.nlp, doc="The questions' spaCy pipeline, loaded on first use.")
    encoder = property(lambda self: self.models.encoder, doc="The question encoder, loaded on first use.")
    ner_pool = property(lambda self: self.models.ner_pool, doc="The NER worker processes, or None.")

    def start_ner_processes(self, processes: int, caller_part: bool = True):
        """Run the questions' spaCy NER in worker processes that stay up, beside this process (for cores to spare
        while NER runs; a batch of fewer than 16 questions runs here alone; ``close`` stops them; what it buys:
        docs/tuning.md, "Question throughput").

        Parameters
        ----------
        processes : int
            Worker processes, each loading the index's spaCy model; 0 stops those running.
        caller_part : bool, default True
            This process takes a part of each batch too.

        Returns
        -------
        NERPool or None
            The pool, or None for 0 processes.
        """
        return self.models.start_ner_processes(processes, caller_part)

    def share_models_from(self, other: "LinearRAG") -> "LinearRAG":
        """Use another object's loaded models where this index needs the same ones: the question encoder (same
        encoder, max_length, device, quantize and backend), the spaCy pipeline (same spacy_model and dropped
        labels), the NER worker processes (same spacy_model; both then hold them: ``models.detach_ner_pool``).

        Parameters
        ----------
        other : LinearRAG
            The object whose models to take (one it has not loaded is left to load on first use).

        Returns
        -------
        LinearRAG
            This object.

        Examples
        --------
        >>> import os, tempfile
        >>> from linearrag_torch import TriGraphIndex
        >>> folder = rag.save(os.path.join(tempfile.mkdtemp(), "index"))
        >>> LinearRAG(TriGraphIndex.load(folder), device="cpu").share_models_from(rag).encoder is rag.encoder
        True
        """
        self.models.share_from(other.models)
        self._pipeline = None
        return self

    def close(self) -> None:
        """Stop the NER worker processes, if any (the rest needs no closing).

        Examples
        --------
        >>> rag.close()
        """
        self.models.close()

    @property
    def pipeline(self):
        """The question path (pipeline.QuestionPipeline): NER, lexicon, encoder stages."""
        p = self._pipeline
        if (p is None or p.index is not self.index or p.nlp is not self.nlp or p.encoder is not self.encoder
                or p.ner_pool is not self.ner_pool):
            p = self._pipeline = QuestionPipeline(self.index, self.nlp, self.encoder, self.ner_pool)
        return p

    @property
    def graph(self) -> engine.DeviceGraph:
        """The index's tensors on the device (``engine.DeviceGraph``), made on first use."""
        if self._graph is None:
            self._graph = engine.DeviceGraph(self.index, self.device)
        return self._graph

    # ------------------------------------------------------------------ querying
    def encode_queries(self, questions: list[str], config: RetrievalConfig | None = None, *,
                       reuse_index_vectors: bool | None = None, timings: dict | None = None) -> EncodedQueries:
        """The first half of ``search``: the questions' entities and vectors, the input of both backends.

        Entities: spaCy NER as ``config.question_ner`` says, plus the index's entity strings found in the
        question when ``config.lexicon_seeds``; lower-cased. Then the encoder, for the questions and their
        entity strings.

        Parameters
        ----------
        questions : list of str
            The questions (an empty or non-string question raises ``InputError``).
        config : RetrievalConfig, optional
            Default: this index's settings (``rag.config``).
        reuse_index_vectors : bool, optional
            An entity string with the tokens of an index entity takes that entity's stored vector; False
            encodes it again (equal up to ~1e-7). None: ``rag.reuse_index_vectors`` (True unless set).
        timings : dict, optional
            Seconds of the stages "ner", "lexicon" and "encoder" are added to it
            (``linearrag_torch.retrieval.pipeline``).

        Returns
        -------
        EncodedQueries
            Question vectors [B, D], entity vectors [Q, D] and their owners, and the entity strings.

        Examples
        --------
        >>> encoded = rag.encode_queries(["Who directed Blue River?"])
        >>> encoded.batch_size, encoded.entity_text
        (1, ['blue river'])
        """
        cfg = config or self.config
        reuse = self.reuse_index_vectors if reuse_index_vectors is None else reuse_index_vectors
        return self.pipeline.encode_questions(questions, cfg, reuse, timings, self.reranker(cfg) if cfg.rerank else None)

    def reranker(self, config: RetrievalConfig | None = None):
        """The learned reranker that ``config`` names, loaded once on this index's device.

        Parameters
        ----------
        config : RetrievalConfig, optional
            Its ``reranker`` folder (empty: the model shipped with the package) and ``reranker_precision``.
            Default: this index's settings.

        Returns
        -------
        rerank.Reranker
            The cross-encoder. A missing or damaged folder raises ``RerankerLoadError`` naming it.

        Examples
        --------
        >>> reranker = rag.reranker()  # doctest: +SKIP
        >>> rag.search("Who directed Blue River?", rerank=True)  # doctest: +SKIP
        """
        cfg = config or self.config
        return self.graph.reranker(cfg.reranker, cfg.reranker_precision)

    def retrieve(self, queries: EncodedQueries, config: RetrievalConfig | None = None, backend: str = "torch", *,
                 timings: dict | None = None) -> Retrieved:
        """The second half of ``search``: rank passages for encoded questions (the stages of
        ``retrieval/stages.py``), the whole batch in one call.

        Parameters
        ----------
        queries : EncodedQueries
            From ``encode_queries``.
        config : RetrievalConfig, optional
            Default: this index's settings (``rag.config``).
        backend : {"torch", "scipy"}, default "torch"
            The torch engine on this object's device, or the numpy/scipy reference (float64, CPU). With
            ``config.rerank`` the learned reranker runs on this index's device whichever ranked the candidates.
        timings : dict, optional
            Seconds added to ``timings["graph"]``, and with ``config.rerank`` to ``timings["rerank"]``.

        Returns
        -------
        Retrieved
            ``indices`` [B, k] (passage rows, best first; -1 past the last passage) and ``scores`` [B, k], on
            the device. ``hits`` turns them into ``Hit`` lists.

        Examples
        --------
        >>> encoded = rag.encode_queries(["Who directed Blue River?"])
        >>> top = rag.retrieve(encoded, rag.config.replace(top_k=2))
        >>> top.indices.tolist()
        [[0, 1]]
        >>> rag.retrieve(encoded, rag.config.replace(top_k=2), backend="scipy").indices.tolist()
        [[0, 1]]
        """
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
        """Top-k passages for each question, best first; a list is answered in one batched call.

        Parameters
        ----------
        questions : str or list of str
            One question, or a batch.
        top_k : int, optional
            Passages per question (default: ``rag.config.top_k``).
        backend : {"torch", "scipy"}, default "torch"
            As for ``retrieve``.
        timings : dict, optional
            Seconds of each stage are added to it (``retrieval.pipeline.STAGES``).
        **overrides
            Retrieval settings for this call, any ``RetrievalConfig`` field (e.g. ``mode="paper"``,
            ``delta=0.3``); an unknown name raises ``TypeError``.

        Returns
        -------
        list of Hit, or list of list of Hit
            For a string its hits; for a list one list of hits per question. A ``Hit`` is (id, score, title,
            text, row). The first two hits are the pair rerank's choice: a hit's score may be below the next's.

        Examples
        --------
        >>> hits = rag.search("Who directed Blue River?", top_k=2)
        >>> [(hit.id, hit.title) for hit in hits]
        [('p1', 'Blue River'), ('p2', 'Anna Berg')]
        >>> batch = rag.search(["Who directed Blue River?", "Where was Karl Berg born?"], top_k=1, mode="paper")
        >>> [[hit.id for hit in hits] for hits in batch]
        [['p1'], ['p3']]
        """
        single = isinstance(questions, str)
        qs = [questions] if single else list(questions)
        if not qs:
            return []
        cfg = self.config.replace(top_k=top_k, **overrides)
        if backend == "torch":  # the question path as stage 0 of the engine's stage list
            out = engine.retrieve(self.graph, qs, cfg, timings=timings,
                                  encode=lambda q, c, t: self.encode_queries(q, c, timings=t))
        else:
            out = self.retrieve(self.encode_queries(qs, cfg, timings=timings), cfg, backend, timings=timings)
        hits = self.hits(out)
        return hits[0] if single else hits

    def answer(self, questions, llm=None, top_k: int = 5, **overrides):
        """Answers from a chat model given each question's top-k passages (``answers.generation.answer_batch``).

        Parameters
        ----------
        questions : str or list of str
            One question, or a batch (searched in one call).
        llm : answers.generation.LLM, dict or None, optional
            The chat model: an ``LLM``, a dict of its arguments, or None (the ``LINEARRAG_LLM_*`` environment
            variables; docs/answers.md).
        top_k : int, default 5
            Passages given to the model per question.
        **overrides
            Retrieval settings for the search, as for ``search``.

        Returns
        -------
        Answer or list of Answer
            For a string its ``Answer`` (answer, reply, passages, ...); for a list one per question.

        Examples
        --------
        >>> from linearrag_torch.answers.generation import LLM
        >>> llm = LLM(base_url="http://127.0.0.1:8080/v1", model="my-model")  # doctest: +SKIP
        >>> rag.answer("Who directed Blue River?", llm=llm).answer  # doctest: +SKIP
        'Anna Berg'
        """
        out = answer_batch(self, questions, llm, top_k, **overrides)
        return out[0] if isinstance(questions, str) else out

    def hits(self, out: Retrieved) -> list[list[Hit]]:
        """The ``Hit`` lists of a ``retrieve`` result.

        Parameters
        ----------
        out : Retrieved
            From ``retrieve`` on this index.

        Returns
        -------
        list of list of Hit
            One list per question, best first, without the -1 rows.

        Examples
        --------
        >>> top = rag.retrieve(rag.encode_queries(["Who directed Blue River?"]), rag.config.replace(top_k=1))
        >>> rag.hits(top)[0][0].title
        'Blue River'
        """
        idx, scores = out.indices.cpu().tolist(), out.scores.cpu().tolist()
        ix = self.index
        return [
            [Hit(ix.passage_ids[i], float(s), ix.titles[i], ix.texts[i], i) for i, s in zip(row, srow) if i >= 0]
            for row, srow in zip(idx, scores)
        ]

    def explain(self, questions: list[str], top_k: int | None = None, **overrides) -> list[dict]:
        """Hits plus how they were reached (what `linearrag demo` prints).

        Parameters
        ----------
        questions, top_k
            As for ``search``: one question or a batch, and passages per question.
        **overrides
            Retrieval settings for this call, as for ``search``.

        Returns
        -------
        list of dict
            One dict per question: "question"; "dense_fallback" (no entity: dense retrieval);
            "question_entities"; "seeds" [(entity, score)]; "chain_seeds", the later rounds' seeds with their
            scores (chain.py; [] with one round); "pair_ranks", the ranks of the first two hits before the pair
            rerank (pairs.py; None without it); "rerank", with the learned reranker each reranked hit's fused
            score, reranker logit and graph score and rank (else None); "found", per hit the round that found it
            with its rank and score there; "hits" [(Hit, [(entity, tier, activation)])], the first round's
            activated entities found in each hit passage (tier >= 2: reached by semantic bridging); "bridges",
            per hit the chain seeds [(entity, score)] its passage contains: how a later round reached it; "paths",
            per hit its paths from the seeds through sentences and entities, scored (retrieval/explain.Paths).

        Examples
        --------
        >>> ex = rag.explain("Who directed Blue River?", top_k=2)[0]
        >>> [hit.id for hit, entities in ex["hits"]]
        ['p1', 'p2']
        >>> ex["question_entities"]
        ['blue river']
        """
        if isinstance(questions, str):
            questions = [questions]
        cfg = self.config.replace(top_k=top_k, **overrides)
        enc = self.encode_queries(list(questions), cfg)
        out, tr = engine.retrieve(self.graph, enc, cfg, trace=True)
        paths = Paths(self.index, enc.query_emb, cfg.chain_passages)
        return explanations(list(questions), enc, self.hits(out), tr, self.index.entities, paths.passage_entities,
                            lambda row: self.index.passage_ids[row], paths)
