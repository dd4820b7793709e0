"""The Tri-Graph index (docs/METHOD.md, "What linearrag_torch computes"): its data and the checks on it.

TriGraphIndex holds the strings, embeddings and sparse matrices; ``validate`` checks their counts,
shapes and dtypes. ``save``/``load`` go through storage.py (files, manifest, fsync, the checks on
load), upgrade.py (layouts written by earlier versions) and lock.py (one writer at a time);
to_files/from_files are the only places that map fields to stored tensors and strings.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from ..config import EMBEDDING_DTYPES, IndexConfig, RetrievalConfig
from .csr import Csr
from . import storage
from .errors import IndexFormatError
from .layout import EMBEDDINGS, KEY_PARTS, KEY_TENSORS, MATRICES, NER_PARTS, NER_TENSORS, STRINGS
from .lock import index_lock


EMBEDDING_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
assert tuple(EMBEDDING_TORCH_DTYPES) == EMBEDDING_DTYPES


def embedding_dtype(index_config: IndexConfig) -> torch.dtype:
    """The torch dtype the index's vectors are stored in (IndexConfig.embedding_dtype); ValueError naming
    the choices for anything else."""
    name = index_config.embedding_dtype
    if isinstance(name, str) and name in EMBEDDING_TORCH_DTYPES:
        return EMBEDDING_TORCH_DTYPES[name]
    raise ValueError(f"embedding_dtype must be one of {EMBEDDING_DTYPES}, got {name!r}")


def passage_text(title: str, text: str) -> str:
    """The text that is analysed, embedded and searched: title + newline + text when there is a title."""
    return f"{title}\n{text}" if title else text


@dataclass
class NerRecord:
    """What NER found in every passage, as node ids in text order (rows may have unsorted columns).

    entities   [P x E]  row p: the distinct entities of passage p in order of first mention
    sentences  [P x S]  row p: the sentence nodes of p in text order, one entry per occurrence
                        (a sentence repeated in p appears twice; sentences without entities are absent)
    mentions   [O x E]  O = sentences.nnz; row o: the distinct entities NER found in the o-th stored
                        sentence occurrence, in order of first mention
    This is the input of node numbering (build.py): deleting passages renumbers the remaining ones
    from it exactly as a fresh build of them would. Not used by retrieval. Values are all 1.
    """

    entities: Csr
    sentences: Csr
    mentions: Csr

    def check(self, P: int, S: int, E: int) -> None:
        shapes = {"entities": (P, E), "sentences": (P, S), "mentions": (self.sentences.nnz, E)}
        for part in NER_PARTS:
            mat = getattr(self, part)
            if tuple(mat.shape) != shapes[part]:
                raise IndexFormatError(f"NER record {part} has shape {tuple(mat.shape)}, expected {shapes[part]}")
            try:
                mat.check(f"NER record {part}")
            except ValueError as exc:
                raise IndexFormatError(str(exc)) from None

    def to(self, device) -> "NerRecord":
        return NerRecord(*(getattr(self, part).to(device) for part in NER_PARTS))


@dataclass
class TokenKeys:
    """Per node, a 64-bit hash of the token ids the encoder saw (encoding.token_hash): an add finds the
    old texts whose tokens equal a new text's without tokenizing the whole index. int64 [P], [S], [E]."""

    passages: torch.Tensor
    sentences: torch.Tensor
    entities: torch.Tensor

    def check(self, P: int, S: int, E: int) -> None:
        for part, n in (("passages", P), ("sentences", S), ("entities", E)):
            t = getattr(self, part)
            if t.dtype != torch.int64 or t.dim() != 1 or t.numel() != n:
                raise IndexFormatError(f"token keys of {part}: expected {n} int64 values, got {t.dtype} {tuple(t.shape)}")


