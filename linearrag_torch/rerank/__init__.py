"""The learned reranker: a cross-encoder that rescores the graph's top candidates (``RetrievalConfig.rerank``).

scoring.py (pairs built and scored on the engine's device, the fused score), train.py (`linearrag
train-reranker`; cli/train_reranker.py holds its flags). The network and its folder on disk are models/reranker.py; the
trained model ships in ``linearrag_torch/data/reranker/`` (its MODEL_CARD.md says how it was made). Names load on first use, so
that the command line's parser does not import torch.
"""
__all__ = ["Reranker", "Reranked", "RerankerLoadError", "RerankerSettings", "load_reranker", "packaged_reranker_folder"]


def load_reranker(folder=None, device="cpu", precision: str = "float32"):
    """The learned reranker (``Reranker``: the network of models/reranker.py, scoring pairs) from ``folder`` (None:
    the one shipped with the package) on ``device`` in ``precision`` (scoring.resolve_precision)."""
    from .scoring import Reranker  # deferred: imports torch

    return Reranker.load(folder, device, precision=precision)


def __getattr__(name):  # deferred: the lazy names (see above)
    if name in ("Reranker", "Reranked"):
        from . import scoring

        return getattr(scoring, name)
    if name in ("RerankerLoadError", "RerankerSettings", "packaged_reranker_folder"):
        from ..models import reranker

        return getattr(reranker, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
