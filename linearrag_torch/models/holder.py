"""The models a LinearRAG holds beside its index (``LinearRAG.models``), and their handling: the spaCy pipeline of
the questions' entities, the NER worker processes, the question encoder (and the passage encoder ``add`` uses),
loaded on first use through ``models``' functions and shared between two indexes that need the same ones
(``share_from``). An object of its own: LinearRAG keeps one and asks it, nothing here reads LinearRAG's state."""
from __future__ import annotations

from .. import models
from ..config import ENCODER_BACKENDS

QUESTION_ENCODERS = (None, "bfloat16", "int8", "int8-all")  # LinearRAG(quantize=...)


class QuestionModels:
    """The models beside one index: its spaCy pipeline, NER worker processes and question encoder.

    Parameters
    ----------
    index_config : IndexConfig
        The index's settings (``spacy_model``, ``encoder``, ``max_length``, ``encoder_precision``); LinearRAG sets
        it again when it serves another index.
    device : torch.device
        Where the encoder runs.
    quantize : {None, "bfloat16", "int8", "int8-all"}
        The question encoder's arithmetic (LinearRAG's ``quantize``).
    encoder_backend : {"torch", "onnx"}
        The question encoder's runtime.
    nlp, encoder : optional
        Loaded models to use as they are (None: loaded on first use).
    """

    def __init__(self, index_config, device, quantize=None, encoder_backend: str = "torch", nlp=None, encoder=None):
        if quantize not in QUESTION_ENCODERS:
            raise ValueError(f"quantize must be one of {QUESTION_ENCODERS}, got {quantize!r}")
        if quantize in ("int8", "int8-all") and device.type != "cpu":
            raise ValueError(f"quantize={quantize!r} runs on the CPU only, the device is {device}")
        if encoder_backend not in ENCODER_BACKENDS:
            raise ValueError(f"encoder_backend must be one of {ENCODER_BACKENDS}, got {encoder_backend!r}")
        if encoder_backend == "onnx" and (quantize is not None or device.type != "cpu"):
            raise ValueError(f"encoder_backend='onnx' runs float32 on the CPU (device {device}, quantize {quantize!r})")
        self.index_config = index_config
        self.device = device
        self.quantize = quantize
        self.encoder_backend = encoder_backend
        self.nlp = nlp
        self.encoder = encoder
        self._ner_pool = None  # nlp.NERPool (start_ner_processes)

    @property
    def nlp(self):
        """The spaCy pipeline of the questions' entities (the index's ``IndexConfig.spacy_model``, loaded on first
        use unless one was given)."""
        if self._nlp is None:
            self._nlp = models.load_nlp(self.index_config)
        return self._nlp

    @nlp.setter
    def nlp(self, value) -> None:
        self._nlp = value

    @property
    def loaded_nlp(self):
        """The spaCy pipeline if loaded (or given), else None: nothing is loaded."""
        return self._nlp

    @property
    def loaded_encoder(self):
        """The question encoder if loaded (or given), else None: nothing is loaded."""
        return self._encoder

    def start_ner_processes(self, processes: int, caller_part: bool = True):
        """LinearRAG.start_ner_processes: NER worker processes, replacing those running (0: none)."""
        from .nlp import NERPool  # deferred: imports spaCy (~1.4 s)

        self.close()
        if processes > 0:
            self.nlp  # noqa: B018 (a model that cannot load fails here, with its name, not in a worker)
            self._ner_pool = NERPool(self.index_config.spacy_model, processes, caller_part=caller_part)
        return self._ner_pool

    @property
    def ner_pool(self):
        """The NER worker processes (nlp.NERPool) of start_ner_processes, or None."""
        return self._ner_pool

    def detach_ner_pool(self):
        """Forget the NER worker processes without stopping them; returns them (or None)."""
        pool, self._ner_pool = self._ner_pool, None
        return pool

    def share_from(self, other: "QuestionModels") -> "QuestionModels":
        """Take ``other``'s loaded models where this index needs the same ones (LinearRAG.share_models_from says
        which); a model ``other`` has not loaded is left to load on first use. Returns this object."""
        old, new = other.index_config, self.index_config
        same_question_encoder = ((old.encoder, old.max_length) == (new.encoder, new.max_length)
                                 and str(self.device) == str(other.device) and self.quantize == other.quantize
                                 and self.encoder_backend == other.encoder_backend)
        if same_question_encoder and other.loaded_encoder is not None:
            self._encoder = other.loaded_encoder
        if (old.spacy_model, tuple(old.dropped_labels)) == (new.spacy_model, tuple(new.dropped_labels)) \
                and other.loaded_nlp is not None:
            self._nlp = other.loaded_nlp
        if old.spacy_model == new.spacy_model and other.ner_pool is not None:
            self._ner_pool = other.ner_pool
        return self

    def close(self) -> None:
        """Stop the NER worker processes, if any (the rest needs no closing)."""
        pool, self._ner_pool = self._ner_pool, None
        if pool is not None:
            pool.close()

    @property
    def encoder(self):
        """The question encoder (``quantize``), loaded on first use unless one was given."""
        if self._encoder is None:
            self._encoder = models.load_question_encoder(self.index_config, self.device, self.quantize,
                                                         self.encoder_backend)
        return self._encoder

    @encoder.setter
    def encoder(self, value) -> None:
        self._encoder = value

    def passage_encoder(self):
        """What add() encodes new passages with: the question encoder's model in the precision the index was
        encoded in (the vectors a full build would make), loaded apart only where the question encoder is int8."""
        enc, want = self.encoder, self.index_config.encoder_precision
        torch_backend = getattr(enc, "backend", "torch") == "torch"
        if not isinstance(getattr(enc, "precision", None), str) or (
                enc.precision == want and enc.quantize is None and torch_backend):
            return enc  # a stand-in encoder, or the right one already
        if enc.quantize is None and torch_backend:
            return enc.with_precision(want)
        return models.load_encoder(self.index_config, self.device)
