"""The Tri-Graph index and its folder on disk, one module per role:

| module | role |
|---|---|
| csr.py | Csr, the compressed sparse rows of M, C, N and PS (built with scipy's linear-time conversions on the CPU) |
| graph.py | TriGraphIndex (strings, embeddings, M, C, N, PS, NER record, token keys) and its validation; save/load |
| layout.py | the format tag and version, the names of the stored tensors and strings |
| storage.py | the atomic write (data files, manifest, fsync, index.json replace) and every check on load |
| upgrade.py | the layouts written by earlier versions, keyed on the format version |
| lock.py | the writer lock (one writer at a time; readers take none) |
| errors.py | IndexFormatError, IndexLockedError |

This package's names below are its public interface (``from linearrag_torch.index import TriGraphIndex``).
"""
from .csr import Csr
from .errors import IndexFormatError, IndexLockedError
from .graph import NerRecord, TokenKeys, TriGraphIndex, embedding_dtype, passage_text
from .layout import FORMAT, FORMAT_VERSION, KEY_PARTS, MATRICES, NER_PARTS
from .lock import LOCK_NAME, index_lock
from .storage import PAUSE_ENV

__all__ = [
    "Csr", "FORMAT", "FORMAT_VERSION", "IndexFormatError", "IndexLockedError", "KEY_PARTS", "LOCK_NAME", "MATRICES", "NER_PARTS",
    "NerRecord", "PAUSE_ENV", "TokenKeys", "TriGraphIndex", "embedding_dtype", "index_lock", "passage_text",
]