@dataclass
class TriGraphIndex:
    """Passages, sentences and entities with their embeddings and the sparse matrices between them (the
    "Tri-Graph"; ``LinearRAG.build`` makes it, ``rag.index`` holds it).

    The three embeddings are in index_config.embedding_dtype (float32, float16 or bfloat16: computed in
    float32, stored rounded); the matrices are float32 whatever it is.

    Parameters
    ----------
    passage_ids : list of int or str
        The P passages' corpus ids, in row order.
    titles, texts : list of str
        The passages' titles and texts.
    sentences, entities : list of str
        The S sentences (keyed by their text) and the E entities.
    passage_emb, sentence_emb, entity_emb : torch.Tensor
        [P, D], [S, D], [E, D] L2-normalised embeddings.
    M : Csr
        [S x E]: M[s, e] = 1 if sentence s mentions entity e (NER span inside the sentence).
    C : Csr
        [P x E]: the passage-entity edge weight for PPR, count(e in passage) / sum over the passage's entities
        (case-sensitive substring counts); its structure is the 0/1 contain matrix.
    N : Csr
        [P x E]: the lower-cased substring count of e in passage p, over every passage (eq. 7).
    PS : Csr
        [P x S]: PS[p, s] = 1 if sentence s occurs in passage p.
    index_config : IndexConfig
        How it was built.
    retrieval_config : RetrievalConfig
        The retrieval settings stored with it.
    ner : NerRecord, optional
        The NER record of every passage; None for indexes written before it existed.
    keys : TokenKeys, optional
        Hashes of every text's encoder tokens; None for indexes written before they existed.

    Examples
    --------
    >>> index = rag.index
    >>> index.num_passages, index.passage_ids
    (3, ['p1', 'p2', 'p3'])
    """

    passage_ids: list
    titles: list
    texts: list
    sentences: list
    entities: list
    passage_emb: torch.Tensor
    sentence_emb: torch.Tensor
    entity_emb: torch.Tensor
    M: Csr
    C: Csr
    N: Csr
    PS: Csr
    index_config: IndexConfig = field(default_factory=IndexConfig)
    retrieval_config: RetrievalConfig = field(default_factory=RetrievalConfig)
    ner: Optional[NerRecord] = None
    keys: Optional[TokenKeys] = None

    @property
    def num_passages(self) -> int:
        """P, the number of passages."""
        return len(self.passage_ids)

    @property
    def num_sentences(self) -> int:
        """S, the number of sentences."""
        return len(self.sentences)

    @property
    def num_entities(self) -> int:
        """E, the number of entities."""
        return len(self.entities)

    @property
    def dim(self) -> int:
        """D, the encoder's dimension."""
        return int(self.passage_emb.shape[1])

    def with_embedding_dtype(self, name: str) -> "TriGraphIndex":
        """A copy whose embeddings are stored as ``name`` (IndexConfig.embedding_dtype: "float32",
        "float16" or "bfloat16"): each vector rounded to the nearest value of that type (torch's cast), the
        rest shared. From float32 this equals building with that setting (the build computes float32 and
        casts); from a half type to float32 it does not bring back the bits rounded away.

        Parameters
        ----------
        name : {"float32", "float16", "bfloat16"}
            The embeddings' new type.

        Returns
        -------
        TriGraphIndex
            The copy.
        """
        cfg = dataclasses.replace(self.index_config, embedding_dtype=name)
        dtype = embedding_dtype(cfg)
        return dataclasses.replace(self, index_config=cfg, **{k: getattr(self, k).to(dtype) for k in EMBEDDINGS})

    def passage_text(self, i: int) -> str:
        """The text of a passage that is analysed, embedded and searched (module function passage_text).

        Parameters
        ----------
        i : int
            The passage's row.

        Returns
        -------
        str
            Its title and text as one text.
        """
        return passage_text(self.titles[i], self.texts[i])

    def summary(self) -> dict:
        """The index's sizes.

        Returns
        -------
        dict
            "passages", "sentences", "entities", the nonzeros "nnz_M", "nnz_C", "nnz_N", and "dim".

        Examples
        --------
        >>> rag.index.summary()["passages"]
        3
        """
        return {
            "passages": self.num_passages,
            "sentences": self.num_sentences,
            "entities": self.num_entities,
            "nnz_M": self.M.nnz,
            "nnz_C": self.C.nnz,
            "nnz_N": self.N.nnz,
            "dim": self.dim,
        }

    def validate(self) -> None:
        """Raise IndexFormatError naming the first inconsistency between counts, shapes and dtypes."""
        P, S, E = self.num_passages, self.num_sentences, self.num_entities
        try:
            want = embedding_dtype(self.index_config)
        except ValueError as exc:
            raise IndexFormatError(f"index_config: {exc}") from None
        for name, n in (("titles", len(self.titles)), ("texts", len(self.texts))):
            if n != P:
                raise IndexFormatError(f"{name} has {n} entries but there are {P} passages")
        for name, emb, rows in (
            ("passage_emb", self.passage_emb, P),
            ("sentence_emb", self.sentence_emb, S),
            ("entity_emb", self.entity_emb, E),
        ):
            if emb.dtype != want or emb.dim() != 2:
                raise IndexFormatError(f"{name}: expected a 2-d {self.index_config.embedding_dtype} tensor "
                                       f"(index_config.embedding_dtype), got {emb.dtype} {tuple(emb.shape)}")
            if emb.shape[0] != rows:
                raise IndexFormatError(f"{name} has {emb.shape[0]} rows, expected {rows}")
            if emb.shape[1] != self.passage_emb.shape[1]:
                raise IndexFormatError(f"{name} has dimension {emb.shape[1]}, passages have {self.passage_emb.shape[1]}")
        for name, shape in (("M", (S, E)), ("C", (P, E)), ("N", (P, E)), ("PS", (P, S))):
            mat = getattr(self, name)
            if tuple(mat.shape) != shape:
                raise IndexFormatError(f"matrix {name} has shape {tuple(mat.shape)}, expected {shape}")
            if mat.val.dtype != torch.float32:
                raise IndexFormatError(f"matrix {name}: values must be float32, got {mat.val.dtype}")
            try:
                mat.check(f"matrix {name}")
            except ValueError as exc:
                raise IndexFormatError(str(exc)) from None
        if self.keys is not None:
            self.keys.check(P, S, E)
        if self.ner is not None:
            self.ner.check(P, S, E)
            if self.ner.entities.nnz != self.C.nnz:
                raise IndexFormatError(
                    f"NER record lists {self.ner.entities.nnz} passage entities, matrix C holds {self.C.nnz}"
                )

    # ---------------------------------------------------------------- persistence
    def save(self, path, vectors: dict | None = None) -> Path:
        """Write atomically to a folder (created if needed) while holding its write lock.

        Parameters
        ----------
        path : str or os.PathLike
            The folder. IndexLockedError if another process holds its lock.
        vectors : dict, optional
            Vectors written in place of the index's own ("passage_emb", "sentence_emb", "entity_emb" ->
            storage.RowBlocks of the same shape and dtype, written block by block: a build too large to hold its
            vectors in memory; synthetic.write_index).

        Returns
        -------
        pathlib.Path
            The folder.
        """
        self.validate()
        path = Path(path)
        storage.make_dirs(path)
        with index_lock(path):
            storage.write(path, *self.to_files(vectors))
        return path

    def to_files(self, vectors: dict | None = None):
        """What storage.write stores.

        Parameters
        ----------
        vectors : dict, optional
            As for ``save``.

        Returns
        -------
        tuple
            (tensors: name -> CPU tensor (or storage.RowBlocks), strings: name -> list of str, index.json's fields).
        """
        vectors = vectors or {}
        for name, blocks in vectors.items():
            own = getattr(self, name) if name in EMBEDDINGS else None
            if own is None or tuple(blocks.shape) != tuple(own.shape) or blocks.dtype != own.dtype:
                raise ValueError(f"vectors[{name!r}]: {blocks.dtype} {tuple(blocks.shape)} in place of "
                                 f"{None if own is None else (own.dtype, tuple(own.shape))}")
        tensors = {name: vectors[name] if name in vectors else getattr(self, name).contiguous().cpu()
                   for name in EMBEDDINGS}
        mats = {name: getattr(self, name) for name in MATRICES}
        if self.ner is not None:
            mats.update({f"ner_{part}": getattr(self.ner, part) for part in NER_PARTS})
        for name, mat in mats.items():
            mat = mat.to("cpu")
            tensors[f"{name}.crow"] = mat.crow.contiguous()
            tensors[f"{name}.col"] = mat.col.contiguous()
            tensors[f"{name}.val"] = mat.val.contiguous()
        if self.keys is not None:
            tensors.update({f"keys.{part}": getattr(self.keys, part).contiguous().cpu() for part in KEY_PARTS})
        strings = {name: getattr(self, name) for name in STRINGS}
        fields = {"counts": self.summary(), "index_config": self.index_config.to_dict(),
                  "retrieval_config": self.retrieval_config.to_dict()}
        return tensors, strings, fields

    def tensors(self) -> list:
        """Every tensor the index holds: vectors, matrices, the NER record and the token keys.

        Returns
        -------
        list of torch.Tensor
            The tensors (a matrix as its crow, col and val arrays).

        Examples
        --------
        >>> len(rag.index.tensors()) >= 15
        True
        """
        out = [self.passage_emb, self.sentence_emb, self.entity_emb]
        mats = [getattr(self, name) for name in MATRICES]
        if self.ner is not None:
            mats += [getattr(self.ner, part) for part in NER_PARTS]
        out += [t for m in mats for t in (m.crow, m.col, m.val)]
        if self.keys is not None:
            out += [getattr(self.keys, part) for part in KEY_PARTS]
        return out

    def nbytes_by_part(self) -> dict:
        """Bytes of the index's tensors by part: "passage_vectors", "sentence_vectors", "entity_vectors", "M", "C",
        "N", "PS", "ner" (the NER record) and "keys" (the token keys). Tensors read from an index folder are mapped
        from its file (safetensors): their bytes are on disk and become resident only where read.

        Returns
        -------
        dict
            Part name -> bytes.

        Examples
        --------
        >>> parts = rag.index.nbytes_by_part()
        >>> parts["passage_vectors"] == rag.index.passage_emb.numel() * rag.index.passage_emb.element_size()
        True
        """
        def size(*ts):
            return sum(t.numel() * t.element_size() for t in ts)

        out = {f"{name[:-4]}_vectors": size(getattr(self, name)) for name in EMBEDDINGS}
        out.update({name: size(*(getattr(getattr(self, name), f) for f in ("crow", "col", "val"))) for name in MATRICES})
        out["ner"] = 0 if self.ner is None else size(*(getattr(getattr(self.ner, part), f) for part in NER_PARTS
                                                       for f in ("crow", "col", "val")))
        out["keys"] = 0 if self.keys is None else size(*(getattr(self.keys, part) for part in KEY_PARTS))
        return out

    @staticmethod
    def load(path, device="cpu", verify: bool = True) -> "TriGraphIndex":
        """Load from a folder written by ``save``.

        Takes no lock: if the folder changes while it is read (a writer replaced index.json and
        removed the files it named), the load starts again from the new index.json.

        Parameters
        ----------
        path : str or os.PathLike
            The folder; IndexFormatError names what is wrong with a damaged or incompatible one.
        device : str or torch.device, default "cpu"
            Where the tensors go.
        verify : bool, default True
            Check the files' sizes and sha256.

        Returns
        -------
        TriGraphIndex
            The index.
        """
        return storage.read_retrying(Path(path), lambda p: TriGraphIndex._load_once(p, device, verify))

    @staticmethod
    def _load_once(path: Path, device, verify: bool) -> "TriGraphIndex":
        return TriGraphIndex.from_files(storage.read(path, verify)).to(device)

    @staticmethod
    def from_files(stored: "storage.Stored") -> "TriGraphIndex":
        """The index from what storage.read returned, checked against index.json's counts and validated.

        Parameters
        ----------
        stored : storage.Stored
            What storage.read returned.

        Returns
        -------
        TriGraphIndex
            The index (IndexFormatError if it does not hold together).
        """
        t, s, counts = stored.tensors, stored.strings, stored.counts
        P, S, E = counts.get("passages"), counts.get("sentences"), counts.get("entities")
        shapes = {"M": (S, E), "C": (P, E), "N": (P, E), "PS": (P, S)}
        keys = TokenKeys(*(t[k] for k in KEY_TENSORS)) if KEY_TENSORS[0] in t else None
        try:
            mats = {
                m: Csr(t[f"{m}.crow"], t[f"{m}.col"], t[f"{m}.val"], shapes[m]) for m in MATRICES
            }
            ner = None
            if NER_TENSORS[0] in t:
                occurrences = int(t["ner_sentences.col"].numel())
                ner_shapes = {"entities": (P, E), "sentences": (P, S), "mentions": (occurrences, E)}
                ner = NerRecord(*(
                    Csr(t[f"ner_{part}.crow"], t[f"ner_{part}.col"], t[f"ner_{part}.val"], ner_shapes[part])
                    for part in NER_PARTS
                ))
            index = TriGraphIndex(
                passage_ids=s["passage_ids"],
                titles=s["titles"],
                texts=s["texts"],
                sentences=s["sentences"],
                entities=s["entities"],
                passage_emb=t["passage_emb"],
                sentence_emb=t["sentence_emb"],
                entity_emb=t["entity_emb"],
                index_config=stored.index_config,
                retrieval_config=stored.retrieval_config,
                ner=ner,
                keys=keys,
                **mats,
            )
        except (KeyError, TypeError) as exc:
            raise IndexFormatError(f"{stored.strings_path}: missing field {exc}") from None
        meta_path = stored.meta_path
        for name, n in (("passages", index.num_passages), ("sentences", index.num_sentences), ("entities", index.num_entities)):
            if counts.get(name) != n:
                raise IndexFormatError(f"{meta_path}: records {counts.get(name)} {name}, the data holds {n}")
        index.validate()
        if counts.get("dim") is not None and counts["dim"] != index.dim:
            raise IndexFormatError(f"{meta_path}: encoder dimension {counts['dim']} but embeddings have {index.dim}")
        return index

    def to(self, device) -> "TriGraphIndex":
        """The index with its embeddings and matrices on another device.

        Parameters
        ----------
        device : str or torch.device
            Where they go.

        Returns
        -------
        TriGraphIndex
            A copy (the lists of strings shared).
        """
        moved = {k: getattr(self, k).to(device) for k in EMBEDDINGS + MATRICES}
        return dataclasses.replace(self, **moved)
