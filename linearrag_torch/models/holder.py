"""The models a LinearRAG holds beside its index, and their handling: the spaCy pipeline of the questions' entities,
the NER worker processes, the question encoder (and the passage encoder ``add`` uses), loaded on first use through
``models``' functions and shared between two indexes that need the same ones (``share_models_from``)."""
from __future__ import annotations

from .. import models


class QuestionModels:
    """What ``LinearRAG`` does with its models (a base class: ``LinearRAG.__init__`` sets ``index``, ``device``,
    ``quantize``, ``encoder_backend`` and the models given or None: ``_nlp``, ``_encoder``, ``_ner_pool``; a change
    of model drops the cached question path, ``_pipeline``)."""

    @property
    def nlp(self):
        """The spaCy pipeline of the questions' entities (the index's ``IndexConfig.spacy_model``, loaded on first
        use unless one was given)."""
        if self._nlp is None:
            self._nlp = models.load_nlp(self.index.index_config)
        return self._nlp

    def start_ner_processes(self, processes: int, caller_part: bool = True):
        """Run the questions' spaCy NER in worker processes that stay up, beside this process.

        For machines with cores to spare while NER runs; the entities are those of this process's NER. A batch
        of fewer than 16 questions still runs here alone. ``close`` stops them. What it buys: docs/tuning.md,
        "Question throughput".

        Parameters
        ----------
        processes : int
            Worker processes (``nlp.NERPool``: each loads the index's spaCy model, ``IndexConfig.spacy_model``);
            0 stops those running.
        caller_part : bool, default True
            This process takes a part of each batch too.

        Returns
        -------
        NERPool or None
            The pool, or None for 0 processes.

        Examples
        --------
        >>> pool = rag.start_ner_processes(1)  # doctest: +SKIP
        >>> rag.close()  # doctest: +SKIP
        """
        from .nlp import NERPool  # deferred: imports spaCy (~1.4 s)

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
        """Forget the NER worker processes without stopping them (another index took them over: ``share_models_from``).

        Returns
        -------
        NERPool or None
            The processes this object held, or None.
        """
        pool, self._ner_pool = self._ner_pool, None
        return pool

    def share_models_from(self, other: "LinearRAG") -> "LinearRAG":
        """Use another object's loaded models where this index needs the same ones, instead of loading them again.

        Shared: the question encoder (same encoder and max_length, same device, quantize and encoder backend),
        the spaCy pipeline (same spacy_model and dropped labels) and the NER worker processes (same
        spacy_model: they load the model by name; both objects then hold them, see ``detach_ner_pool``). A
        model ``other`` has not loaded yet is left to load on first use.

        Parameters
        ----------
        other : LinearRAG
            The object whose models to take.

        Returns
        -------
        LinearRAG
            This object.

        Examples
        --------
        >>> import os, tempfile
        >>> from linearrag_torch import TriGraphIndex
        >>> folder = rag.save(os.path.join(tempfile.mkdtemp(), "index"))
        >>> new = LinearRAG(TriGraphIndex.load(folder), device="cpu").share_models_from(rag)
        >>> new.encoder is rag.encoder
        True
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
        """Stop the NER worker processes, if any (the rest needs no closing).

        Examples
        --------
        >>> rag.close()
        """
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
